"""History end to end: limits on a quiet job, the store's records by age, a deleted job's store data."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from anarchon.engine import Job, Overlap, RunState, Scheduler
from anarchon.engine.backend import ClaimRequest
from anarchon.engine.backends.sqlite import SqliteBackend
from anarchon.kube.api.client import Kube
from anarchon.kube.job.spec import engine_key, parse_job
from anarchon.kube.job.status import JobStatus
from anarchon.kube.report.kube_events import EventPoster
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until


def _store_rows(db: Path, key: str) -> tuple[list[int], int]:
    """The slots the SQLite store holds for the job ``key``, and whether it holds its fingerprint."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        slots = [int(r[0]) for r in conn.execute("SELECT slot FROM anarchon_runs WHERE job=? ORDER BY slot", (key,))]
        fingerprints = conn.execute("SELECT COUNT(*) FROM anarchon_schedules WHERE job=?", (key,)).fetchone()[0]
    return slots, int(fingerprints)


def _key(cluster: Cluster, job: str) -> str:
    body = cluster.get("anarchonjob", job)
    return engine_key(cluster.namespace, job, body["metadata"]["uid"])


def test_a_quiet_job_converges_to_its_history_limits(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    """Two manual runs, then nothing: limits of 1 leave one run (and one Pod) per bucket.

    Before the resync, the run that ended last was never counted (it was still running when
    its own refresh looked), and nothing looked again once the job went quiet: two stayed.
    """
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0", "--resync", "1s")
    cluster.apply(job_manifest("quiet", suspend=True, successfulRunsHistoryLimit=1, failedRunsHistoryLimit=3))
    failing = job_manifest(
        "quietfail", suspend=True, annotations={"anarchon.test/exit-code": "2"}, failedRunsHistoryLimit=1
    )
    cluster.apply(failing)
    for n, slot in enumerate((1_800_000_000_000, 1_800_000_001_000), start=1):
        for job, phase in (("quiet", "Succeeded"), ("quietfail", "Failed")):
            cluster.kubectl("annotate", "--overwrite", "anarchonjob", job, f"anarchon.io/trigger={slot}")
            until(
                f"run {n} of {job} to end {phase}",
                lambda job=job, phase=phase, slot=slot: any(
                    int(r["spec"]["slot"]) == slot and (r.get("status") or {}).get("phase") == phase
                    for r in cluster.runs(job)
                ),
                timeout=60,
            )
    for job, phase in (("quiet", "Succeeded"), ("quietfail", "Failed")):
        until(f"{job}'s history down to 1", lambda job=job: len(cluster.runs(job)) == 1, timeout=30)
        (kept,) = cluster.runs(job)
        assert int(kept["spec"]["slot"]) == 1_800_000_001_000 and kept["status"]["phase"] == phase
        until(
            f"the Pod of {job}'s deleted run to be garbage-collected",
            lambda job=job: len(cluster.pods(f"anarchon.io/job={job}")) == 1,
            timeout=60,
        )
    time.sleep(3)  # and it stays so
    assert len(cluster.runs("quiet")) == 1 and len(cluster.runs("quietfail")) == 1


def test_store_records_are_pruned_by_age_past_an_old_failed_run(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    """An old Failed run kept by failedRunsHistoryLimit no longer pins the store's records.

    Before, records were pruned only below the oldest run the history kept, so that Failed
    run held every later record in the store (one row per slot, for ever).
    """
    db = tmp_path / "s.db"
    replicas: Replicas = replicas_factory(f"sqlite://{db}")
    replicas.start("replica-0", "--resync", "1s")
    limits = {"successfulRunsHistoryLimit": 1, "failedRunsHistoryLimit": 1, "startingDeadline": "2s"}
    cluster.apply(job_manifest("aging", every="1s", annotations={"anarchon.test/exit-code": "1"}, **limits))
    failed = until(
        "a Failed run",
        lambda: [r for r in cluster.runs("aging") if (r.get("status") or {}).get("phase") == "Failed"],
        timeout=60,
    )
    cluster.apply(job_manifest("aging", every="1s", **limits))  # from now on the runs succeed
    key = _key(cluster, "aging")
    until("a Succeeded run", lambda: cluster.phases("aging")["Succeeded"] >= 1, timeout=60)
    time.sleep(40)
    runs = cluster.runs("aging")
    old_failed = [r for r in runs if (r.get("status") or {}).get("phase") == "Failed"]
    assert old_failed, "the history keeps one Failed run"
    slots, _ = _store_rows(db, key)
    # Records live about a claim window past their slot (0.3 s jitter + 2 s deadline + 5 s
    # clock margin here) plus ten resyncs (pruning waits that long between two prunes) and one;
    # 40 s of 1 s slots would leave 40 or more if pinned.
    assert len(slots) <= 24, slots
    assert int(old_failed[0]["spec"]["slot"]) not in slots
    assert int(failed[0]["spec"]["slot"]) not in slots
    assert max(slots) >= max(int(r["spec"]["slot"]) for r in runs) - 2_000


def test_deleting_a_job_deletes_its_store_data(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    """Every replica forgets the deleted job once its runs stopped; a job beside it keeps its data."""
    db = tmp_path / "s.db"
    replicas: Replicas = replicas_factory(f"sqlite://{db}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(job_manifest("doomed", every="1s"))
    cluster.apply(job_manifest("bystander", every="1s"))
    until(
        "runs of both jobs",
        lambda: cluster.phases("doomed")["Succeeded"] >= 2 and cluster.phases("bystander")["Succeeded"] >= 1,
        timeout=60,
    )
    doomed, bystander = _key(cluster, "doomed"), _key(cluster, "bystander")
    assert _store_rows(db, doomed)[0] and _store_rows(db, doomed)[1] == 1
    cluster.kubectl("delete", "anarchonjob", "doomed")
    until("the store to forget the deleted job", lambda: _store_rows(db, doomed) == ([], 0), timeout=60)
    time.sleep(3)  # no replica brings a record of it back
    assert _store_rows(db, doomed) == ([], 0)
    assert _store_rows(db, bystander)[0] and _store_rows(db, bystander)[1] == 1


async def _never(ctx: object) -> None:
    raise AssertionError("nothing runs here")


async def test_a_pending_trigger_requests_slot_keeps_its_store_record(kube: Kube, cluster: Cluster, tmp_path: Path):
    """A replica may claim a trigger request's slot and die before it removes the request: the
    next one must find the slot taken, so pruning by age keeps the slots of pending requests.
    On main a backfilled (old) slot's record went at the next prune, its request pending or not."""
    cluster.apply(job_manifest("pinned", every="1h", suspend=True))
    spec = parse_job(cluster.get("anarchonjob", "pinned"))
    key = engine_key(spec.namespace, spec.name, spec.uid)
    backend = SqliteBackend(tmp_path / "store.db")
    await backend.setup()
    scheduler = Scheduler(backend, instance_id="replica-0")
    scheduler.add(Job(key, spec.schedule, _never, spec.options))
    hour, now = 3_600_000, int(time.time() * 1000)
    for slot in (hour, 2 * hour, 3 * hour):  # of 1970: far older than records are kept; the newest stays
        await backend.claim(ClaimRequest(key, slot, "replica-1", f"t-{slot}", now, 4_000, Overlap.ALLOW))
        await backend.finish(key, slot, f"t-{slot}", now, RunState.SUCCEEDED)
    try:
        status = JobStatus(kube, scheduler, EventPoster(kube), pinned=lambda k: [2 * hour] if k == key else [])
        await status.resync(spec)
        assert [r.slot for r in await backend.history(key)] == [3 * hour, 2 * hour]
    finally:
        await backend.close()
