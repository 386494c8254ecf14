"""Mending: an AnarchonRun the store ended while nobody was left to say so is closed by a status refresh.

The store is real (SQLite), the API server is real, the Pods are KWOK's. The replica that
ended the run in the store (a Replace claim, a give-up) is the one that "died" here: it
never wrote the object. Before kube/mend.py, nothing else ever did: the object said Running
for ever and, for Replace, the old Pod ran on beside its successor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import Job, Scheduler
from anarchon.engine.backend import ClaimRequest, TakeoverRequest
from anarchon.engine.backends.sqlite import SqliteBackend
from anarchon.engine.model import ClaimOutcome, Overlap, Run, RunState
from anarchon.kube import client as kube_client
from anarchon.kube.client import ApiException, Kube, connect
from anarchon.kube.events import EventPoster
from anarchon.kube.mend import mend_runs
from anarchon.kube.pods import pods_of_run
from anarchon.kube.run import record as runs
from anarchon.kube.run.runner import PodRunner
from anarchon.kube.spec import JobSpec, engine_key, parse_job, run_name
from anarchon.kube.status import JobStatus
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.runs import attempt
from tests.harness.until import until, until_async

LEASE_MS = 3_000
OLD_SLOT, NEW_SLOT = 3_600_000, 7_200_000  # slots of 1970: far older than any record is kept


@pytest.fixture
def spec(cluster: Cluster) -> Iterator[JobSpec]:
    cluster.apply(
        job_manifest(
            "mended",
            every="1h",
            suspend=True,
            heartbeat="1s",
            lease="3s",
            annotations={"anarchon.test/run-seconds": "-1"},  # runs until deleted
        )
    )
    yield parse_job(cluster.get("anarchonjob", "mended"))


@pytest.fixture
async def scheduler(tmp_path: Path, spec: JobSpec) -> AsyncIterator[Scheduler]:
    """A replica's scheduler with the job added but not started: only its store and its view count."""
    backend = SqliteBackend(tmp_path / "store.db")
    await backend.setup()
    scheduler = Scheduler(backend, instance_id="mender")
    scheduler.add(Job(engine_key(spec.namespace, spec.name, spec.uid), spec.schedule, _never, spec.options))
    yield scheduler
    await backend.close()


async def _never(ctx: object) -> None:
    raise AssertionError("nothing runs here")


async def _open_run_with_a_live_pod(kube: Kube, spec: JobSpec, slot: int) -> str:
    """Attempt 1 launches its Pod and writes Running, then its replica dies: the Pod runs on."""
    ctx = attempt(1, *([True] * 5))
    ctx.slot = slot
    task = asyncio.create_task(PodRunner(kube, EventPoster(kube), lambda: spec)(ctx))
    name = run_name(spec.name, slot)
    await until_async("attempt 1's Pod", lambda: pods_of_run(kube, spec.namespace, name), interval=0.1)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    return name


async def _replace_in_store(scheduler: Scheduler, spec: JobSpec, at_ms: int) -> list[int]:
    """The run of OLD_SLOT claimed, then replaced by NEW_SLOT's claim, both at ``at_ms``: the slots replaced."""
    key = engine_key(spec.namespace, spec.name, spec.uid)
    backend = scheduler.backend
    assert isinstance(backend, SqliteBackend)
    await backend.claim(ClaimRequest(key, OLD_SLOT, "r-1", "t-old", at_ms - 1, LEASE_MS, Overlap.REPLACE))
    won = await backend.claim(ClaimRequest(key, NEW_SLOT, "r-2", "t-new", at_ms, LEASE_MS, Overlap.REPLACE))
    return [r.slot for r in won.replaced]


async def _skip_whose_replica_died(scheduler: Scheduler, spec: JobSpec) -> None:
    """OLD_SLOT's run holds the job (overlap Skip), NEW_SLOT is recorded Skipped, long enough ago for
    mending, and the replica that recorded it died before writing its object."""
    key = engine_key(spec.namespace, spec.name, spec.uid)
    backend = scheduler.backend
    assert isinstance(backend, SqliteBackend)
    past = int(time.time() * 1000) - 10 * LEASE_MS
    await backend.claim(ClaimRequest(key, OLD_SLOT, "r-1", "t-old", past, LEASE_MS, Overlap.SKIP))
    skipped = await backend.claim(ClaimRequest(key, NEW_SLOT, "r-2", "t-new", past + 1, LEASE_MS, Overlap.SKIP))
    assert not skipped.won


