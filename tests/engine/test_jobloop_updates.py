"""Job definitions that change while the job runs: re-adds, schedule edits, suspend and resume.

The operator re-adds every job on every watch event (its own status writes included), so an
update that changes nothing must not disturb the slot loop, and one that does must not lose
the slot falling due while the store records the new schedule. The store's round trip is
made slow on purpose (``slow_schedule_since``) so that a slot always falls due inside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from anarchon.engine import Cause, LeaseBackend, RunContext, ScaledClock, Scheduler, SystemClock, cron, every
from tests.harness.engine import Calls, Recorder, fast_clock, ran_once_then_down
from tests.harness.until import until_async

FACTOR = 20.0


def slow_schedule_since(backend: LeaseBackend, factor: float = FACTOR) -> LeaseBackend:
    """Each schedule_since half a fake second longer (at ``factor``, the test's clock)."""
    recorded = backend.schedule_since

    async def slow(*args: Any, **kwargs: Any) -> int:
        await asyncio.sleep(0.5 / factor)
        return await recorded(*args, **kwargs)

    backend.schedule_since = slow  # type: ignore[method-assign]
    return backend


async def test_readding_an_unchanged_job_before_each_slot_loses_no_slot(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    clock = fast_clock(FACTOR)
    calls = Calls(clock)
    sched = Scheduler(slow_schedule_since(make_backend()), instance_id="one", clock=clock)
    handler = calls.handler()
    # Allow: on a loaded machine a run can outlast a fake second; Skip would then drop slots.
    sched.schedule(job_name, every("1s"), handler, jitter=0, overlap="Allow")
    await sched.start()
    try:
        first = every("1s").next_after(clock.now_ms())
        for slot in range(first + 1000, first + 9000, 1000):
            await clock.sleep_until(slot - 100)  # a watch event 100 ms before the slot
            sched.schedule(job_name, every("1s"), handler, jitter=0, overlap="Allow")
        await until_async("the last slot", lambda: max(calls.slots(), default=0) >= first + 8000)
    finally:
        await sched.stop()
        await sched.backend.close()
    slots = sorted(calls.slots())
    expected = list(range(first + 1000, first + 9000, 1000))
    assert [s for s in expected if s not in slots] == [], f"slots lost: {slots}"


async def test_a_schedule_edit_just_before_a_slot_keeps_that_slot(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    # 4x: the edit lands 100 fake ms (25 real ms) before the slot; at 20x (5 real ms) a loaded
    # machine's late wake-up put it after the slot (seen with two test workers, and serially).
    factor = 4.0
    clock = fast_clock(factor)
    calls = Calls(clock)
    sched = Scheduler(slow_schedule_since(make_backend(), factor), instance_id="one", clock=clock)
    # Allow: this is about the slot being claimed at all, not about overlaps with a late run.
    sched.schedule(job_name, every("2s"), calls.handler(), jitter=0, overlap="Allow")
    await sched.start()
    try:
        slot = every("2s").next_after(clock.now_ms() + 2000)
        await clock.sleep_until(slot - 100)
        # Every second from now on: `slot` is due under the new schedule too, 100 ms after the
        # edit, while the store is still recording it (half a fake second).
        sched.schedule(job_name, every("1s"), calls.handler(), jitter=0, overlap="Allow")
        await until_async("slots after the edit", lambda: max(calls.slots(), default=0) >= slot + 2000)
    finally:
        await sched.stop()
        await sched.backend.close()
    assert slot in calls.slots(), sorted(calls.slots())
    assert slot + 1000 in calls.slots(), "the new schedule is in force"


async def test_suspended_job_catches_up_on_resume_not_on_start(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    period = 60_000
    t0 = 1_800_000_000_000
    await ran_once_then_down(make_backend(), job_name, t0, FACTOR)

    # Five periods later an instance starts with the job suspended: nothing is caught up...
    later = ScaledClock(FACTOR, start_ms=t0 + 6 * period + 500)
    calls_2 = Calls(later)
    two = Scheduler(make_backend(), instance_id="two", clock=later)
    options: dict[str, Any] = {"jitter": 0, "catch_up": "All", "catch_up_window": "1h"}
    two.every(job_name, "1m", calls_2.handler(), suspend=True, **options)
    await two.start()
    try:
        await asyncio.sleep(0.3)  # 6 fake seconds: a catch-up would have claimed by now
        assert calls_2.calls == [], "a suspended job must not catch up"
        # ... until it is resumed: then the slots due while nothing ran count as missed.
        two.every(job_name, "1m", calls_2.handler(), suspend=False, **options)
        missed = [t0 + k * period for k in range(2, 7)]
        await until_async("the catch-up after the resume", lambda: len(calls_2.calls) >= len(missed))
        await asyncio.sleep(0.2)
    finally:
        await two.stop()
        await two.backend.close()
    assert sorted(calls_2.slots()) == missed
    assert {c.cause for c in calls_2.calls} == {Cause.CATCH_UP}


async def test_each_run_knows_why_it_exists_and_a_skipped_trigger_says_so(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    clock = fast_clock(FACTOR)
    calls = Calls(clock)
    rec = Recorder()
    sched = Scheduler(make_backend(), instance_id="one", clock=clock, listener=rec)

    async def long(ctx: RunContext) -> None:
        await clock.sleep(10_000)  # half a real second: the trigger below lands inside it

    sched.every(job_name, "1s", calls.handler(long), jitter=0)  # overlap Skip: one run at a time
    manual = Calls(clock)
    sched.every(job_name + "-m", "1h", manual.handler(), jitter=0)  # quiet: runs only when triggered
    await sched.start()
    try:
        await until_async("a scheduled run", lambda: len(calls.calls) >= 1)
        busy = calls.calls[-1].slot + 500
        result = await sched.trigger(job_name, busy)  # while that run is still active
        assert str(result.outcome) == "skipped"
        skipped = [e for e in rec.of("skipped") if e[2] == str(busy)]
        assert skipped and skipped[0][4] == "Manual", rec.of("skipped")
        assert (await sched.trigger(job_name + "-m")).won
        await until_async("the manual run", lambda: len(manual.calls) == 1)
    finally:
        await sched.stop(handover=False)
        await sched.backend.close()
    assert manual.calls[0].cause is Cause.MANUAL
    assert {c.cause for c in calls.calls} == {Cause.SCHEDULE}


async def test_idle_jobs_on_the_system_clock_cost_one_task_each_and_still_wake_for_an_edit(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """The real clock: an idle job's slot loop waits for its timer and for edits without tasks of
    its own (before: an Event waiter and a timer task per job, 30,000 tasks for 10,000 jobs), and
    an edit still wakes it: a job resumed to `every 1s` runs within seconds."""
    backend = make_backend()
    sched = Scheduler(backend, instance_id="one", clock=SystemClock())
    calls = Calls(SystemClock())
    jobs = 200
    baseline = len(asyncio.all_tasks())
    for i in range(jobs):
        sched.schedule(f"{job_name}-{i}", cron("0 0 1 1 *"), calls.handler(), jitter=0)
    await sched.start()
    try:
        await asyncio.sleep(1.0)  # every loop has read its schedule and gone to sleep
        extra = len(asyncio.all_tasks()) - baseline - jobs
        assert extra <= 5, f"{extra} tasks beside the {jobs} slot loops"
        sched.schedule(f"{job_name}-0", every("1s"), calls.handler(), jitter=0)
        await until_async("the edited job's first slot", lambda: bool(calls.calls), timeout=10)
    finally:
        await sched.stop()
        await backend.close()
