"""Tries of a run: the backoff between them, and a timeout that bounds each try, not the attempt.

The backoff is arithmetic (no time); the timer runs on a fast clock (20x), so a test of a
3 s timeout over a 10 s backoff takes well under a second of real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from anarchon.engine import ConfigError, RunContext, RunState, ScaledClock, Scheduler, every
from anarchon.engine.backends import from_url
from anarchon.engine.limits import MAX_RETRIES, MAX_RETRY_BACKOFF_MS, MIN_RETRY_BACKOFF_MS
from anarchon.engine.tries import Retries
from tests.harness.engine import Recorder, fast_clock
from tests.harness.until import until_async


def test_backoff_doubles_from_the_first_retry_and_stops_at_its_cap() -> None:
    retries = Retries(limit=6, backoff_ms=10_000, max_backoff_ms=60_000)
    assert [retries.backoff_after_ms(n) for n in range(1, 7)] == [10_000, 20_000, 40_000, 60_000, 60_000, 60_000]
    assert retries.max_tries == 7
    assert [retries.may_retry(n) for n in (1, 6, 7)] == [True, True, False]


def test_backoff_of_the_last_retry_of_the_largest_limit_is_capped_not_huge() -> None:
    retries = Retries(limit=MAX_RETRIES, backoff_ms=MAX_RETRY_BACKOFF_MS, max_backoff_ms=MAX_RETRY_BACKOFF_MS)
    assert retries.backoff_after_ms(MAX_RETRIES) == MAX_RETRY_BACKOFF_MS
    assert Retries().backoff_after_ms(10**6) == Retries().max_backoff_ms


def test_no_retries_by_default() -> None:
    assert Retries().max_tries == 1 and not Retries().may_retry(1)


@pytest.mark.parametrize(
    ("limit", "backoff", "cap", "says"),
    [
        (-1, 10_000, 60_000, "retries.limit"),
        (MAX_RETRIES + 1, 10_000, 60_000, "retries.limit"),
        (1, MIN_RETRY_BACKOFF_MS - 1, 60_000, "retries.backoff"),
        (1, 10_000, MAX_RETRY_BACKOFF_MS + 1, "retries.maxBackoff"),
        (1, 10_000, 5_000, "must not be shorter than"),
    ],
)
def test_bad_retries_are_refused(limit: int, backoff: int, cap: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Retries(limit=limit, backoff_ms=backoff, max_backoff_ms=cap)


@pytest.fixture
def clock() -> ScaledClock:
    return fast_clock(20.0)


@pytest.fixture
async def instance(tmp_path: Path, clock: ScaledClock) -> AsyncIterator[tuple[Scheduler, Recorder]]:
    rec = Recorder()
    sched = Scheduler(from_url(f"sqlite://{tmp_path / 'tries.db'}"), instance_id="one", clock=clock, listener=rec)
    yield sched, rec
    await sched.stop(handover=False)


async def test_a_restarted_timeout_bounds_each_try_not_the_attempt(
    instance: tuple[Scheduler, Recorder], clock: ScaledClock
) -> None:
    sched, rec = instance

    async def tries_of_two_seconds(ctx: RunContext) -> None:
        # 80 fake seconds: longer than the timeout in real time too (4 s at 20x), so neither
        # an unrestarted fake timer nor a real-time one would let the run succeed.
        for _ in range(40):
            ctx.restart_timeout()
            await clock.sleep(2_000)

    sched.schedule("tries", every("1h"), tries_of_two_seconds, jitter=0, heartbeat="1s", timeout="3s")
    await sched.start()
    await sched.trigger("tries")
    await until_async("the run to end", lambda: bool(rec.of("finished")))
    run = (await sched.history("tries"))[0]
    assert run.state is RunState.SUCCEEDED, run.error  # 80 s of work under a 3 s timeout, 2 s per try


async def test_a_paused_timeout_does_not_run_out_during_a_backoff_and_counts_again_after(
    instance: tuple[Scheduler, Recorder], clock: ScaledClock
) -> None:
    sched, rec = instance
    restarted_ms: list[int] = []
    stopped_ms: list[int] = []

    async def backoff_then_hang(ctx: RunContext) -> None:
        ctx.pause_timeout()
        await clock.sleep(10_000)  # a backoff more than three times the timeout
        ctx.restart_timeout()
        restarted_ms.append(clock.now_ms())
        await ctx.stop.wait()
        stopped_ms.append(clock.now_ms())

    sched.schedule("tries", every("1h"), backoff_then_hang, jitter=0, heartbeat="1s", timeout="3s")
    await sched.start()
    await sched.trigger("tries")
    await until_async("the run to end", lambda: bool(rec.of("finished")))
    run = (await sched.history("tries"))[0]
    assert run.state is RunState.FAILED and "timed out" in (run.error or "")
    assert restarted_ms and stopped_ms, "the timeout ran out during the backoff"
    # 3 fake seconds after the restart, give or take the loop's latency at 20x.
    assert 3_000 <= stopped_ms[0] - restarted_ms[0] < 5_000


async def test_without_a_restart_the_timeout_counts_from_the_attempts_start(
    instance: tuple[Scheduler, Recorder], clock: ScaledClock
) -> None:
    sched, rec = instance

    async def slow(ctx: RunContext) -> None:
        await asyncio.wait_for(ctx.stop.wait(), 30)

    sched.schedule("tries", every("1h"), slow, jitter=0, heartbeat="1s", timeout="3s")
    await sched.start()
    await sched.trigger("tries")
    await until_async("the run to end", lambda: bool(rec.of("finished")))
    run = (await sched.history("tries"))[0]
    assert run.state is RunState.FAILED and "timed out" in (run.error or "")
