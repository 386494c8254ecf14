"""An overloaded instance leaves new work to the others: its event loop's lag, measured.

When an instance has more to do than its CPU allows, its event loop runs late: timers fire
late, heartbeats go out late, and every new slot it wins adds to the pile. Its peers may be
idle. So an instance watches how late its own loop is, and while it is late by more than
:data:`THRESHOLD_MS` it claims new slots only after waiting that long (at most
:data:`MAX_PENALTY_MS`): the instances that are on time win them first. Nothing is given up:
if every instance is late, each still claims, later. Lateness, never loss.

Takeovers do not wait: they recover runs already promised (a hand-over within a heartbeat),
and the store lets only one instance win each anyway.

The loop is not the only place work piles up: a user of the engine adds its own backlogs
(:meth:`LoopLag.add_backlog`; the operator's is how long its oldest API request has waited for
a turn): under overload the replica that claims first may win most slots and queue their
requests while its loop is on time and the others have little to do (bench/README.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

#: How often the loop's lateness is sampled.
SAMPLE_MS: Final = 250
#: Lateness below this is ordinary jitter of a busy machine: no penalty.
THRESHOLD_MS: Final = 500
#: The longest a late instance waits before a claim or a takeover.
MAX_PENALTY_MS: Final = 2_000


class LoopLag:
    """The event loop's recent lateness: the worst sample, halved at every sample after it."""

    def __init__(self) -> None:
        self.lag_ms = 0.0
        self._task: asyncio.Task[None] | None = None
        self._backlogs: list[Callable[[], float]] = []

    def add_backlog(self, backlog_ms: Callable[[], float]) -> None:
        """Count ``backlog_ms()`` (how late this instance's work of some kind is, now) as lag."""
        self._backlogs.append(backlog_ms)

    def penalty_ms(self) -> int:
        """How long to wait before taking new work: 0 unless the loop (or a backlog) is late
        beyond the threshold."""
        late = max([self.lag_ms, *(backlog() for backlog in self._backlogs)])
        if late < THRESHOLD_MS:
            return 0
        return int(min(late, MAX_PENALTY_MS))

    def note(self, late_ms: float) -> None:
        self.lag_ms = max(late_ms, self.lag_ms / 2)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._sample(), name="anarchon-loop-lag")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _sample(self) -> None:
        # Real time, whatever clock schedules the slots: the loop's lateness is a fact of this
        # process, not of the schedule.
        while True:
            start = time.monotonic()
            await asyncio.sleep(SAMPLE_MS / 1000)
            self.note(max(0.0, (time.monotonic() - start) * 1000 - SAMPLE_MS))