async def _ended_object(kube: Kube, spec: JobSpec, slot: int, outcome: str, message: str) -> None:
    """The run of ``slot`` has its object, which says the run ended ``outcome``."""
    await runs.ensure_run(kube, spec, slot, "Schedule")
    await runs.update_status(
        kube,
        spec.namespace,
        run_name(spec.name, slot),
        1,
        lambda s: runs.end_attempt(s, attempt=1, outcome=outcome, message=message, final=True),
    )


async def _live_pods(kube: Kube, spec: JobSpec, name: str) -> list[str]:
    pods = await pods_of_run(kube, spec.namespace, name)
    return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]


async def test_a_replaced_run_whose_replacer_died_is_closed_and_its_pod_deleted(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    name = await _open_run_with_a_live_pod(kube, spec, OLD_SLOT)
    assert await _live_pods(kube, spec, name), "the old run's Pod must be running"
    past = int(time.time() * 1000) - 10 * LEASE_MS  # long enough ago that nobody is still writing
    assert await _replace_in_store(scheduler, spec, past) == [OLD_SLOT]  # ... and its winner died before cleaning up

    status = JobStatus(kube, scheduler, EventPoster(kube))
    await asyncio.wait_for(status.refresh(spec), 60)

    run = cluster.get("anarchonrun", name)["status"]
    assert run["phase"] == "Interrupted" and run.get("finishTime"), run
    assert "replaced by the run of slot" in run["message"], run
    assert await _live_pods(kube, spec, name) == [], "the replaced run's Pod must not run beside its successor"


async def test_a_run_given_up_by_a_backup_that_died_is_closed(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    key = engine_key(spec.namespace, spec.name, spec.uid)
    slot = OLD_SLOT
    name = await _open_run_with_a_live_pod(kube, spec, slot)
    backend = scheduler.backend
    assert isinstance(backend, SqliteBackend)
    past = int(time.time() * 1000) - 10 * LEASE_MS
    await backend.claim(ClaimRequest(key, slot, "dead-1", "t-1", past, LEASE_MS, Overlap.ALLOW))
    given_up = await backend.takeover(TakeoverRequest(key, slot, "dead-2", "t-2", past + LEASE_MS, LEASE_MS, 1))
    assert not given_up.won  # the store ended the run; the backup died before writing the object

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)

    run = cluster.get("anarchonrun", name)["status"]
    assert run["phase"] == "Interrupted" and run.get("finishTime"), run
    assert await _live_pods(kube, spec, name) == [], "no run says Interrupted while its Pod runs on"


async def test_a_run_the_store_gave_up_at_a_takeover_has_its_live_pod_stopped_first(
    kube: Kube, spec: JobSpec, cluster: Cluster
) -> None:
    """The store gives a resumable run up only after MAX_TAKEOVERS takeovers (runners failing in
    a loop), whatever its Pod does: the backup that found no attempt left deletes the live Pod
    before it writes the run Interrupted. Before, the Pod was left to run on."""
    from anarchon.kube.listener import OperatorListener
    from anarchon.kube.metrics import Metrics

    name = await _open_run_with_a_live_pod(kube, spec, OLD_SLOT)
    listener = OperatorListener(Metrics(lambda: 0), kube, EventPoster(kube), instance_id="me")
    listener.bind(lambda job: spec, _no_refresh, _no_missed)
    now = int(time.time() * 1000)
    key = engine_key(spec.namespace, spec.name, spec.uid)
    message = "gave up after attempt 1000 of 1000: lease expired"
    listener.run_interrupted_final(Run(key, OLD_SLOT, RunState.INTERRUPTED, 1000, "me", "t", now, now, now, message))

    def ended() -> dict[str, Any] | None:
        status = cluster.get("anarchonrun", name).get("status") or {}
        return status if status.get("finishTime") else None

    run = await until_async("the run ended", ended, timeout=30)
    assert (run["phase"], run["message"]) == ("Interrupted", message), run
    assert await _live_pods(kube, spec, name) == [], "no run says Interrupted while its Pod runs on"


async def test_a_run_the_store_ended_just_now_is_left_to_whoever_ended_it(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    """Within a lease of the store's change its author may still be writing: no second writer then."""
    name = await _open_run_with_a_live_pod(kube, spec, OLD_SLOT)
    await _replace_in_store(scheduler, spec, int(time.time() * 1000))

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)

    assert cluster.get("anarchonrun", name)["status"]["phase"] == "Running"
    assert await _live_pods(kube, spec, name)


async def test_a_run_younger_than_a_lease_is_left_open_without_a_store_read(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every refresh and resync asked the store about each open run, ~2 reads a run at 1,000 jobs
    a minute: mostly of runs claimed seconds before, which the check then leaves alone (a run is
    claimed at its slot at the earliest, so its store record is younger than its slot)."""
    backend = scheduler.backend
    reads: list[int] = []
    real = backend.get_run

    async def counted(job: str, slot: int) -> Any:
        reads.append(slot)
        return await real(job, slot)

    monkeypatch.setattr(backend, "get_run", counted)
    lease_ms = scheduler.jobs[engine_key(spec.namespace, spec.name, spec.uid)].options.lease_ms
    now = scheduler.clock.now_ms()
    young, old = now - lease_ms // 2, now - 2 * lease_ms
    items = [await runs.ensure_run(kube, spec, slot, "Schedule") for slot in (young, old)]
    assert await asyncio.wait_for(mend_runs(kube, scheduler, spec, items), 60) == []
    assert reads == [old], "only the run older than a lease is asked about"


async def test_the_periodic_resync_closes_it_too(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    """A quiet job gets no refresh from a run of its own: the resync is what finds its open runs."""
    name = await _open_run_with_a_live_pod(kube, spec, OLD_SLOT)
    await _replace_in_store(scheduler, spec, int(time.time() * 1000) - 10 * LEASE_MS)

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).resync(spec), 60)

    assert cluster.get("anarchonrun", name)["status"]["phase"] == "Interrupted"
    assert await _live_pods(kube, spec, name) == []


async def test_the_store_keeps_the_record_of_a_run_whose_object_is_open(
    kube: Kube, spec: JobSpec, scheduler: Scheduler
) -> None:
    """Pruning by age must not take the store's verdict from a run still waiting to be closed."""
    await _open_run_with_a_live_pod(kube, spec, OLD_SLOT)
    await _replace_in_store(scheduler, spec, int(time.time() * 1000))

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).resync(spec), 60)  # within the grace

    backend = scheduler.backend
    assert isinstance(backend, SqliteBackend)
    key = engine_key(spec.namespace, spec.name, spec.uid)
    assert await backend.get_run(key, OLD_SLOT) is not None, "pruned: the open run could never be closed"


