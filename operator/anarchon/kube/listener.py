"""What the engine reports, turned into metrics, Kubernetes Events and AnarchonRuns.

The engine calls its listener's hooks synchronously from its job loops: a hook must not
block, so every API write it causes runs as a background task whose failure is logged.

A Skipped slot is recorded once, in the store, by the claim of one replica, which then
writes its AnarchonRun. The other replicas hear of the skip from their own claims; if that
replica dies in between, they write the run,
unless their run cache has it by then (or saw it deleted). They look SKIP_WRITTEN_WITHIN_S
later and once the requests they had queued by then went out (the reporter's queue alike; if
that took long, as long again), and while the reporter is heard from (the watch delivers runs
it wrote, see :meth:`.RunCache.heard_from`) they leave the run to it, up to
SKIP_LEFT_TO_A_LIVE_REPORTER_S. Under overload one replica's queue is a poor measure of
another's (figures: bench/README.md); that the reporter still writes is what tells a slow
reporter from a dead one.
Mending (:mod:`.mend`) would be later, and leaves alone a skip older than the history keeps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from ..engine import Cause, Run
from .client import Kube, in_background, queue_passed
from .events import EventPoster
from .metrics import Metrics, MetricsListener
from .run import record
from .run.cache import RunCache
from .run.replaced import end_given_up
from .spec import JobSpec, run_name, slot_time

log = logging.getLogger("anarchon.kube.listener")

#: How long the other replicas leave the run of a slot skipped elsewhere to the replica that
#: skipped it: a few of its API requests' time, and less than a lease.
SKIP_WRITTEN_WITHIN_S = 3.0
#: How long the other replicas leave a skip to a reporter that is still heard from, at most:
#: longer than its queue of requests under overload (bench/README.md), shorter than mending's
#: look back (see :data:`.mend.MISSING_LOOK_BACK_MS`).
SKIP_LEFT_TO_A_LIVE_REPORTER_S = 60.0


class OperatorListener(MetricsListener):
    """Metrics plus Kubernetes Events and Skipped runs for what the engine reports."""

    def __init__(
        self,
        metrics: Metrics,
        kube: Kube,
        events: EventPoster,
        *,
        instance_id: str,
        run_cache: RunCache | None = None,
    ) -> None:
        super().__init__(metrics)
        self.kube = kube
        self.events = events
        self.instance_id = instance_id
        self.run_cache = run_cache
        self._specs: Callable[[str], JobSpec | None] | None = None
        self._refresh_status: Callable[[JobSpec], Awaitable[None]] | None = None
        self._note_missed: Callable[[JobSpec, list[int], str], Coroutine[Any, Any, None]] | None = None
        self._tasks: set[asyncio.Future[Any]] = set()

    def bind(
        self,
        specs: Callable[[str], JobSpec | None],
        refresh_status: Callable[[JobSpec], Awaitable[None]],
        note_missed: Callable[[JobSpec, list[int], str], Coroutine[Any, Any, None]],
    ) -> None:
        """Give the listener the jobs' specs (by engine key), their status refresh and the
        keeper of their missed slots (:meth:`.JobStatus.note_missed`); once.

        Both come from the controller, which needs the Scheduler, which needs this listener:
        so they are bound after all three exist, before the first job is added (the Scheduler
        hands its listener to each job's loop as the job is added). Until then the listener
        only counts: without a job, nothing reports about a job.
        """
        if self._specs is not None:
            raise RuntimeError("OperatorListener is bound already")
        self._specs = specs
        self._refresh_status = refresh_status
        self._note_missed = note_missed

    def _spec(self, job: str) -> JobSpec | None:
        return None if self._specs is None else self._specs(job)

    def job_labels(self, job: str) -> tuple[str, str] | None:
        spec = self._spec(job)
        return None if spec is None else (spec.namespace, spec.name)

    def spawn(self, coro: Coroutine[Any, Any, None], *, background: bool = True) -> None:
        """Run ``coro`` in a task (listener hooks must not block); a failure is logged.

        Its API requests are background work (:func:`.client.background`) unless
        ``background`` is False.
        """
        task = asyncio.ensure_future(in_background(coro) if background else coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("background write failed: %s: %s", type(exc).__name__, exc)

    def _event(self, job: str, reason: str, message: Callable[[JobSpec], str], *, warning: bool = False) -> None:
        """Post an Event on the job in the background: listener hooks must not block."""
        spec = self._spec(job)
        if spec is not None:
            self.spawn(self.events.about(spec, reason, message(spec), warning=warning))

    def skipped(self, job: str, slot: int, reason: str, cause: Cause = Cause.SCHEDULE) -> None:
        super().skipped(job, slot, reason, cause)
        spec = self._spec(job)
        if spec is not None:
            # Not background work: the other replicas look for this run once the requests they
            # queued went out, i.e. they expect it written as soon as their own requests would
            # be. As background work it came after all of this replica's runs, and at 3,000
            # jobs the other two wrote nearly every skip as well (a create, a 409, a read each).
            self.spawn(
                record.record_skipped(self.kube, spec, slot, reason, cause, instance=self.instance_id),
                background=False,
            )
        self._event(job, "Skipped", lambda _: f"slot {slot_time(slot)}: {reason}")

    def skipped_elsewhere(self, job: str, slot: int, run: Run) -> None:
        super().skipped_elsewhere(job, slot, run)
        spec = self._spec(job)
        if spec is not None and self.run_cache is not None:
            self.spawn(self._skip_written(self.run_cache, spec, slot, run))

    async def _skip_written(self, cache: RunCache, spec: JobSpec, slot: int, run: Run) -> None:
        """Write the Skipped run that another replica recorded, if it has not done so by now."""
        await asyncio.sleep(SKIP_WRITTEN_WITHIN_S)
        # Under overload the reporter's create waits its turn behind its other requests, for
        # far longer than that: ours wait alike, so look once what we queued by now went out
        # (looking at once made extra creates, 409s and reads per skip, and the overload worse).
        # The replicas' queues are alike, not equal: one that won more slots has more to send.
        # So when ours was long, give the reporter as long again; when it was short, look now.
        loop = asyncio.get_running_loop()
        queued_at = loop.time()
        await queue_passed()
        if (waited := loop.time() - queued_at) > SKIP_WRITTEN_WITHIN_S:
            await asyncio.sleep(waited)
        name = run_name(spec.name, slot)
        # A reporter heard from lately is alive and working through its queue: its create is on
        # its way. Only one that fell silent (or that never wrote it in all that time) is replaced.
        until = loop.time() + SKIP_LEFT_TO_A_LIVE_REPORTER_S
        while cache.seen(spec.namespace, name) is False and loop.time() < until:
            heard = cache.heard_from(run.instance)
            if heard is None or time.monotonic() - heard > SKIP_WRITTEN_WITHIN_S:
                break
            await asyncio.sleep(SKIP_WRITTEN_WITHIN_S)
        if cache.seen(spec.namespace, name) is not False:
            return  # written (or deleted since); or the cache is down: mending covers it
        log.warning("%s: skipped by %s, who has not written it: writing it", name, run.instance)
        await record.record_skipped(
            self.kube,
            spec,
            slot,
            run.error or "overlap",
            record.cause_guess(spec, slot),
            instance=self.instance_id,
        )

    def missed(self, job: str, slot: int, reason: str) -> None:
        super().missed(job, slot, reason)
        self._keep_missed(job, [slot], reason)
        self._event(job, "Missed", lambda _: f"slot {slot_time(slot)}: {reason}", warning=True)

    def missed_slots(self, job: str, slots: Sequence[int], reason: str) -> None:
        super().missed_slots(job, slots, reason)
        self._keep_missed(job, list(slots), reason)
        first, last = slot_time(slots[0]), slot_time(slots[-1])
        what = f"slot {first}" if len(slots) == 1 else f"{len(slots)} slots, {first} to {last}"
        self._event(job, "Missed", lambda _: f"{what}: {reason}", warning=True)

    def _keep_missed(self, job: str, slots: list[int], reason: str) -> None:
        """Into the job's status (``anarchon why`` reads it there long after the Event is gone)."""
        spec = self._spec(job)
        if spec is not None and self._note_missed is not None:
            self.spawn(self._note_missed(spec, slots, reason))

    def run_interrupted_final(self, run: Run) -> None:
        super().run_interrupted_final(run)
        message = run.error or f"interrupted after attempt {run.attempt}"
        spec = self._spec(run.job)
        if spec is not None:
            self.spawn(self._given_up(spec, run.slot, message))
        self._event(
            run.job, "RunInterrupted", lambda spec: f"run {run_name(spec.name, run.slot)}: {message}", warning=True
        )

    async def _given_up(self, spec: JobSpec, slot: int, message: str) -> None:
        await end_given_up(self.kube, spec.namespace, run_name(spec.name, slot), message)
        if self._refresh_status is not None:
            await self._refresh_status(spec)
