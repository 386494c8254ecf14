"""``anarchon suspend JOB --reason``: the replicas stop scheduling it, and the reason shows beside the job."""

from __future__ import annotations

import time

from tests.harness.cli import Cli, ok, ok_json, one_line_error
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def test_suspend_stops_the_schedule_and_shows_the_reason(cluster: Cluster, replicas_factory, cli: Cli, tmp_path):
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")
    cluster.apply(job_manifest("busy", every="2s", successfulRunsHistoryLimit=50))
    until("a first run", lambda: cluster.phases("busy")["Succeeded"] >= 1, timeout=60)

    assert ok(cli("suspend", "busy", "--reason", "  database\nmigration ")).strip() == (
        f"anarchonjob {cluster.namespace}/busy suspended: database migration"
    )
    suspended_at = time.time_ns() // 1_000_000
    job = cluster.get("anarchonjob", "busy")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["annotations"]["anarchon.io/suspend-reason"] == "database migration"
    (listed,) = ok_json(cli("list", "-o", "json"))
    assert listed["suspended"] is True and listed["suspendReason"] == "database migration"
    assert listed["nextScheduleTime"] is None
    row = ok(cli("list")).splitlines()[1]
    assert "yes (database migration)" in row
    assert "Suspended:" in (text := ok(cli("get", "busy"))) and "yes (database migration)" in text

    # The replica obeys: after its next look at the job, no slot later than the suspension runs
    # (a slot claimed just before it, within a period and a jitter, may still start).
    until(
        "the Suspended condition",
        lambda: any(
            c["reason"] == "Suspended" for c in (cluster.get("anarchonjob", "busy")["status"].get("conditions") or [])
        ),
        timeout=30,
    )
    time.sleep(6)  # three periods
    late = [r for r in cluster.runs("busy") if int(r["spec"]["slot"]) > suspended_at + 2_000]
    assert not late, [r["metadata"]["name"] for r in late]

    # Without --reason, an old reason goes: it would be about another suspension.
    ok(cli("suspend", "busy"))
    assert "anarchon.io/suspend-reason" not in (cluster.get("anarchonjob", "busy")["metadata"].get("annotations") or {})


def test_suspend_of_a_missing_job(cluster: Cluster, cli: Cli) -> None:
    one_line_error(cli("suspend", "ghost", "--reason", "x"), 1, "anarchon suspend: no AnarchonJob 'ghost'", "HTTP 404")