async def test_a_run_object_left_without_a_status_is_closed_with_the_stores_verdict(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    """The replica that created the object (a Skipped slot, here) died before its first status write.

    The 20,000-slot soak left such objects with no phase at all; nothing ever closed them.
    """
    await _skip_whose_replica_died(scheduler, spec)
    await runs.ensure_run(kube, spec, NEW_SLOT, "Schedule")  # ... and its replica died right there

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).resync(spec), 60)

    status = cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT)).get("status") or {}
    assert status.get("phase") == "Skipped" and status.get("finishTime"), status


EARLY_SLOT = 1_800_000  # a run of the job older than the ones below: its object is there


async def test_a_run_replaced_before_its_object_was_written_gets_one(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    """Every attempt of the old run broke off before its create, then the newer run replaced it.

    Before, the slot had no object at all (the chaos soak counted it lost): the replacer's
    cleanup and mending only ever wrote objects that existed.
    """
    await runs.ensure_run(kube, spec, EARLY_SLOT, "Schedule")
    assert await _replace_in_store(scheduler, spec, int(time.time() * 1000) - 10 * LEASE_MS) == [OLD_SLOT]
    await runs.ensure_run(kube, spec, NEW_SLOT, "Schedule")  # the replacer's own run

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)

    run = cluster.get("anarchonrun", run_name(spec.name, OLD_SLOT))
    assert run is not None, "the replaced slot must have a run object"
    assert run["spec"]["trigger"] == "Schedule", run["spec"]  # 01:00 of 1970 is a slot of `every 1h`
    assert run["status"]["phase"] == "Interrupted" and run["status"].get("finishTime"), run["status"]
    assert "replaced by the run of slot" in run["status"]["message"], run["status"]


