"""CLI tests: each verb run as ``python -m anarchon`` (as a user would) against the real test control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The operator tests' fixtures: a control plane with the CRDs, a namespace, replicas as processes.
from tests.operator.conftest import cluster, crds, replicas_factory  # noqa: F401

REPO = Path(__file__).resolve().parents[2]

Cli = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 120, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator"), **extra_env}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


@pytest.fixture
def cli(control_plane: Any, namespace: str) -> Cli:
    """``cli("list", "-o", "json")``: the verb, in the test's namespace, with the test cluster's kubeconfig."""

    def call(verb: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(
            verb, *args, "--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig), timeout=timeout
        )

    return call


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    return res.stdout


def ok_json(res: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(res))


def one_line_error(res: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
