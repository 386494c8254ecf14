"""``anarchon resume JOB``: the schedule runs again, and the suspension's reason is gone."""

from __future__ import annotations

import time

from tests.harness.cli import Cli, ok, ok_json, one_line_error
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def test_resume_runs_the_schedule_again(cluster: Cluster, replicas_factory, cli: Cli, tmp_path) -> None:
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")
    cluster.apply(job_manifest("later", every="2s", suspend=True))
    ok(cli("suspend", "later", "--reason", "waiting for the new image"))
    time.sleep(4)
    assert cluster.runs("later") == []

    assert ok(cli("resume", "later")).strip() == f"anarchonjob {cluster.namespace}/later resumed"
    job = cluster.get("anarchonjob", "later")
    assert job["spec"]["suspend"] is False
    assert "anarchon.io/suspend-reason" not in (job["metadata"].get("annotations") or {})
    (listed,) = ok_json(cli("list", "-o", "json"))
    assert listed["suspended"] is False and listed["suspendReason"] is None and listed["nextScheduleTime"]
    until("a scheduled run", lambda: cluster.phases("later")["Succeeded"] >= 1, timeout=60)


def test_resume_of_a_missing_job(cluster: Cluster, cli: Cli) -> None:
    one_line_error(cli("resume", "ghost"), 1, "anarchon resume: no AnarchonJob 'ghost'", "HTTP 404")
