"""Listing the slots missed over a long catch-up window must not stall the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from anarchon.engine import EngineListener, ScaledClock, Scheduler, cron
from anarchon.engine.backend import ClaimRequest, LeaseBackend
from anarchon.engine.backends import from_url
from anarchon.engine.model import Overlap, new_token
from anarchon.engine.schedule import Cron, Schedule
from tests.harness.engine import HOUR_MS, Calls, Recorder
from tests.harness.until import until_async


class Counted:
    """A real cron schedule that counts how often it is asked for a slot."""

    def __init__(self, inner: Cron) -> None:
        self.inner = inner
        self.calls = 0

    def next_after(self, t_ms: int) -> int:
        self.calls += 1
        return self.inner.next_after(t_ms)

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint


T0 = 1_800_000_000_000


async def an_hour_later(
    tmp_path: Path, job_name: str, schedule: Schedule, listener: EngineListener
) -> tuple[Scheduler, LeaseBackend]:
    """An instance (not started) of a job on ``schedule`` that last ran at T0, an hour ago:
    no instance ran it since, so 3600 slots of ``* * * * * *`` were missed."""
    backend = from_url(f"sqlite://{tmp_path / 'store.db'}")
    assert isinstance(backend, LeaseBackend)
    await backend.setup()
    await backend.schedule_since(job_name, schedule.fingerprint, T0 - 1000)
    await backend.claim(ClaimRequest(job_name, T0, "one", new_token(), T0, 1000, Overlap.ALLOW))
    clock = ScaledClock(1.0, start_ms=T0 + HOUR_MS + 500)
    two = Scheduler(backend, instance_id="two", clock=clock, listener=listener)
    two.schedule(job_name, schedule, Calls(clock).handler(), jitter=0, overlap="Allow", catch_up="Latest")
    return two, backend


async def test_catch_up_over_an_hour_of_seconds_lets_other_tasks_run(tmp_path: Path, job_name: str) -> None:
    schedule = Counted(cron("* * * * * *"))
    recorder = Recorder()
    two, backend = await an_hour_later(tmp_path, job_name, schedule, recorder)

    most = 0  # most slots computed between two turns of another task

    async def other_task() -> None:
        nonlocal most
        seen = schedule.calls
        while True:
            await asyncio.sleep(0)
            most = max(most, schedule.calls - seen)
            seen = schedule.calls

    other = asyncio.create_task(other_task())
    try:
        await two.start()
        await until_async("the missed slots", lambda: len(recorder.of("missed")) >= 3599)
    finally:
        await two.stop()
        await backend.close()
        other.cancel()
    assert schedule.calls >= 3600
    print(f"next_after calls: {schedule.calls}, most between two turns of another task: {most}")
    assert most <= 300, most


class Reports(EngineListener):
    """Counts the reports of missed slots, as an operator posting an Event per report would."""

    def __init__(self) -> None:
        self.single: list[int] = []
        self.ranges: list[tuple[int, int, int]] = []

    def missed(self, job: str, slot: int, reason: str) -> None:
        self.single.append(slot)

    def missed_slots(self, job: str, slots: Sequence[int], reason: str) -> None:
        self.ranges.append((slots[0], slots[-1], len(slots)))


async def test_an_hour_of_missed_seconds_is_one_report_not_3600(tmp_path: Path, job_name: str) -> None:
    """Every report became a log line, two metric updates and an Event patch on the job: one
    per slot, 3,599 at once after an hour down, per job (and the same after an hour-long stall)."""
    reports = Reports()
    two, backend = await an_hour_later(tmp_path, job_name, cron("* * * * * *"), reports)
    try:
        await two.start()
        await until_async("the report of the missed slots", lambda: bool(reports.ranges))
    finally:
        await two.stop()
        await backend.close()
    assert reports.single == []
    assert reports.ranges == [(T0 + 1000, T0 + HOUR_MS - 1000, 3599)]