async def test_a_skip_whose_replica_died_before_writing_its_object_gets_one(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    await _skip_whose_replica_died(scheduler, spec)
    await runs.ensure_run(kube, spec, OLD_SLOT, "Schedule")

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)

    run = cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT))
    assert run is not None, "the skipped slot must have a run object"
    assert run["status"]["phase"] == "Skipped" and run["status"].get("finishTime"), run["status"]


async def test_a_run_the_history_limits_deleted_is_not_written_again(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    """failedRunsHistoryLimit 1: a newer Interrupted run is kept, so the older one's object was
    deleted by the limits (or would be at once): its store record must not bring it back."""
    key = engine_key(spec.namespace, spec.name, spec.uid)
    backend = scheduler.backend
    assert isinstance(backend, SqliteBackend)
    past = int(time.time() * 1000) - 10 * LEASE_MS
    await backend.claim(ClaimRequest(key, OLD_SLOT, "r-1", "t-1", past, LEASE_MS, Overlap.ALLOW))
    given_up = await backend.takeover(TakeoverRequest(key, OLD_SLOT, "r-2", "t-2", past + LEASE_MS, LEASE_MS, 1))
    assert not given_up.won and given_up.run is not None and given_up.run.state.value == "Interrupted"
    await runs.ensure_run(kube, spec, EARLY_SLOT, "Schedule")
    await _ended_object(kube, spec, NEW_SLOT, "Interrupted", "gave up")

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)

    assert cluster.get("anarchonrun", run_name(spec.name, OLD_SLOT)) is None
    assert cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT)) is not None


async def test_a_run_deleted_by_hand_before_the_replica_started_is_not_written_again(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, cluster: Cluster
) -> None:
    """A Succeeded run's object deleted by hand (`kubectl delete anarchonrun`), then a replica
    (re)started: its run cache never saw the deletion, and the store still has the record. The
    run's runner created the object before its Pod, so a missing object was deleted: left gone."""
    key = engine_key(spec.namespace, spec.name, spec.uid)
    backend = scheduler.backend
    past = int(time.time() * 1000) - 10 * LEASE_MS
    for slot in (OLD_SLOT, NEW_SLOT):
        await backend.claim(ClaimRequest(key, slot, "r-1", f"t-{slot}", past, LEASE_MS, Overlap.ALLOW))
        assert await backend.finish(key, slot, f"t-{slot}", past + 1, RunState.SUCCEEDED)
        await _ended_object(kube, spec, slot, "Succeeded", "ok")
    cluster.kubectl("delete", "anarchonrun", run_name(spec.name, NEW_SLOT))

    await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)

    assert cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT)) is None, "deleted by hand: must stay gone"
    assert cluster.get("anarchonrun", run_name(spec.name, OLD_SLOT)) is not None


async def test_a_lost_skip_of_a_job_on_every_1s_is_found_behind_newer_records(
    kube: Kube, cluster: Cluster, tmp_path: Path
) -> None:
    """The 20,000-slot soak: a replica recorded a Skip of `every 1s` and was killed; by the time the
    record was a lease old, 11 newer records stood in front of it, and the look at the newest
    ten never saw it. The look now covers the slots of the last two minutes and a lease."""
    cluster.apply(job_manifest("fast", every="1s", suspend=True, heartbeat="1s", lease="3s"))
    spec = parse_job(cluster.get("anarchonjob", "fast"))
    backend = SqliteBackend(tmp_path / "fast.db")
    await backend.setup()
    try:
        scheduler = Scheduler(backend, instance_id="mender")
        key = engine_key(spec.namespace, spec.name, spec.uid)
        scheduler.add(Job(key, spec.schedule, _never, spec.options))
        base = (int(time.time()) - 40) * 1000  # 40 one-second slots ago: all well over a lease old
        await backend.claim(ClaimRequest(key, base - 1000, "r-1", "t-held", base - 1000, LEASE_MS, Overlap.SKIP))
        lost = await backend.claim(ClaimRequest(key, base, "r-2", "t-lost", base, LEASE_MS, Overlap.SKIP))
        assert lost.outcome is ClaimOutcome.SKIPPED  # ... and r-2 was killed before writing the object
        await backend.finish(key, base - 1000, "t-held", base + 500, RunState.SUCCEEDED)
        for i in range(1, 16):  # the newer runs, each with its object
            slot = base + 1000 * i
            await backend.claim(ClaimRequest(key, slot, "r-3", f"t-{i}", slot, LEASE_MS, Overlap.SKIP))
            await backend.finish(key, slot, f"t-{i}", slot + 500, RunState.SUCCEEDED)
            await _ended_object(kube, spec, slot, "Succeeded", "ok")
        await runs.ensure_run(kube, spec, base - 1000, "Schedule")

        await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).resync(spec), 60)

        run = cluster.get("anarchonrun", run_name(spec.name, base))
        assert run is not None, "the lost Skip must get its run object"
        assert run["status"]["phase"] == "Skipped", run["status"]
    finally:
        await backend.close()


