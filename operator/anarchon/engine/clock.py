"""Time, injectable: the engine reads the time and sleeps only through a :class:`Clock`.

Scheduling logic is tested by fast-forwarding a fake clock instead of waiting, and every
time the engine stores is integer milliseconds since the epoch (see :mod:`.schedule`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in ms since 1970-01-01 UTC."""
        ...

    async def sleep_until(self, t_ms: int) -> None:
        """Return once ``now_ms() >= t_ms`` (or at once if it already is)."""
        ...

    async def sleep(self, ms: int) -> None:
        """Sleep ``ms`` milliseconds of this clock's time."""
        ...


class SystemClock:
    """The real clock. Sleeps in chunks so a wall-clock jump (NTP step) is noticed.

    The event loop wakes a timer up to a millisecond late (epoll rounds its timeout up), and
    on a busy machine later still. A slot is claimed the moment it is due, so the last
    ``precise_ms`` before a deadline are spent yielding to the loop instead of sleeping:
    the loop keeps serving other tasks, and the deadline is met to a fraction of a
    millisecond, for at most ``precise_ms`` of CPU per slot.
    """

    max_chunk_ms = 1_000

    def __init__(self, precise_ms: int = 2) -> None:
        self.precise_ms = precise_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep_until(self, t_ms: int) -> None:
        while (left := t_ms - self.now_ms()) > self.precise_ms:  # noqa: ASYNC110 - polling the wall clock is the point
            await asyncio.sleep(min(left - self.precise_ms, self.max_chunk_ms) / 1000)
        while time.time_ns() < t_ms * 1_000_000:  # noqa: ASYNC110
            await asyncio.sleep(0)

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(ms, 0) / 1000)


class LoopClock:
    """Wall time that follows the event loop's clock from a fixed start.

    Under a loop with fast-forwarded time (e.g. ``looptime``), ``now_ms`` advances exactly
    as far as the loop's sleeps do, so a whole day of schedule runs in a blink. The start
    defaults to the real time at creation.
    """

    def __init__(self, start_ms: int | None = None) -> None:
        self._start_ms = SystemClock().now_ms() if start_ms is None else start_ms
        self._loop_start: float | None = None

    def _loop_time(self) -> float:
        loop = asyncio.get_running_loop()
        if self._loop_start is None:
            self._loop_start = loop.time()
        return loop.time() - self._loop_start

    def now_ms(self) -> int:
        return self._start_ms + round(self._loop_time() * 1000)

    async def sleep_until(self, t_ms: int) -> None:
        left = t_ms - self.now_ms()
        if left > 0:
            await asyncio.sleep(left / 1000)

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(ms, 0) / 1000)


class ScaledClock:
    """Wall time that runs ``factor`` times faster than real time, from ``start_ms``.

    For tests of timing logic against real stores: a 2 s heartbeat passes in 2/factor real
    seconds, while real I/O (a store round trip) still takes its real, now tiny, share of
    clock time. Unlike a frozen fake clock, nothing needs to step it by hand.
    """

    def __init__(self, factor: float = 10.0, start_ms: int | None = None) -> None:
        if factor <= 0:
            raise ValueError("factor must be positive")
        self.factor = factor
        self._start_ms = SystemClock().now_ms() if start_ms is None else start_ms
        self._real_start = time.monotonic()

    def now_ms(self) -> int:
        return self._start_ms + int((time.monotonic() - self._real_start) * 1000 * self.factor)

    async def sleep_until(self, t_ms: int) -> None:
        while (left := t_ms - self.now_ms()) > 0:  # noqa: ASYNC110 - a sleep may wake early by rounding
            await asyncio.sleep(left / 1000 / self.factor)

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(ms, 0) / 1000 / self.factor)
