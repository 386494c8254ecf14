"""The Scheduler: one per instance, holding every job's loop on one backend.

Usage::

    backend = SqliteBackend("/var/lib/app/anarchon.db")
    async with Scheduler(backend) as scheduler:
        scheduler.every("sync", "10s", sync_handler, jitter="500ms")
        scheduler.cron("report", "0 8 * * *", report_handler, tz="Europe/Paris")
        await scheduler.wait()          # until cancelled

Leaving the ``async with`` (or calling :meth:`stop`) hands running attempts over: their
leases are released, so a backup instance takes over at once instead of after expiry.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .backend import Backend, HistoryStore, LeaseStore
from .backups import BackupSweep
from .batch import ClaimBatcher
from .clock import Clock, SystemClock
from .durations import parse_duration
from .errors import ConfigError
from .events import EngineListener
from .job import Handler, Job, JobOptions
from .jobloop import JobLoop
from .lag import LoopLag
from .model import CatchUp, ClaimResult, Overlap, Run
from .schedule import Schedule, cron, every


def default_instance_id() -> str:
    """``hostname:pid``: unique per process, and readable in history."""
    return f"{socket.gethostname()}:{os.getpid()}"


_DURATIONS = {
    "jitter": "jitter_ms",
    "heartbeat": "heartbeat_ms",
    "lease": "lease_ms",
    "catch_up_window": "catch_up_window_ms",
    "starting_deadline": "starting_deadline_ms",
    "timeout": "timeout_ms",
    "stop_grace": "stop_grace_ms",
}


def job_options(**options: Any) -> JobOptions:
    """Build JobOptions from friendly keywords: ``jitter="500ms"``, ``overlap="Allow"``...

    Durations accept strings with units or ints in ms; ``*_ms`` names are accepted as is.
    """
    fields: dict[str, Any] = {}
    for key, value in options.items():
        if key in _DURATIONS:
            fields[_DURATIONS[key]] = None if value is None else parse_duration(value, what=key)
        elif key == "overlap":
            fields[key] = None if value is None else Overlap(value)
        elif key == "catch_up":
            fields[key] = None if value is None else CatchUp(value)
        elif key in JobOptions.__dataclass_fields__:
            fields[key] = value
        else:
            raise ConfigError(f"unknown job option {key!r}")
    return JobOptions(**fields)


class Scheduler:
    """Runs jobs on this instance; every instance registers the same jobs."""

    def __init__(
        self,
        backend: Backend,
        *,
        instance_id: str | None = None,
        clock: Clock | None = None,
        listener: EngineListener | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.backend = backend
        self.instance_id = instance_id or default_instance_id()
        self.clock = clock or SystemClock()
        self.listener = listener or EngineListener()
        self.rng = rng or random.Random()
        self._loops: dict[str, JobLoop] = {}
        self._claims = ClaimBatcher(backend)
        #: This instance's event-loop lateness; while it is high, new work waits for the others.
        self.lag = LoopLag()
        self._sweep: BackupSweep | None = None
        self._started = False
        self._stopped = asyncio.Event()

    # -- defining jobs ---------------------------------------------------------------------------

    def add(self, job: Job) -> JobLoop:
        """Add a job, or update it in place if one of that name exists (next slot on)."""
        loop = self._loops.get(job.name)
        if loop is not None:
            loop.update(job)
            return loop
        loop = JobLoop(
            job,
            self.backend,
            instance=self.instance_id,
            clock=self.clock,
            listener=self.listener,
            rng=self.rng,
            claims=self._claims,
            lag=self.lag,
        )
        self._loops[job.name] = loop
        if self._started:
            loop.start()
        return loop

    def every(self, name: str, period: str | int, handler: Handler, **options: Any) -> JobLoop:
        return self.add(Job(name, every(period), handler, job_options(**options)))

    def cron(self, name: str, expression: str, handler: Handler, *, tz: str = "UTC", **options: Any) -> JobLoop:
        return self.add(Job(name, cron(expression, tz), handler, job_options(**options)))

    def schedule(self, name: str, schedule: Schedule, handler: Handler, **options: Any) -> JobLoop:
        return self.add(Job(name, schedule, handler, job_options(**options)))

    async def remove(self, name: str, *, handover: bool = True) -> None:
        loop = self._loops.pop(name, None)
        if loop is not None:
            await loop.stop(handover=handover)

    @property
    def started(self) -> bool:
        """True between a successful :meth:`start` (the store set up) and :meth:`stop`."""
        return self._started

    @property
    def jobs(self) -> Mapping[str, JobLoop]:
        """The job loops by name: a read-only view, not a copy (looked up once per run of a history)."""
        return MappingProxyType(self._loops)

    # -- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.backend.setup()
        self._started = True
        for loop in self._loops.values():
            loop.start()
        if isinstance(self.backend, LeaseStore) and self._sweep is None:
            self._sweep = BackupSweep(self.backend, self._loops, clock=self.clock, listener=self.listener, rng=self.rng)
            self._sweep.start()
        self.lag.start()

    async def stop(self, *, handover: bool = True) -> None:
        """Stop every job; with ``handover`` running attempts release their leases."""
        self.lag.stop()
        sweep, self._sweep = self._sweep, None
        if sweep is not None:
            await sweep.stop()
        loops = list(self._loops.values())
        await asyncio.gather(*(loop.stop(handover=handover) for loop in loops), return_exceptions=True)
        self._started = False
        self._stopped.set()

    async def wait(self) -> None:
        """Block until :meth:`stop` is called."""
        await self._stopped.wait()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        await self.backend.close()

    # -- operations ------------------------------------------------------------------------------

    async def trigger(self, name: str, slot: int | None = None) -> ClaimResult:
        """Run a job now (or at an explicit slot), outside its schedule."""
        try:
            loop = self._loops[name]
        except KeyError:
            raise ConfigError(f"no job named {name!r}") from None
        return await loop.trigger(slot)

    async def history(self, name: str, limit: int = 50) -> list[Run]:
        if not isinstance(self.backend, HistoryStore):
            raise ConfigError(f"the {self.backend.capabilities.name} store is claim-only and keeps no history")
        return await self.backend.history(name, limit)