#: Mending's own writes failing for longer than their retries: the refresh fails, and leaves
#: the next one to write the run (the object is missing, or open: either is mended).
MEND_FAULTS = {
    "the create fails": Fault("status", code=500, verb="create", resource="anarchonruns", subresource=""),
    "its status write fails": Fault("status", code=500, verb="update", resource="anarchonruns", subresource="status"),
}


@pytest.mark.parametrize("what", list(MEND_FAULTS))
async def test_a_missing_run_whose_mending_failed_is_written_by_the_next_refresh(
    spec: JobSpec,
    scheduler: Scheduler,
    cluster: Cluster,
    control_plane: Any,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
) -> None:
    monkeypatch.setattr(kube_client, "RETRY_FOR_MS", 2_000)  # the API server "down" for longer than that
    await _skip_whose_replica_died(scheduler, spec)
    with ApiFaultProxy(control_plane) as proxy:
        kube = await connect(str(proxy.kubeconfig))
        try:
            await runs.ensure_run(kube, spec, OLD_SLOT, "Schedule")
            fault = proxy.add(dataclasses.replace(MEND_FAULTS[what]))
            with pytest.raises(ApiException):
                await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)
            assert fault.fired, f"the fault ({what}) must have hit"
            run = cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT))
            assert run is None or not run.get("status"), "nothing was written while the faults lasted"
            proxy.clear()
            await asyncio.wait_for(JobStatus(kube, scheduler, EventPoster(kube)).refresh(spec), 60)
        finally:
            await kube.close()
    run = cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT))
    assert run is not None, "the skipped slot must have a run object"
    assert run["status"]["phase"] == "Skipped" and run["status"].get("finishTime"), run["status"]


