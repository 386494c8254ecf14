"""Running ``python -m anarchon`` as a user would, and reading its answer (tests/cli, and the verbs'
error paths elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness.controlplane import REPO

Cli = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 120, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m anarchon ARGS`` with no KUBECONFIG from the environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator"), **extra_env}
    env.pop("KUBECONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    return res.stdout


def ok_json(res: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(res))


def one_line_error(res: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """The one line of stderr of a command that failed with ``code``, no traceback, holding every fragment."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
