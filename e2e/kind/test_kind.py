"""The kind end-to-end suite (e2e/kind/run.sh) as a pytest test.

It needs a Docker engine and kind, which CI machines here do not have: it is then SKIPPED with the
reason. Everything that can be checked without them (chart rendering and schemas, server-side
dry-run, RBAC with the real operator, examples) is in tests/chart and runs in CI.

    python -m pytest e2e/kind -v -rs
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _missing() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed; the kind suite needs Docker, kind, kubectl and helm"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer `docker info` within 30s"
    if info.returncode != 0:
        return f"the Docker engine is not reachable (`docker info`: {info.stderr.strip().splitlines()[-1:]})"
    return None


@pytest.mark.slow
def test_kind_end_to_end() -> None:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    res = subprocess.run(["bash", str(HERE / "run.sh")], timeout=1800)
    if res.returncode == 77:
        pytest.skip("e2e/kind/run.sh skipped: a tool is missing (see its output)")
    assert res.returncode == 0, "e2e/kind/run.sh failed (its output above says where)"
