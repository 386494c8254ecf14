"""A replica started with ``--log-format json`` writes one JSON object per line, and the lines of
a run carry its job, slot, attempt and instance as fields; the real API server and SQLite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until

SLOT = 1_800_000_000_000


def test_json_logs_carry_the_run_of_each_line(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0", "--log-format", "json")
    cluster.apply(job_manifest("logged", every="1h", suspend=True))
    cluster.trigger_running("logged", SLOT)
    until("the run to succeed", lambda: cluster.phases("logged")["Succeeded"] == 1, timeout=60)

    def lines() -> list[dict[str, Any]]:
        text = replicas.log("replica-0")
        return [json.loads(line) for line in text.splitlines() if line.strip()]  # each line parses alone

    def about_the_run() -> list[dict[str, Any]]:
        # The job as the store knows it: namespace/name#uid-prefix (a re-created job is another).
        return [line for line in lines() if str(line.get("job", "")).startswith(f"{cluster.namespace}/logged#")]

    ran = until(
        "the log lines of the run",
        lambda: [line for line in about_the_run() if line["message"].startswith("finished")] and about_the_run(),
        timeout=30,
    )
    assert {line["message"].split()[0] for line in ran} >= {"running", "finished"}
    for line in ran:
        assert (line["slot"], line["attempt"], line["instance"]) == (SLOT, 1, "replica-0"), line
        assert {"time", "level", "logger", "message"} <= line.keys(), line
    outside = [line for line in lines() if "job" not in line]
    assert outside, "lines outside a run (start-up) have no run fields"
    assert all(line["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") for line in lines())
