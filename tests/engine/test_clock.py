"""The real clock's sleeps: on time, awake to a wall-clock step, one loop timer for all sleepers.

Real time, generous bounds: what is checked is the order and the count of wake-ups, not speed.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from anarchon.engine import SystemClock


async def test_sleepers_wake_at_their_wall_clock_deadlines() -> None:
    clock = SystemClock()
    start = clock.now_ms()
    deadlines = [start + 50 + (i * 37) % 900 for i in range(200)]
    woke: list[tuple[int, int]] = []

    async def sleeper(t: int) -> None:
        await clock.sleep_until(t)
        woke.append((t, clock.now_ms()))

    await asyncio.wait_for(asyncio.gather(*(sleeper(t) for t in deadlines)), 30)
    assert sorted(t for t, _ in woke) == sorted(deadlines)
    assert all(now >= t for t, now in woke), "a sleeper woke before its deadline"


async def test_a_sleeper_notices_the_wall_clock_stepping_forward() -> None:
    """An NTP step: the wall clock jumps an hour ahead; a sleep until then ends within a chunk."""
    offset = 0

    def wall_ns() -> int:
        return time.time_ns() + offset

    clock = SystemClock(now_ns=wall_ns)
    sleeping = asyncio.create_task(clock.sleep_until(clock.now_ms() + 3_600_000))
    await asyncio.sleep(0.2)
    assert not sleeping.done()
    offset = 3_600_000 * 1_000_000
    stepped = time.monotonic()
    await asyncio.wait_for(sleeping, 10)
    assert time.monotonic() - stepped < clock.max_chunk_ms / 1000 + 2


async def test_a_thousand_sleepers_share_one_loop_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle jobs waiting for their next slot: the loop is woken about once a chunk, not once per job.

    Sleeping in 1 s chunks each, 1,000 sleepers over 2.5 s set about 3,000 loop timers.
    """
    loop = asyncio.get_running_loop()
    timers = 0
    call_at = loop.call_at

    def counted(when: float, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal timers
        timers += 1
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counted)
    clock = SystemClock()
    until = clock.now_ms() + 2_500
    await asyncio.wait_for(asyncio.gather(*(clock.sleep_until(until) for _ in range(1_000))), 30)
    assert timers <= 10, timers


async def test_cancelled_sleepers_do_not_pile_up() -> None:
    """A job edited while it waits cancels its sleep: the far-off deadlines are dropped, not kept."""
    clock = SystemClock()
    far = clock.now_ms() + 3_600_000
    for _ in range(5):
        tasks = [asyncio.create_task(clock.sleep_until(far)) for _ in range(200)]
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    (timers,) = clock._timers.values()
    assert len(timers._heap) <= 200
