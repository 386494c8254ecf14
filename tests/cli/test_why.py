"""``anarchon why`` on the real API server, with replicas: slots that ran, were missed, or were not due."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from typing import Any

from anarchon.engine.schedule import every, slots_between
from anarchon.kube.job.spec import slot_time
from tests.harness.cli import Cli, ok, ok_json, one_line_error
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def _missed(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return list((cluster.get("anarchonjob", name).get("status") or {}).get("missed") or [])


def test_why_tells_ran_missed_suspended_and_not_yet_due(cluster: Cluster, replicas_factory, cli: Cli, tmp_path):
    """Every replica is down for a few slots of a catchUp Latest job: the newest of them is caught up,
    the others are missed. The job's status keeps that window (the Events fade), and ``why`` puts the
    slots that ran (won by whom, how late) beside the missed ones (and why) and those not yet due."""
    cluster.apply(job_manifest("tick", every="2s", catchUp={"policy": "Latest", "window": "1h"}))
    cluster.apply(job_manifest("paused", every="2s", suspend=True))
    cluster.apply(job_manifest("daily", cron="@daily"))  # CronJob's shorthand, run by the replicas too
    replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("first")
    until(
        "runs before the downtime",
        lambda: sum(1 for r in cluster.runs("tick") if (r.get("status") or {}).get("phase") == "Succeeded") >= 2,
        timeout=60,
    )
    stopping_at = time.time_ns() // 1_000_000
    replicas.kill("first", signal.SIGTERM)
    time.sleep(9)  # four or five slots with no replica
    replicas.start("second")
    window = until("the missed window on the job", lambda: _missed(cluster, "tick"), timeout=60)[0]
    assert window["reason"] == "NoReplica" and window["count"] >= 2, window
    first, last = (
        int(datetime.fromisoformat(window[k].replace("Z", "+00:00")).timestamp() * 1000) for k in ("from", "to")
    )
    assert stopping_at - 2_000 <= first <= last, "missed from the last slot the stopping replica saw on"
    assert window["count"] == len(list(slots_between(every("2s"), first - 1, last))), (
        "consecutive slots, each counted once"
    )

    records = {r["slot"]: r for r in ok_json(cli("why", "tick", "--last", "30", "-o", "json"))}
    for slot in slots_between(every("2s"), first - 1, last):
        assert records[slot]["verdict"] == "missed" and records[slot]["reason"] == "NoReplica", records[slot]
        assert "no instance ran" in records[slot]["why"]
    ran = [r for r in records.values() if r["verdict"] == "ran"]
    assert any(r["winner"] == "first" for r in ran) and all(r["phase"] == "Succeeded" for r in ran), ran
    assert all(r["launched"] == "<1s" or r["launched"].startswith("+") for r in ran), ran
    caught_up = [r for r in records.values() if r.get("trigger") == "CatchUp"]
    assert len(caught_up) == 1 and caught_up[0]["slot"] > last, caught_up

    header = ok(cli("why", "tick")).splitlines()[1]
    assert header.split() == ["SLOT", "VERDICT", "RUN", "WHY"]
    upcoming = every("2s").next_after(time.time_ns() // 1_000_000 + 60_000)
    (future,) = ok_json(cli("why", "tick", "--slot", slot_time(upcoming), "-o", "json"))
    assert future["verdict"] == "not yet due"
    (asleep,) = ok_json(cli("why", "paused", "--last", "1", "-o", "json"))
    assert asleep["verdict"] == "suspended", asleep
    one_line_error(cli("why", "tick", "--slot", slot_time(upcoming + 1)), 1, "is not a slot of the job")
    midnight = (time.time_ns() // 1_000_000 // 86_400_000 + 1) * 86_400_000
    daily = until(
        "the @daily job scheduled by a replica",
        lambda: (s := cluster.get("anarchonjob", "daily").get("status") or {}).get("nextScheduleTime") and s,
        timeout=30,
    )
    assert daily["nextScheduleTime"] in (slot_time(midnight), slot_time(midnight + 86_400_000)), daily
    assert [c["status"] for c in daily["conditions"] if c["type"] == "Ready"] == ["True"], daily
    (last_midnight,) = ok_json(cli("why", "daily", "--last", "1", "-o", "json"))
    assert last_midnight["verdict"] == "before the job", last_midnight
    one_line_error(cli("why", "nosuch"), 1, "no AnarchonJob 'nosuch'")
