"""The cluster as tests see it: :class:`Cluster` (kubectl in the test's namespace), :class:`Replicas`
(operator replicas as OS processes), job manifests, and their fixtures (``cluster``,
``replicas_factory``, ``store``, ``proxy``, ``through_proxy``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from realnode import pod_spec_for_real_node

from anarchon.kube.api.client import Kube
from tests.faults.apiproxy import ApiFaultProxy
from tests.harness.controlplane import REPO, connected
from tests.harness.until import until


class Cluster:
    """kubectl against the test control plane, returning parsed JSON."""

    def __init__(self, cp: Any, ns: str) -> None:
        self.cp = cp
        self.namespace = ns

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.cp.kubeconfig), "-n", self.namespace, *args],
            capture_output=True,
            text=True,
            check=check,
            input=stdin,
            timeout=60,
        )

    def apply(self, manifest: dict[str, Any] | str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-f", "-", stdin=text)

    def get(self, kind: str, name: str | None = None, selector: str | None = None) -> Any:
        args = ["get", kind, "-o", "json"]
        if name:
            args.insert(2, name)
        if selector:
            args += ["-l", selector]
        out = self.kubectl(*args, check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr:
                return None
            raise AssertionError(out.stderr)
        return json.loads(out.stdout)

    def runs(self, job: str) -> list[dict[str, Any]]:
        items = self.get("anarchonruns", selector=f"anarchon.io/job={job}")["items"]
        return sorted(items, key=lambda r: int(r["spec"]["slot"]))

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return list(self.get("pods", selector=selector)["items"])

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        items = self.get("events")["items"]
        return [e for e in items if reason is None or e.get("reason") == reason]

    def phases(self, job: str) -> Counter[str | None]:
        return Counter((r.get("status") or {}).get("phase") for r in self.runs(job))

    def trigger_running(self, job: str, slot_ms: int = 1_800_000_000_000) -> dict[str, Any]:
        """Trigger a manual run (as `anarchon trigger` does) once the job is Ready; return it Running.

        A suspended job takes manual triggers too: tests that only want the triggered run
        suspend the schedule, so no scheduled slot (say, the top of the hour) adds a run.
        """

        def ready() -> bool:
            conds = ((self.get("anarchonjob", job) or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and (c["status"] == "True" or c["reason"] == "Suspended") for c in conds)

        until(f"job {job} to be Ready", ready)
        self.kubectl("annotate", "--overwrite", "anarchonjob", job, f"anarchon.io/trigger={slot_ms}")
        running = until(
            f"a running run of {job}",
            lambda: [r for r in self.runs(job) if (r.get("status") or {}).get("phase") == "Running"],
        )
        return dict(running[0])


class Replicas:
    """Operator replicas as separate processes, each with its own log file."""

    def __init__(self, cp: Any, ns: str, store: str, log_dir: Path) -> None:
        self.cp = cp
        self.namespace = ns
        self.store = store
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: When each replica's current process was started (monotonic s).
        self.started: dict[str, float] = {}

    def start(self, name: str, *options: str) -> subprocess.Popen[bytes]:
        """Start replica ``name``; ``options`` are added to (and, being last, override) its flags."""
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{REPO}", "ANARCHON_LOG_LEVEL": "INFO"}
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "anarchon",
                "operator",
                "--store",
                self.store,
                "--kubeconfig",
                str(self.cp.kubeconfig),
                "-n",
                self.namespace,
                "--instance-id",
                name,
                "--metrics-port",
                "0",
                "--health-port",
                "0",
                *options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.procs[name] = proc
        self.started[name] = time.monotonic()
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        with open(self.log_dir / f"{name}.log", "a") as log:  # the moment, for reading the log after
            log.write(f"{datetime.now():%Y-%m-%d %H:%M:%S,%f} TEST: sending {signal.Signals(sig).name}\n")
        os.kill(proc.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            proc.wait(timeout=30)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
                    proc.wait(timeout=20)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    proc.kill()


@pytest.fixture
def proxy(control_plane: Any) -> Iterator[ApiFaultProxy]:
    """The API fault proxy in front of the test API server (tests/faults/apiproxy.py)."""
    with ApiFaultProxy(control_plane) as p:
        yield p


@pytest.fixture
async def through_proxy(proxy: ApiFaultProxy) -> AsyncIterator[Kube]:
    """The operator's client, talking to the API server through :func:`proxy`."""
    async with connected(proxy.kubeconfig) as client:
        yield client


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of each real lease store in turn, for tests that must hold on all of them."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}"
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def cluster(crds: Any, namespace: str) -> Cluster:
    """kubectl in the test's namespace, the CRDs installed."""
    return Cluster(crds, namespace)


@pytest.fixture
def replicas_factory(
    crds: Any,
    namespace: str,
    tmp_path: Path,
) -> Iterator[Callable[[str], Replicas]]:
    """``replicas_factory(store_url)``: replicas of the test's namespace on that store, stopped after."""
    made: list[Replicas] = []

    def make(store: str) -> Replicas:
        r = Replicas(crds, namespace, store, tmp_path)
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop_all()


def ran_here(run: dict[str, Any]) -> bool:
    """The run ran in the cluster whose object this is: neither a Skipped slot (written wherever a claim
    was told so) nor the light run of a shared job that ran in another cluster (``status.cluster``)."""
    status = run.get("status") or {}
    return status.get("phase") not in (None, "Skipped") and not status.get("cluster")


def job_manifest(
    name: str,
    *,
    every: str | None = "2s",
    cron: str | None = None,
    tz: str | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "jitter": "300ms",
        "heartbeat": "1s",
        "lease": "4s",
        "template": {
            "metadata": {"annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["true"]}]},
        },
    }
    if cron:
        body["cron"] = cron
        if tz:
            body["timeZone"] = tz
    else:
        body["every"] = every
    body.update(spec)
    return {"apiVersion": "anarchon.io/v1alpha1", "kind": "AnarchonJob", "metadata": {"name": name}, "spec": body}


def real_job(name: str, image: str, script: str) -> dict[str, Any]:
    """A suspended job (runs only when triggered) whose container runs ``script`` on the real node."""
    manifest = job_manifest(name, every="1h", suspend=True)
    spec = manifest["spec"]["template"]["spec"]
    spec.update(pod_spec_for_real_node())
    spec["containers"] = [{"name": "main", "image": image, "command": ["sh", "-c", script]}]
    return manifest
