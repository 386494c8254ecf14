"""The README's main command, e2e/demo.sh (build or reuse the control plane, install if needed, run e2e/demo.py):
a control plane, three operator replicas on one SQLite file, an example; runs come from several
replicas, and nothing is left running afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.chart.chartlib import REPO

FAST_JOB = """
# every-10s, faster: enough runs in a short test for several replicas to win some.
apiVersion: anarchon.io/v1alpha1
kind: AnarchonJob
metadata:
  name: every-2s
spec:
  every: 2s
  jitter: 1s
  successfulRunsHistoryLimit: 50
  template:
    metadata:
      annotations:
        anarchon.test/run-seconds: "0.5"
    spec:
      containers:
        - name: hello
          image: busybox:1.36
"""


def test_demo_shows_runs_from_several_replicas_and_cleans_up(tmp_path: Path) -> None:
    job = tmp_path / "every-2s.yaml"
    job.write_text(FAST_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO)])
    env["PYTHON"] = sys.executable
    res = subprocess.run(
        ["bash", str(REPO / "e2e" / "demo.sh"), str(job), "--seconds", "30", "--interval", "2", "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert "check passed" in res.stderr, out[-6000:]
    # The table is kubectl's (or the demo's own), with the INSTANCE column filled by replicas.
    assert "INSTANCE" in res.stdout
    winners = set(re.findall(r"\breplica-[123]\b", res.stdout))
    assert len(winners) >= 2, res.stdout[-4000:]
    # No orphans: every replica process is gone.
    pids = [int(p) for p in re.findall(r"replica-\d: pid (\d+)", res.stderr)]
    assert len(pids) == 3, res.stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(), (
            f"replica pid {pid} still running after the demo exited"
        )
