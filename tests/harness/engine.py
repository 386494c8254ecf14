"""The engine tests' helpers: a fast clock, a recording listener and a recording handler."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from anarchon.engine import (
    Cause,
    ClaimOutcome,
    Clock,
    EngineListener,
    LeaseBackend,
    RunContext,
    RunState,
    ScaledClock,
    Scheduler,
)
from tests.harness.until import until_async

HOUR_MS = 3_600_000


def fast_clock(factor: float) -> ScaledClock:
    """A fast clock that starts one minute past the last whole hour of real time.

    Tests that schedule a job "every 1h" and trigger it by hand assume the schedule stays
    quiet for the test. From a real start time that holds only by luck: at 20x, a test begun
    in the last minute of an hour reaches the next hourly slot (seen in CI, where that slot's
    Skipped run then stood first in the history). From here the next hourly or daily slot is
    59 fake minutes away, far longer than any test runs.
    """
    now = int(time.time() * 1000)
    return ScaledClock(factor, start_ms=now - now % HOUR_MS + 60_000)


@dataclass
class Recorder(EngineListener):
    """Keeps every engine event it hears, for assertions."""

    events: list[tuple[str, ...]] = field(default_factory=list)
    #: One entry per report of several slots at once (``missed_slots``), beside their events.
    reports: list[tuple[str, ...]] = field(default_factory=list)

    def claimed(self, job: str, slot: int, outcome: ClaimOutcome, delay_ms: int) -> None:
        self.events.append(("claimed", job, str(slot), str(outcome)))

    def skipped(self, job: str, slot: int, reason: str, cause: Cause = Cause.SCHEDULE) -> None:
        self.events.append(("skipped", job, str(slot), reason, str(cause)))

    def missed(self, job: str, slot: int, reason: str) -> None:
        self.events.append(("missed", job, str(slot), reason))

    def missed_slots(self, job: str, slots: Sequence[int], reason: str) -> None:
        self.reports.append(("missed_slots", job, str(len(slots)), reason))
        for slot in slots:
            self.missed(job, slot, reason)

    def replaced(self, job: str, slot: int, by_slot: int) -> None:
        self.events.append(("replaced", job, str(slot), str(by_slot)))

    def took_over(self, job: str, slot: int, attempt: int, previous_instance: str | None) -> None:
        self.events.append(("took_over", job, str(slot), str(attempt), str(previous_instance)))

    def finished(self, job: str, slot: int, attempt: int, outcome: RunState, error: str | None) -> None:
        self.events.append(("finished", job, str(slot), str(attempt), str(outcome), error or ""))

    def fenced(self, job: str, slot: int, attempt: int, reason: str) -> None:
        self.events.append(("fenced", job, str(slot), str(attempt), reason))

    def of(self, kind: str) -> list[tuple[str, ...]]:
        return [e for e in self.events if e[0] == kind]


@dataclass
class Call:
    slot: int
    attempt: int
    instance: str
    previous_instance: str | None
    started_ms: int
    stop_reason: str | None = None
    cause: Cause | None = None


class Calls:
    """A handler factory that records every call; ``body`` decides what a call does."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self.started = asyncio.Event()

    def handler(
        self, body: Callable[[RunContext], Awaitable[None]] | None = None
    ) -> Callable[[RunContext], Awaitable[None]]:
        async def handle(ctx: RunContext) -> None:
            call = Call(
                ctx.slot,
                ctx.attempt,
                ctx.instance,
                ctx.previous.instance if ctx.previous else None,
                self.clock.now_ms(),
                cause=ctx.cause,
            )
            self.calls.append(call)
            self.started.set()
            try:
                if body is not None:
                    await body(ctx)
            finally:
                call.stop_reason = ctx.stop_reason

        return handle

    def slots(self) -> list[int]:
        return [c.slot for c in self.calls]


async def ran_once_then_down(backend: LeaseBackend, job_name: str, t0: int, factor: float, **options: Any) -> None:
    """History for catch-up tests: instance "one" runs the job (every minute) at t0 + 1 min,
    then stops on ``backend`` (closed here): from there on no instance is up."""
    clock = ScaledClock(factor, start_ms=t0 + 60_000 - 3_000)
    calls = Calls(clock)
    one = Scheduler(backend, instance_id="one", clock=clock)
    one.every(job_name, "1m", calls.handler(), jitter=0, **options)
    await one.start()
    await until_async("the run before the downtime", lambda: len(calls.calls) == 1)
    await one.stop()
    await one.backend.close()