async def test_the_store_looks_of_a_pass_are_made_once_per_period_not_at_every_pass(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look for runs without an object and the pruning each cost a store query per job: at
    every pass (each run's start and end, each resync) on every replica they were 200 store
    queries a second at 1,000 idle jobs. Now at most once per period; a failed look is made again."""
    backend = scheduler.backend
    calls: Counter[str] = Counter()
    for op in ("history", "prune"):
        real = getattr(backend, op)

        async def counted(*args: Any, _op: str = op, _real: Any = real, **kwargs: Any) -> Any:
            calls[_op] += 1
            return await _real(*args, **kwargs)

        monkeypatch.setattr(backend, op, counted)
    await runs.ensure_run(kube, spec, EARLY_SLOT, "Schedule")
    status = JobStatus(kube, scheduler, EventPoster(kube), resync_s=30)
    for _ in range(3):
        await asyncio.wait_for(status.resync(spec), 60)
        await asyncio.wait_for(status.refresh(spec), 60)
    assert calls == {"history": 1, "prune": 1}, calls
    status.forget(engine_key(spec.namespace, spec.name, spec.uid))  # the job is gone, and back
    await asyncio.wait_for(status.resync(spec), 60)
    assert calls == {"history": 2, "prune": 2}, calls


async def test_a_job_without_runs_is_pruned_once_not_every_period(
    kube: Kube, spec: JobSpec, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning cost a store query per job every 10 resyncs: at 10,000 idle jobs 21 store queries
    a second per replica measured (target <= 10), for jobs that never ran. A job with no run
    object is pruned once; once it has a run, at every period again."""
    calls: list[int] = []
    real = scheduler.backend.prune

    async def counted(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return int(await real(*args, **kwargs))

    monkeypatch.setattr(scheduler.backend, "prune", counted)
    status = JobStatus(kube, scheduler, EventPoster(kube), resync_s=30)
    status.prune_every_ms = 0  # every pass is a period
    for _ in range(4):
        await asyncio.wait_for(status.resync(spec), 60)
    assert len(calls) == 1, calls
    await runs.ensure_run(kube, spec, EARLY_SLOT, "Schedule")
    # Without a run cache a pass lists the job's runs: the next one sees this run.
    for _ in range(2):
        await asyncio.wait_for(status.resync(spec), 60)
    assert len(calls) == 3, calls


@contextlib.asynccontextmanager
async def _replica_listener(
    proxy: ApiFaultProxy, spec: JobSpec, *, api_concurrency: int | None = None
) -> AsyncIterator[tuple[Kube, Any, Any]]:
    """A replica's listener ("me") talking through ``proxy``, its run cache listed: (kube, listener, cache)."""
    from anarchon.kube.listener import OperatorListener
    from anarchon.kube.metrics import Metrics
    from anarchon.kube.run.cache import RunCache

    kube = await connect(str(proxy.kubeconfig), api_concurrency=api_concurrency)
    cache = RunCache(kube, [spec.namespace])
    cache.start()
    try:
        await until_async("the run cache listed", lambda: cache.healthy)
        listener = OperatorListener(Metrics(lambda: 0), kube, EventPoster(kube), instance_id="me", run_cache=cache)
        listener.bind(lambda job: spec, _no_refresh, _no_missed)
        yield kube, listener, cache
    finally:
        await cache.stop()
        await kube.close()


@pytest.mark.parametrize("reporter_s", [5, 11])
async def test_a_skip_is_looked_for_only_once_the_requests_queued_before_it_went_out(
    spec: JobSpec, cluster: Cluster, control_plane: Any, monkeypatch: pytest.MonkeyPatch, reporter_s: int
) -> None:
    """Under overload the reporter's create waits its turn behind its other requests, and so do
    ours: looking for its run after a fixed 3 s made the other replicas write it too (a create,
    a 409 and a read each, per skip: at 3,000 jobs more than half the requests of a minute).
    Here this replica's one turn is held 8 s; the reporter writes the run at 5 s, or at 11 s
    (its queue longer than ours: at 3,000 jobs, 46 s against 30); nothing of ours may create it.
    At 11 s the replica created it once its own queue had passed (at 8 s)."""
    from weakref import WeakKeyDictionary

    from anarchon.engine import Run

    monkeypatch.setattr(kube_client, "_turns", WeakKeyDictionary())  # this loop's turns: one
    with ApiFaultProxy(control_plane) as proxy:
        async with _replica_listener(proxy, spec, api_concurrency=1) as (kube, listener, _):
            held = proxy.add(Fault("latency", seconds=8, verb="list", resource="configmaps", times=1))
            ours = proxy.add(Fault("latency", seconds=0, verb="create", resource="anarchonruns"))
            holding = asyncio.ensure_future(
                kube_client.call(
                    "the held request", lambda: kube.request("GET", kube_client.path("configmaps", spec.namespace))
                )
            )
            await until_async("our one turn held", lambda: held.fired)
            key = engine_key(spec.namespace, spec.name, spec.uid)
            run = Run(key, NEW_SLOT, RunState.SKIPPED, 0, "reporter", "", 0, 0, 0, error="overlap")
            listener.skipped_elsewhere(key, NEW_SLOT, run)
            await asyncio.sleep(reporter_s)  # the reporter's create went through now
            await asyncio.to_thread(cluster.apply, runs.run_body(spec, spec.uid, NEW_SLOT, "Schedule"))
            await asyncio.wait_for(holding, 30)
            await asyncio.wait_for(asyncio.gather(*listener._tasks), 30)
            assert ours.fired == 0, "this replica created the run the reporter wrote while ours queued"
    assert cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT)) is not None


@pytest.mark.parametrize("reporter", ["writes it at 10 s", "falls silent at 2 s", "is heard from but never writes it"])
async def test_a_skip_is_left_to_a_reporter_that_is_still_heard_from(
    spec: JobSpec, cluster: Cluster, control_plane: Any, monkeypatch: pytest.MonkeyPatch, reporter: str
) -> None:
    """At 3,000 jobs this replica's own queue passed at once while the reporter's was 28 s long:
    the other replicas wrote ~1,000 skips a minute a second time (a create, a 409 and a read
    each). What tells a slow reporter from a dead one is that it still writes: here it writes a
    run every second, as a replica at work does. A reporter heard from is left to write its
    skip (before, ours created it at 3 s); one that falls silent is replaced within seconds;
    one heard from that never writes it is replaced after SKIP_LEFT_TO_A_LIVE_REPORTER_S (8 s here)."""
    from anarchon.engine import Run
    from anarchon.kube import listener as listener_module

    monkeypatch.setattr(listener_module, "SKIP_LEFT_TO_A_LIVE_REPORTER_S", 8.0)
    silent_at = {"writes it at 10 s": 12.0, "falls silent at 2 s": 2.0}.get(reporter, 20.0)
    name = run_name(spec.name, NEW_SLOT)
    other = await connect(str(control_plane.kubeconfig))  # the reporter's: not through our proxy
    try:
        with ApiFaultProxy(control_plane) as proxy:
            async with _replica_listener(proxy, spec) as (_, listener, cache):
                ours = proxy.add(Fault("latency", seconds=0, verb="create", resource="anarchonruns"))

                async def at_work() -> None:
                    """The reporter's other writes: a Skipped run of its own each second, until silent."""
                    started = time.monotonic()
                    for i in range(1, 100):
                        if time.monotonic() - started >= silent_at:
                            return
                        await runs.record_skipped(other, spec, OLD_SLOT + i, "overlap", instance="reporter")
                        if reporter == "writes it at 10 s" and time.monotonic() - started >= 10:
                            await runs.record_skipped(other, spec, NEW_SLOT, "overlap", instance="reporter")
                            return
                        await asyncio.sleep(1)

                working = asyncio.ensure_future(at_work())
                await until_async("the reporter heard from", lambda: cache.heard_from("reporter") is not None)
                key = engine_key(spec.namespace, spec.name, spec.uid)
                started = time.monotonic()
                listener.skipped_elsewhere(
                    key, NEW_SLOT, Run(key, NEW_SLOT, RunState.SKIPPED, 0, "reporter", "", 0, 0, 0)
                )
                await asyncio.wait_for(asyncio.gather(*listener._tasks), 60)
                took = time.monotonic() - started
                await asyncio.wait_for(working, 60)
    finally:
        await other.close()
    status = cluster.get("anarchonrun", name)["status"]
    assert status["phase"] == "Skipped", status
    if reporter == "writes it at 10 s":
        assert ours.fired == 0, "this replica created the run of a reporter still at work"
        assert status["instance"] == "reporter", status
    else:
        assert ours.fired == 1 and status["instance"] == "me", (ours.fired, status)
        # Silent from 2 s: written after its silence (3 s) is noticed; heard from: after the 8 s.
        low, high = (3, 8) if reporter == "falls silent at 2 s" else (8, 14)
        assert low <= took <= high, took


async def test_a_skips_event_waits_behind_the_requests_of_runs_queued_after_it_its_run_does_not(
    spec: JobSpec, cluster: Cluster, control_plane: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Event of a replica's skip is background work: with the replica's one turn held, a
    run created after the skip (a won slot's, as a runner does) goes first. The Skipped run
    itself does not wait: the other replicas look for it once their own queued requests went
    out, and write it themselves if it is not there (as background work, at 3,000 jobs they
    wrote nearly every skip). Its create and status go in one turn, without a read between."""
    from weakref import WeakKeyDictionary

    from anarchon.kube.listener import OperatorListener
    from anarchon.kube.metrics import Metrics

    monkeypatch.setattr(kube_client, "_turns", WeakKeyDictionary())  # this loop's turns: one
    with ApiFaultProxy(control_plane) as proxy:
        kube = await connect(str(proxy.kubeconfig), api_concurrency=1)
        try:
            listener = OperatorListener(Metrics(lambda: 0), kube, EventPoster(kube), instance_id="me")
            listener.bind(lambda job: spec, _no_refresh, _no_missed)
            held = proxy.add(Fault("latency", seconds=2, verb="list", resource="configmaps", times=1))
            holding = asyncio.ensure_future(
                kube_client.call(
                    "the held request", lambda: kube.request("GET", kube_client.path("configmaps", spec.namespace))
                )
            )
            await until_async("our one turn held", lambda: held.fired)
            listener.skipped(engine_key(spec.namespace, spec.name, spec.uid), OLD_SLOT, "overlap")
            await asyncio.sleep(0.2)  # the skip's requests queue first
            await asyncio.wait_for(runs.ensure_run(kube, spec, NEW_SLOT, "Schedule"), 30)
            await asyncio.wait_for(holding, 30)
            await asyncio.wait_for(asyncio.gather(*listener._tasks), 30)
        finally:
            await kube.close()
    writes = [(r.verb, r.resource) for r in proxy.requests if r.verb != "list"]
    skip = [("create", "anarchonruns"), ("update", "anarchonruns")]
    ours = [("create", "anarchonruns")]
    # In the order they came, the Event went before ours.
    assert writes[:4] == [*skip, *ours, ("create", "events")], writes
    assert cluster.get("anarchonrun", run_name(spec.name, NEW_SLOT)) is not None
    assert cluster.get("anarchonrun", run_name(spec.name, OLD_SLOT))["status"]["phase"] == "Skipped"


async def _no_refresh(spec: JobSpec) -> None:
    """A job status refresh that is not under test."""


def test_a_skip_whose_reporter_died_before_writing_it_is_written_by_another_replica(
    cluster: Cluster, control_plane: Any, replicas_factory: Any, tmp_path: Path
) -> None:
    """The replica whose claim recorded a slot Skipped writes its run; here it is SIGKILLed while
    that create is held up (the soak SIGKILLed one 0.4 s after a skip, and that slot never got a
    run, mending then leaving it to the history limits). The other replica, which heard of the
    skip from its own claim and hears nothing more from the reporter, writes the run within seconds.
    Each replica has its own proxy: only the reporter's create is held.
    """
    with ApiFaultProxy(control_plane) as doomed, ApiFaultProxy(control_plane) as survivor:
        replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
        for i, proxy in enumerate((doomed, survivor)):
            # No periodic pass within the test: mending, which looks at most once a minute and
            # leaves a skip older than the history keeps alone, is not what writes the run here.
            replicas.start(f"replica-{i}", "--kubeconfig", str(proxy.kubeconfig), "--resync", "10m")
        long_runs = {"anarchon.test/run-seconds": "60"}
        keep = {"successfulRunsHistoryLimit": 100}  # every Skipped run stays
        cluster.apply(job_manifest("skipper", every="2s", overlap="Skip", annotations=long_runs, **keep))
        until("the long run", lambda: cluster.phases("skipper")["Running"] == 1, timeout=60)
        # The job's status shows it once its runner refreshed it, and mended: the next look for
        # runs without an object is a minute away.
        until(
            "the job's status refreshed",
            lambda: (cluster.get("anarchonjob", "skipper").get("status") or {}).get("activeCount") == 1,
            timeout=60,
        )
        held = doomed.add(Fault("latency", seconds=30, verb="create", resource="anarchonruns", times=1))
        until("a skipped slot's run create, held up", lambda: held.fired, timeout=60)
        replicas.kill("replica-0")  # its held create is never sent: the proxy drops it with the connection
        killed_at = time.monotonic()

        def gaps() -> list[int]:
            """Slots of the every-2s job without a run, between its first and its newest run."""
            slots = sorted(int(r["spec"]["slot"]) for r in cluster.runs("skipper"))
            return [s for s in range(slots[0], slots[-1], 2_000) if s not in slots]

        until("no slot without a run", lambda: not gaps() and time.monotonic() - killed_at > 8, timeout=40)
        assert time.monotonic() - killed_at < 25, "written by the survivor, in seconds"
        phases = cluster.phases("skipper")
        assert phases["Skipped"] >= 4, phases


async def _no_missed(spec: JobSpec, slots: list[int], message: str) -> None:
    """A keeper of missed slots that is not under test."""
