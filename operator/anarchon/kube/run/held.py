"""One attempt's hold on its run: what every step of the attempt works with, and how it writes
and ends the run.

Each step (launching a try, watching a Pending Pod, following the Pod) acts only while the
attempt holds the run (:meth:`Held.confirm`, a heartbeat that must succeed), and writes the
run's status through :meth:`Held.write`, whose refusal (a later attempt owns the run) ends the
attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ...engine import RunCancelled, RunContext, RunFailed, RunInterrupted, RunState
from ...engine.attempt import FENCED
from ..api.client import Kube
from ..api.watching import uid_of
from ..constants import RUN_KIND
from ..job.spec import JobSpec
from ..report.kube_events import EventPoster
from . import record, runstatus
from .cache import CancelWake
from .pods import PodView
from .podwatch import PodWatch, wait_for_change

#: The reason of the Events of a cancelled run.
CANCELLED = str(RunState.CANCELLED)


@dataclass(frozen=True)
class Wiring:
    """What every attempt of a job's runner works with: the API server, Events, the Pod watch, the operator's hooks."""

    kube: Kube
    events: EventPoster
    pod_watch: PodWatch | None = None
    #: Called once a Pod was created (metrics).
    on_launch: Callable[[RunContext], None] | None = None
    #: Told each run object we created or wrote (the run cache).
    wrote: Callable[[dict[str, Any]], None] | None = None
    #: A job's run objects as the run cache has them (None: not live).
    runs_of: Callable[[str, str], list[dict[str, Any]] | None] | None = None
    #: False while the store is found not shared (see :mod:`..job.sharing`).
    store_shared: Callable[[], bool] | None = None
    #: How often a Pod is read when no watch wakes us...
    poll_s: float = 1.0
    #: ... and when one does: a missed event only delays an outcome.
    resync_s: float = 30.0


@dataclass
class Held:
    """The run as one attempt holds it: its spec as the attempt began, its object as last
    created or written (its next write starts there), and its cancel."""

    wiring: Wiring
    ctx: RunContext
    spec: JobSpec
    name: str
    #: Set once the run's object asks for a cancel.
    wake: CancelWake
    in_hand: record.InHand

    @property
    def kube(self) -> Kube:
        return self.wiring.kube

    @property
    def events(self) -> EventPoster:
        return self.wiring.events

    async def confirm(self) -> None:
        """Go on only while this attempt holds the run (a heartbeat that must succeed)."""
        if not await self.ctx.confirm():
            raise self.fenced()

    def fenced(self) -> RunInterrupted:
        # The engine writes nothing for a fenced attempt; raising (not returning) keeps a fenced
        # handler from ever looking like a success.
        ctx = self.ctx
        return RunInterrupted(
            f"attempt {ctx.attempt} fenced ({ctx.stop_reason or FENCED}): another attempt holds the run"
        )

    async def write(self, change: Callable[[runstatus.Status], runstatus.Status | None]) -> None:
        """Write the run's status for this attempt; a refusal ends the attempt (a later one owns the run)."""
        spec, attempt = self.spec, self.ctx.attempt
        if not await record.update_status(self.kube, spec.namespace, self.name, attempt, change, in_hand=self.in_hand):
            raise RunInterrupted(f"attempt {attempt}: the run {self.name} is owned by a later attempt, or gone")
        if self.in_hand.body is not None:
            self.noted(self.in_hand.body)

    def noted(self, run: dict[str, Any]) -> None:
        """Our own read or write of the run's object: the run cache keeps it, and a cancel on it counts."""
        if self.wiring.wrote is not None:
            self.wiring.wrote(run)
        self.wake.asked(run)

    async def end(
        self,
        outcome: RunState,
        message: str,
        *,
        final: bool,
        reason: str | None = None,
        failed_try: str | None = None,
    ) -> None:
        ctx = self.ctx
        await self.confirm()
        await self.write(
            lambda s: runstatus.end_attempt(
                s,
                attempt=ctx.attempt,
                outcome=outcome,
                message=message,
                final=final,
                reason=reason,
                instance=ctx.instance,
                failed_try=failed_try,
            ),
        )

    async def fail(self, message: str, reason: str | None) -> None:
        """The run failed (its last try's Pod did): the object says so, an Event, the engine is told."""
        await self.end(RunState.FAILED, message, final=True, reason=reason)
        await self.events.about(self.spec, reason="RunFailed", warning=True, message=f"run {self.name}: {message}")
        raise RunFailed(message)

    async def cancelled(self, failed: PodView | None = None) -> NoReturn:
        """End the run Cancelled, its Pod stopped or never launched: the run's object says who asked
        and why, an Event on the run and on the job, and the engine ends it for good (no backup
        takes it over). ``failed``: the try's Pod had failed on its own first, and is not retried."""
        spec, name = self.spec, self.name
        message = (self.wake.cancel or record.Cancel("")).message
        failed_try = None if failed is None else failed.message
        await self.end(RunState.CANCELLED, message, final=True, failed_try=failed_try)
        await self.events.post(
            namespace=spec.namespace,
            name=name,
            uid=uid_of(self.in_hand.body),
            reason=CANCELLED,
            message=message,
            kind=RUN_KIND,
        )
        await self.events.about(spec, reason=CANCELLED, message=f"run {name}: {message}")
        raise RunCancelled(message)

    async def wait(
        self,
        changed: asyncio.Event | None,
        *,
        at_most_s: float | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        """Until the Pod changed (``changed``), the attempt stops, ``wake`` is set, or the next poll is due."""
        poll_s, resync_s = self.wiring.poll_s, self.wiring.resync_s
        if at_most_s is not None:
            poll_s, resync_s = min(poll_s, at_most_s), min(resync_s, at_most_s)
        pod_watch, stop = self.wiring.pod_watch, self.ctx.stop
        await wait_for_change(pod_watch, changed, stop, poll_s=poll_s, resync_s=resync_s, wake=wake)
