"""Time, injectable: the engine reads the time and sleeps only through a :class:`Clock`.

Scheduling logic is tested by fast-forwarding a fake clock instead of waiting, and every
time the engine stores is integer milliseconds since the epoch (see :mod:`.schedule`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import weakref
from collections.abc import Callable
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
    """The real clock. Sleepers wait in a shared timer that notices a wall-clock jump (NTP step).

    The event loop's timers run on a monotonic clock, so a sleep until a wall-clock time is
    checked against the wall clock at least every ``max_chunk_ms``. All sleepers of one event
    loop share one timer (:class:`_WallTimers`), which fires at the earliest deadline or after
    a chunk: 10,000 jobs waiting for their next slot cost one wake-up a second, not 10,000.

    The event loop wakes a timer up to a millisecond late (epoll rounds its timeout up), and
    on a busy machine later still. A slot is claimed the moment it is due, so the last
    ``precise_ms`` before a deadline are spent yielding to the loop instead of sleeping:
    the loop keeps serving other tasks, and the deadline is met to a fraction of a
    millisecond, for at most ``precise_ms`` of CPU per slot.
    """

    max_chunk_ms = 1_000

    def __init__(self, precise_ms: int = 2, *, now_ns: Callable[[], int] = time.time_ns) -> None:
        self.precise_ms = precise_ms
        self._now_ns = now_ns
        self._timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _WallTimers] = weakref.WeakKeyDictionary()

    def now_ms(self) -> int:
        return self._now_ns() // 1_000_000

    def timer(self, t_ms: int) -> asyncio.Future[None]:
        """A future done a precise stretch before ``t_ms`` (see :func:`timer`); cancel it to drop it."""
        loop = asyncio.get_running_loop()
        if t_ms - self.now_ms() <= self.precise_ms:
            done: asyncio.Future[None] = loop.create_future()
            done.set_result(None)
            return done
        timers = self._timers.get(loop)
        if timers is None:
            timers = self._timers[loop] = _WallTimers(loop, self.now_ms, self.max_chunk_ms)
        return timers.future(t_ms - self.precise_ms)

    async def sleep_until(self, t_ms: int) -> None:
        if t_ms - self.now_ms() > self.precise_ms:
            await self.timer(t_ms)
        while self._now_ns() < t_ms * 1_000_000:  # noqa: ASYNC110 - the last ms, yielding to the loop
            await asyncio.sleep(0)

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(ms, 0) / 1000)


class _WallTimers:
    """Every wall-clock sleeper of one event loop, behind one loop timer.

    The timer is set for the earliest deadline, or one chunk ahead if that is later; when it
    fires it reads the wall clock once, wakes every sleeper due, and sets itself again.
    Sleepers cancelled before their time (a job edited while it waited) are dropped when
    they come up, or all at once when they are most of the heap.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, now_ms: Callable[[], int], chunk_ms: int) -> None:
        self._loop = loop
        self._now_ms = now_ms
        self._chunk_ms = chunk_ms
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._cancelled = 0

    def future(self, t_ms: int) -> asyncio.Future[None]:
        """A future the timer completes once the wall clock reaches ``t_ms``."""
        future: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (t_ms, next(self._order), future))
        future.add_done_callback(self._on_done)
        self._arm()
        return future

    def _on_done(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            return
        self._cancelled += 1
        if self._cancelled > 64 and 2 * self._cancelled > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].done()]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _arm(self) -> None:
        """Have the timer fire at the earliest deadline, or a chunk from now if that is sooner."""
        if not self._heap:
            return
        delay_ms = min(max(self._heap[0][0] - self._now_ms(), 0), self._chunk_ms)
        at = self._loop.time() + delay_ms / 1000
        if self._handle is not None:
            if self._handle.when() <= at:
                return  # it fires soon enough
            self._handle.cancel()
        self._handle = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._now_ms()
        while self._heap and self._heap[0][0] <= now:
            _, _, future = heapq.heappop(self._heap)
            if future.done():
                self._cancelled = max(0, self._cancelled - 1)
            else:
                future.set_result(None)
        self._arm()


def timer(clock: Clock, t_ms: int) -> asyncio.Future[None]:
    """Something to wait for that is done at ``t_ms`` of ``clock`` (or, on the system clock, a
    precise millisecond or two before it: finish with ``clock.sleep_until(t_ms)``).

    On the system clock it is a bare future in the shared timer, not a task: a slot loop
    waiting for its next slot or a change of its job waits on two futures, and 10,000 idle
    jobs do not cost 10,000 more tasks. Other clocks (tests) get a task.
    """
    if isinstance(clock, SystemClock):
        return clock.timer(t_ms)
    return asyncio.ensure_future(clock.sleep_until(t_ms))


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
