"""Backing up the other instances: one sweep per instance, whatever the number of jobs.

Every instance is the backup of every other. Once a heartbeat (a random half to whole one,
so that the instances' looks spread out) it asks the store one question, "which runs' leases
ran out?" (:meth:`LeaseStore.expired_runs`, one indexed query across all jobs), and hands
each run of a job it runs to that job's :meth:`JobLoop.take_over`; the store lets one
instance win each. A lease released on shutdown (a hand-over) is expired at once, so it is
taken within a heartbeat; a lease left by a dead or frozen instance within a heartbeat of
running out. Idle jobs cost an instance nothing each: a loop per job asking for its active
runs was thousands of store queries a second (bench/README.md).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping

from .backend import LeaseStore
from .clock import Clock
from .errors import StoreError
from .events import EngineListener
from .jobloop import JobLoop

log = logging.getLogger("anarchon.engine.backups")

#: Expired runs read per look. More than this many leases running out in one heartbeat (a
#: peer with as many runs died) are taken over over the next looks, these first.
SWEEP_LIMIT = 500
#: How often to look while no job is defined (nothing to back up, so nothing is asked).
IDLE_LOOK_MS = 1_000
#: How long stop() waits for a look in flight to end.
STOP_WAIT_S = 10.0


class BackupSweep:
    """The instance's one backup loop over every job's runs."""

    def __init__(
        self,
        backend: LeaseStore,
        loops: Mapping[str, JobLoop],
        *,
        clock: Clock,
        listener: EngineListener,
        rng: random.Random,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.listener = listener
        self.rng = rng
        self._loops = loops
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def interval_ms(self) -> int:
        """The shortest heartbeat of the jobs: a run of any of them is backed up within its own."""
        return min((loop.options.heartbeat_ms for loop in self._loops.values()), default=IDLE_LOOK_MS)

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name="anarchon-backups")

    async def stop(self) -> None:
        """Stop looking (a takeover won now would only be handed straight back).

        Cancelling is not enough on its own: a store client may swallow the cancellation of
        a call in flight (redis-py and psycopg have done so), and the loop would go on. So the
        loop also checks a flag, and the wait for it is bounded.
        """
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        task.cancel()
        _, late = await asyncio.wait({task}, timeout=STOP_WAIT_S)
        if late:
            log.error("the backup sweep did not stop within %s s; leaving it", STOP_WAIT_S)

    async def _run(self) -> None:
        while not self._stopping:
            await self.clock.sleep(int(self.interval_ms() * self.rng.uniform(0.5, 1.0)))
            if self._loops and not self._stopping:
                await self.look()

    async def look(self) -> None:
        """One look: take over, concurrently, every expired run of a job this instance runs."""
        try:
            expired = await self.backend.expired_runs(self.clock.now_ms(), SWEEP_LIMIT)
        except StoreError as exc:
            self.listener.store_error("expired_runs", "every job", str(exc))
            return
        takeovers = []
        for run in expired:
            loop = self._loops.get(run.job)
            if loop is not None:
                takeovers.append(loop.take_over(run))
        # Each takeover deals with its own store errors; a crash of one must not end the sweep.
        for outcome in await asyncio.gather(*takeovers, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.error("takeover failed", exc_info=outcome)
