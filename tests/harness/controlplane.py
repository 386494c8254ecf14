"""The real Kubernetes control plane every test directory shares (see e2e/controlplane/README.md).

``control_plane`` (session scope: one per pytest process, so one per xdist worker) starts etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and KWOK; ``crds`` installs the project's
CRDs on it; ``namespace`` gives each test a fresh namespace; ``kube`` is the operator's own client
on it. Nothing global is set (no KUBECONFIG in os.environ): tests pass ``control_plane.kubeconfig``
explicitly so that they cannot talk to another cluster.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane, ControlPlaneError, MissingBinariesError

from anarchon.kube.api.client import Kube, connect
from tests.harness.report import report
from tests.harness.until import until

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
JOB_CRD = CRD_DIR / "anarchonjobs.anarchon.io.yaml"
RUN_CRD = CRD_DIR / "anarchonruns.anarchon.io.yaml"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A running control plane for the whole session; FAILS (never skips) if the binaries are missing.

    Why fail: a skipped test is a test not run, and CI must not pass without having run them.
    """
    problem = ""
    try:
        # ANARCHON_CP_KEEP=1 keeps the run dir (component logs, etcd data) for a post-mortem.
        cp = ControlPlane(node_count=3, keep_run_dir=os.environ.get("ANARCHON_CP_KEEP") == "1")
        cp.start()
    except MissingBinariesError as e:
        problem = str(e)
    except ControlPlaneError as e:
        problem = f"control plane did not start: {e}"
    if problem:  # outside the except block: no chained traceback around the message
        pytest.fail(problem, pytrace=False)
    versions = ", ".join(f"{k} {val}" for k, val in cp.version_info.items())
    kept = f"; run dir kept: {cp.run_dir}" if cp.keep_run_dir else ""
    report(f"control plane: started in {cp.start_seconds:.1f}s; {versions}{kept}")
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def real_node(control_plane: ControlPlane) -> str:
    """The real node (kubelet + containerd, e2e/controlplane/realnode.py) beside the KWOK ones, with the
    image stand-in base (tests/image) imported as the workload image; returns that image's name.

    Started once, on first use, on the session's control plane; tainted, so only Pods that ask for it
    (``realnode.pod_spec_for_real_node()``) land on it. Without Docker it fails in CI, like tests/image.
    """
    from tests.image.imagelib import engine_or_fail, standin_base, standin_pause

    engine_or_fail()
    base = standin_base()
    if control_plane.real_node is None:
        node = control_plane.add_real_node(pause_image=standin_pause(base), images=[base])
        report(f"real node (kubelet + containerd): Ready {node.start_seconds:.1f}s after start")
    return base


@contextlib.contextmanager
def fresh_namespace(control_plane: ControlPlane, prefix: str = "t") -> Iterator[str]:
    """A new namespace whose `default` ServiceAccount exists (so Pods can be created at once); deleted after."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    control_plane.api(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )

    def default_account() -> bool:
        try:
            control_plane.api("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return True
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
            return False

    until(f"the ServiceAccount default in namespace {name}", default_account, interval=0.05)
    try:
        yield name
    finally:
        # Do not wait for it to go: the namespace controller deletes the contents in the background.
        with contextlib.suppress(urllib.error.URLError, OSError):
            control_plane.api("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace for the test (:func:`fresh_namespace`)."""
    with fresh_namespace(control_plane) as name:
        yield name


async def typed_connect(kubeconfig: str, *, api_concurrency: int | None = None) -> Any:
    """The operator's client (anarchon.kube.api.client.Kube) with kubernetes_asyncio's typed APIs
    beside it (``core``, ``custom``, ``api``) for the tests' own requests: the operator never
    imports that library's models, a test may."""
    from kubernetes_asyncio import client, config

    class TypedKube(Kube):
        api: client.ApiClient
        core: client.CoreV1Api
        custom: client.CustomObjectsApi

        async def close(self) -> None:
            await super().close()
            await self.api.close()

    plain = await connect(kubeconfig, api_concurrency=api_concurrency)
    typed = TypedKube(plain.endpoint)
    typed.api = await config.new_client_from_config(config_file=kubeconfig)
    typed.core, typed.custom = client.CoreV1Api(typed.api), client.CustomObjectsApi(typed.api)
    return typed


@contextlib.asynccontextmanager
async def connected(kubeconfig: Path, *, typed: bool = False) -> AsyncIterator[Any]:
    """The operator's client on ``kubeconfig`` (with :func:`typed_connect`'s typed APIs if ``typed``), closed after."""
    client = await (typed_connect if typed else connect)(str(kubeconfig))
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    """The operator's own asyncio client on the control plane, typed APIs beside it."""
    async with connected(control_plane.kubeconfig, typed=True) as client:
        yield client


def wait_established(cp: ControlPlane, *crds: str, timeout: float = 60.0) -> None:
    """Wait until the CRDs (``anarchonjobs.anarchon.io``...) are Established.

    Polled: one ``kubectl wait`` fails outright on a CRD whose status has no conditions yet (the
    API server writes them shortly after the create; later for a large schema like AnarchonJob's).
    """
    args = [f"crd/{name}" for name in crds]

    def established() -> bool:
        res = cp.kubectl("wait", "--for=condition=Established", "--timeout=10s", *args, check=False)
        return res.returncode == 0

    until(f"{', '.join(crds)} to be Established", established, timeout=timeout)


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with both CRDs applied (server-side, so that a test's own apply of them does
    not conflict) and served; the same object as ``control_plane``."""
    return install_crds(control_plane)


def install_crds(cp: ControlPlane) -> ControlPlane:
    """Apply the project's CRDs on ``cp`` and wait until they are served (a second control plane's too)."""
    for path in (JOB_CRD, RUN_CRD):
        cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=anarchon-tests", "-f", str(path))
    wait_established(cp, "anarchonjobs.anarchon.io", "anarchonruns.anarchon.io")

    # Discovery is refreshed asynchronously after Established.
    def served(resource: str) -> Callable[[], bool]:
        return lambda: cp.kubectl("get", resource, "-A", check=False).returncode == 0

    for resource in ("anarchonjobs", "anarchonruns"):
        until(f"{resource} to be served", served(resource))
    return cp
