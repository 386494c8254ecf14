"""Fixtures that give tests a real Kubernetes control plane (see e2e/controlplane/README.md).

``control_plane`` (session scope) starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK once per test session; ``namespace`` gives each test a fresh
namespace. Nothing global is set (no KUBECONFIG in os.environ): tests pass
``control_plane.kubeconfig`` explicitly so that they cannot talk to another cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

_CONTROLPLANE_DIR = Path(__file__).resolve().parents[2] / "e2e" / "controlplane"
if str(_CONTROLPLANE_DIR) not in sys.path:
    sys.path.insert(0, str(_CONTROLPLANE_DIR))

from controlplane import ControlPlane, ControlPlaneError, MissingBinariesError  # noqa: E402

_started: list[ControlPlane] = []


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """A running control plane for the whole session; FAILS (never skips) if the binaries are missing.

    Why fail: a skipped test is a test not run, and CI must not pass without having run them.
    """
    try:
        cp = ControlPlane(node_count=3)
        cp.start()
    except MissingBinariesError as e:
        pytest.fail(str(e), pytrace=False)
    except ControlPlaneError as e:
        pytest.fail(f"control plane did not start: {e}", pytrace=False)
    _started.append(cp)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace whose `default` ServiceAccount exists (so Pods can be created at once); deleted after."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    control_plane.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 60
    while control_plane.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            pytest.fail(f"ServiceAccount default was not created in namespace {name} within 60s", pytrace=False)
        time.sleep(0.1)
    try:
        yield name
    finally:
        # Do not wait: namespace deletion (all contents, via the namespace controller) is slow-ish.
        subprocess.run(
            ["kubectl", "--kubeconfig", str(control_plane.kubeconfig), "delete", "namespace", name, "--wait=false"],
            capture_output=True,
            timeout=60,
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Report the control plane's start time and versions, so CI logs show them."""
    for cp in _started:
        v = ", ".join(f"{k} {val}" for k, val in cp.version_info.items())
        terminalreporter.write_line(f"control plane: started in {cp.start_seconds:.1f}s; {v}")
