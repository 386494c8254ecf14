"""A run whose cluster was lost: its own cluster's backups first, then another cluster's, or given up.

Instances named ``<cluster>/<replica>`` (anarchon.engine.shared) on one store stand in for the
replicas of two clusters; time runs fast. The operator's end to end: tests/operator/test_multicluster.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from anarchon.engine import Cause, CrossCluster, Job, LeaseBackend, RunContext, RunState, ScaledClock, Scheduler, every
from anarchon.engine.backends import from_url
from anarchon.engine.scheduler import job_options
from tests.harness.engine import Calls, Recorder, fast_clock
from tests.harness.until import until_async

JOB = "shared/report"
LEASE_MS = 3_000


@pytest.fixture
def clock() -> ScaledClock:
    return fast_clock(20.0)


@pytest.fixture
async def instances(tmp_path: Path, clock: ScaledClock) -> AsyncIterator[Callable[[str], Scheduler]]:
    """``instances("east/a")``: an instance on one SQLite store; all stopped (no hand-over) at the end."""
    made: list[Scheduler] = []

    def make(name: str) -> Scheduler:
        sched = Scheduler(
            from_url(f"sqlite://{tmp_path / 'store.db'}"), instance_id=name, clock=clock, listener=Recorder()
        )
        made.append(sched)
        return sched

    yield make
    for sched in made:
        await sched.stop(handover=False)


async def _runs_then_dies(
    instances: Callable[[str], Scheduler], clock: ScaledClock, calls: Calls, backups: list[str], policy: CrossCluster
) -> int:
    """east/a runs a triggered run and dies (no hand-over); ``backups`` stand by. When it died."""

    async def long(ctx: RunContext) -> None:
        await clock.sleep(600_000)

    for name in ["east/a", *backups]:
        sched = instances(name)
        sched.schedule(
            JOB, every("1h"), calls.handler(long), jitter=0, heartbeat="1s", lease="3s", cross_cluster=policy
        )
        await sched.start()
        if name == "east/a":
            runner = sched
            assert (await sched.trigger(JOB)).won
            await until_async("attempt 1", lambda: len(calls.calls) == 1)
    await runner.stop(handover=False)  # dies: no release, no more heartbeats
    return clock.now_ms()


async def test_a_backup_of_the_runs_own_cluster_takes_it_first(
    instances: Callable[[str], Scheduler], clock: ScaledClock
) -> None:
    calls = Calls(clock)
    backups = ["west/c", "west/d", "west/e", "east/b"]
    died = await _runs_then_dies(instances, clock, calls, backups, CrossCluster.RELAUNCH)
    await until_async("attempt 2", lambda: len(calls.calls) == 2)
    assert calls.calls[1].instance == "east/b"
    assert calls.calls[1].started_ms - died <= LEASE_MS + 2_000 + 1_500  # within a lease and a heartbeat or two


async def test_another_cluster_relaunches_it_a_lease_after_its_lease(
    instances: Callable[[str], Scheduler], clock: ScaledClock
) -> None:
    calls = Calls(clock)
    died = await _runs_then_dies(instances, clock, calls, ["west/c"], CrossCluster.RELAUNCH)
    await until_async("attempt 2", lambda: len(calls.calls) == 2)
    second = calls.calls[1]
    assert (second.attempt, second.instance, second.previous_instance) == (2, "west/c", "east/a")
    # Its lease ran out up to a heartbeat after it died; then its own cluster's lease, then a sweep.
    assert LEASE_MS + LEASE_MS - 1_000 <= second.started_ms - died <= 2 * LEASE_MS + 2_000 + 1_500


async def test_with_never_it_is_given_up_not_relaunched(
    instances: Callable[[str], Scheduler], clock: ScaledClock
) -> None:
    calls = Calls(clock)
    died = await _runs_then_dies(instances, clock, calls, ["west/c"], CrossCluster.NEVER)
    store = instances("west/reader").backend
    assert isinstance(store, LeaseBackend)
    await store.setup()
    slot = calls.calls[0].slot

    async def ended() -> bool:
        run = await store.get_run(JOB, slot)
        return run is not None and not run.state.active

    await until_async("the run given up", ended)
    run = await store.get_run(JOB, slot)
    assert run.state is RunState.INTERRUPTED and "gave up after attempt 1" in (run.error or ""), run
    assert clock.now_ms() - died >= LEASE_MS + LEASE_MS - 1_000
    await asyncio.sleep(0.2)
    assert len(calls.calls) == 1, "relaunched in another cluster although crossCluster is Never"


async def test_a_held_instance_claims_nothing_and_lets_the_lease_of_its_run_run_out(
    instances: Callable[[str], Scheduler], clock: ScaledClock
) -> None:
    """Job.held (the operator: its API server out of reach): the other cluster gets the run and the slots."""
    calls = Calls(clock)
    why: list[str] = []

    async def long(ctx: RunContext) -> None:
        await clock.sleep(600_000)

    east, west = instances("east/a"), instances("west/c")
    for sched in (east, west):
        options = job_options(jitter=0, heartbeat="1s", lease="3s")
        held = (lambda: why[0] if why else None) if sched is east else None
        sched.add(Job(JOB, every("1h"), calls.handler(long), options, held=held))
        await sched.start()
    assert (await east.trigger(JOB)).won
    await until_async("attempt 1", lambda: len(calls.calls) == 1)
    why.append("its API server is out of reach")
    await until_async("attempt 2 in west", lambda: len(calls.calls) == 2, timeout=30)
    assert calls.calls[1].instance == "west/c"
    loop = east.jobs[JOB]
    await loop._handle_slot(clock.now_ms(), Cause.SCHEDULE)  # a slot due now: east leaves it alone
    assert len(calls.calls) == 2
