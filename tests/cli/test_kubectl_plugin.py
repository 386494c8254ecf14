"""``kubectl anarchon …``: kubectl runs the ``kubectl-anarchon`` console script (pyproject) as a plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from tests.harness.cluster import Cluster, job_manifest
from tests.harness.controlplane import REPO


def test_kubectl_runs_the_cli_as_a_plugin(cluster: Cluster, control_plane: Any, tmp_path: Path) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-anarchon"] == scripts["anarchon"] == "anarchon.cli:main"
    # What pip writes for that console script, on a PATH of its own.
    plugin = tmp_path / "bin" / "kubectl-anarchon"
    plugin.parent.mkdir()
    module, function = scripts["kubectl-anarchon"].split(":")
    plugin.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n")
    plugin.chmod(0o755)
    cluster.apply(job_manifest("plugged", every="1h"))
    env = {**os.environ, "PATH": f"{plugin.parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO / "operator")}
    env["KUBECONFIG"] = str(control_plane.kubeconfig)  # kubectl keeps its global flags; the plugin reads this
    res = subprocess.run(
        ["kubectl", "anarchon", "list", "-n", cluster.namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    header, row = res.stdout.splitlines()
    assert header.split()[0] == "NAME" and row.split()[:3] == ["plugged", "every", "1h"]
