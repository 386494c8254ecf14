"""CLI tests: each verb run as ``python -m anarchon`` (as a user would) against the real test control plane."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.harness.cli import Cli, run_cli


@pytest.fixture
def cli(control_plane: Any, namespace: str) -> Cli:
    """``cli("list", "-o", "json")``: the verb, in the test's namespace, with the test cluster's kubeconfig."""

    def call(verb: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(
            verb, *args, "--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig), timeout=timeout
        )

    return call
