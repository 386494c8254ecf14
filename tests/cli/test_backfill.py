"""``anarchon backfill JOB --from --to``: every past slot of the range, once each, claimed by the replicas."""

from __future__ import annotations

import time
from itertools import pairwise

from anarchon.kube.job.spec import run_name, slot_time
from anarchon.kube.job.triggers import pending_requests
from tests.harness.cli import Cli, ok, one_line_error
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def test_backfill_runs_each_slot_once(cluster: Cluster, replicas_factory, cli: Cli, tmp_path) -> None:
    replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for name in ("replica-a", "replica-b"):
        replicas.start(name)
    # Suspended: no scheduled run adds to the range's; triggers still run.
    # Ten runs kept: the default three would delete the first of the four once the last ended.
    run_1s = {"anarchon.test/run-seconds": "1"}
    cluster.apply(job_manifest("late", every="10s", suspend=True, annotations=run_1s, successfulRunsHistoryLimit=10))
    last = (time.time_ns() // 1_000_000 - 5_000) // 10_000 * 10_000
    slots = [last - 30_000, last - 20_000, last - 10_000, last]
    span = ("--from", slot_time(slots[0] - 5_000), "--to", slot_time(last))

    res = cli("backfill", "late", *span, timeout=300)
    assert res.returncode == 0, (res.stdout, res.stderr)
    lines = res.stdout.splitlines()
    assert lines[0] == "4 slot(s) in the range: 0 already run, 4 to run"
    assert lines[-1] == "done: 4 Succeeded"
    runs = cluster.runs("late")
    assert [int(r["spec"]["slot"]) for r in runs] == slots
    assert {r["spec"]["trigger"] for r in runs} == {"Manual"}
    assert [r["status"]["phase"] for r in runs] == ["Succeeded"] * 4
    # One after the other (--overlap Wait): each run started after the previous one finished.
    for before, after in pairwise(runs):
        assert after["status"]["startTime"] >= before["status"]["finishTime"]
    assert len(cluster.pods("anarchon.io/job=late")) == 4

    again = ok(cli("backfill", "late", *span, timeout=120))
    assert again.splitlines() == ["4 slot(s) in the range: 4 already run, 0 to run", "done: nothing to run"]
    assert [r["metadata"]["name"] for r in cluster.runs("late")] == [run_name("late", s) for s in slots]

    # A run that left the history (a history limit, a kubectl delete) is triggered again and
    # the store decides: it keeps the newest run's record, so this one is not run again.
    cluster.kubectl("delete", "anarchonrun", run_name("late", last))
    res = cli("backfill", "late", *span, timeout=300)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.stdout.splitlines()[0] == "4 slot(s) in the range: 3 already run, 1 to run"
    assert res.stdout.splitlines()[-2:] == [
        f"slot {slot_time(last)}: the store had decided it before, not run again",
        "done: 1 not run again",
    ]
    assert [int(r["spec"]["slot"]) for r in cluster.runs("late")] == slots[:-1]
    assert pending_requests(cluster.get("anarchonjob", "late")["metadata"]["annotations"]) == {}


def test_overlap_job_leaves_it_to_the_job_policy(cluster: Cluster, replicas_factory, cli: Cli, tmp_path) -> None:
    """--overlap Job: the next slot is triggered once the last is decided; the job's Skip skips it."""
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")
    cluster.apply(job_manifest("slow", every="10s", suspend=True, annotations={"anarchon.test/run-seconds": "30"}))
    last = (time.time_ns() // 1_000_000 - 5_000) // 10_000 * 10_000
    res = cli("backfill", "slow", "--from", slot_time(last - 10_000), "--to", slot_time(last), "--overlap", "Job")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.stdout.splitlines() == [
        "2 slot(s) in the range: 0 already run, 2 to run",
        f"slot {slot_time(last - 10_000)}: decided by the replicas ({run_name('slow', last - 10_000)})",
        f"slot {slot_time(last)}: decided by the replicas ({run_name('slow', last)})",
    ]
    until(
        "the first slot running, the second Skipped",
        lambda: [(r.get("status") or {}).get("phase") for r in cluster.runs("slow")] == ["Running", "Skipped"],
        timeout=60,
    )


def test_backfilled_runs_are_kept_by_when_they_ran(cluster: Cluster, replicas_factory, cli: Cli, tmp_path) -> None:
    """A full history keeps the backfilled runs until newer runs push them out, by run time.

    On main the history limits kept the runs of the newest slots: a backfilled run, of an old
    slot, was deleted as soon as it ended whenever newer runs filled the history.
    """
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")
    cluster.apply(job_manifest("full", every="1h", suspend=True, overlap="Allow", successfulRunsHistoryLimit=2))
    now = time.time_ns() // 1_000_000
    hour = now // 3_600_000 * 3_600_000
    recent = [now - 20_000, now - 19_000, now - 1]
    old = [hour - 7_200_000, hour - 3_600_000]  # two slots of every 1h, before the recent ones

    def kept() -> list[int]:
        runs = cluster.runs("full")
        return sorted(int(r["spec"]["slot"]) for r in runs if (r.get("status") or {}).get("phase") == "Succeeded")

    for slot in recent[:2]:
        ok(cli("trigger", "full", "--at", str(slot)))
    until("the history full of recent runs", lambda: kept() == recent[:2], timeout=60)
    res = cli("backfill", "full", "--from", slot_time(old[0]), "--to", slot_time(old[1]), timeout=120)
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "done: 2 Succeeded", (res.stdout, res.stderr)
    until("the backfilled runs kept, the older recent ones not", lambda: kept() == old, timeout=30)
    ok(cli("trigger", "full", "--at", str(recent[2]), "--wait", timeout=120))
    until("the first backfilled run pushed out", lambda: kept() == [old[1], recent[2]], timeout=30)


def test_backfill_refuses_unbounded_and_future_ranges(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("often", every="1s", suspend=True))
    day = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z")
    line = one_line_error(cli("backfill", "often", *day), 2)
    assert "more than 500 slots of every 1s" in line and "backfill at most 500 at a time" in line
    one_line_error(cli("backfill", "often", "--from", "2026-01-01T00:00:00Z"), 2, "required: --to")
    future = ("--from", "2026-01-01T00:00:00Z", "--to", "9999-01-01T00:00:00Z")
    one_line_error(cli("backfill", "often", *future), 2, "in the future")
    backwards = ("--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z")
    one_line_error(cli("backfill", "often", *backwards), 2, "is before --from")
    assert cluster.runs("often") == []
