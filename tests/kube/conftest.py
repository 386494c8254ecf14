"""Fixtures of the tests/kube tests that need the project's CRDs on the test API server."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from controlplane import ControlPlane

from anarchon.kube import constants as C
from tests.k8s.fixtures import wait_established, wait_for
from tests.kube.test_crds import JOB_CRD, RUN_CRD


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """Both CRDs applied (server-side, so a re-apply by another suite does not conflict) and served."""
    for path in (JOB_CRD, RUN_CRD):
        control_plane.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=anarchon-tests", "-f", str(path)
        )
    wait_established(control_plane, f"{C.JOBS}.{C.GROUP}", f"{C.RUNS}.{C.GROUP}")

    # Discovery is refreshed asynchronously after Established.
    def served(resource: str) -> Callable[[], bool]:
        return lambda: control_plane.kubectl("get", resource, "-A", check=False).returncode == 0

    for resource in (C.JOBS, C.RUNS):
        wait_for(f"{resource} to be served", served(resource))
    return control_plane
