"""The engine handler of an AnarchonJob: one attempt of a run becomes (or adopts) one Pod.

The engine keeps the lease while this handler says the attempt is alive; this handler says
so only while the Pod is Pending or Running. Its rules:

* Before launching a Pod, deleting one or writing a final status it calls ``ctx.confirm()``:
  a runner that was frozen past its lease learns there that it was fenced off, and does
  nothing (:mod:`.held`).
* A later attempt first looks for the run's Pods: a live one is adopted (never a second
  Pod), a finished one gives the run its outcome, a lost one is deleted and replaced. A Pod
  that is being deleted, or whose node stopped reporting, may still run: it is followed
  until it is gone, and nothing is launched beside it (:mod:`.tries`, :mod:`.follow`).
* The outcome comes from the Pod alone: Succeeded → run Succeeded; Failed (exit code ≠ 0)
  → a new Pod, the next *try*, after a backoff, while the job's ``retries`` allow, else run
  Failed ("failed after N tries"); deadline exceeded (``timeout``, which bounds one try) →
  run Failed, no retry; lost (deleted, evicted) → attempt Interrupted, the next attempt
  relaunches the same try's Pod.
* Tries are not attempts: an attempt is this replica's turn at the run, a try one Pod of
  it (:mod:`.tries`).
* A Pod that stays Pending says why on the run (``status.reason``, condition PodPending, an
  Event); past the job's ``pendingTimeout`` it is deleted and the run fails, not retried
  (:mod:`.pending`).
* Anything else that ends this handler early (the API server or the store not answering,
  being fenced) ends the attempt as interrupted, never as a success or a failure: the next
  attempt picks up from the Pods, which are the record of what really ran.
* On shutdown the Pod is left running and the run handed over; a backup adopts it.
* Replaced by a newer run (overlap Replace), the run's live Pod is deleted (:mod:`.replaced`).
* A cancel (the annotation ``anarchon.io/cancel`` on the run's object, which the run cache's
  watch brings while the attempt runs, and every read of the object at its start) ends the
  run Cancelled: its live Pod is deleted with its own grace period and followed until it has
  stopped; nothing more is launched (no retry, no relaunch, and a backup that takes the run
  over later finds the annotation too). The Pod's own end wins a race: a Pod that Succeeded
  (or failed its last try) before the delete could land gives the run that outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from ...engine import Overlap, RunCancelled, RunContext, RunFailed, RunGivenUp, RunInterrupted, RunSkipped, RunState
from ...engine.attempt import SHUTDOWN
from ..client import ApiException, Kube, in_background, transient
from ..events import EventPoster
from ..pods import PodFate
from ..podwatch import PodWatch, interest_in
from ..spec import JobSpec, pod_name, run_name
from ..watching import uid_of
from . import record
from .cache import CancelWake
from .follow import follow, past_timeout
from .held import Held, Wiring
from .overlap import overlap_in_kubernetes, replace
from .tries import adopt_or_launch, current_try, retry_after

log = logging.getLogger("anarchon.kube.run.runner")


async def _unless_shutdown(ctx: RunContext, work: Coroutine[Any, Any, None]) -> None:
    """Await the attempt's ``work``; on shutdown, abandon it at once.

    A shutdown hands the attempt over as it stands: its Pod, if it has one, runs on, and the
    backup that takes the run next reads from the API server what this attempt got done (a
    create whose reply never came is found by its name; a status write is superseded by the
    next attempt's). So nothing the work still waits for (a request the API server holds up,
    its retries, the job's status refresh) is worth holding the hand-over for, while the
    engine would wait its whole stop grace for it. Any other stop (timeout, replaced, fenced)
    is the work's own to act on: it is awaited.
    """
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(ctx.stop.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and ctx.stop_reason == SHUTDOWN:
            task.cancel()
            await asyncio.wait({task})
            raise RunInterrupted(f"{ctx.instance} stopping: the run is left as it stands for a backup")
        await task
    finally:
        stop.cancel()
        task.cancel()  # only if we were cancelled ourselves: the engine gave up on the attempt


class PodRunner:
    """Runs attempts of one AnarchonJob; the controller keeps ``spec`` current."""

    def __init__(
        self,
        kube: Kube,
        events: EventPoster,
        spec: Callable[[], JobSpec],
        *,
        on_change: Callable[[JobSpec, bool], Awaitable[None]] | None = None,
        pod_watch: PodWatch | None = None,
        on_launch: Callable[[RunContext], None] | None = None,
        wrote: Callable[[dict[str, Any]], None] | None = None,
        runs_of: Callable[[str, str], list[dict[str, Any]] | None] | None = None,
        store_shared: Callable[[], bool] | None = None,
        cancels: Callable[[str, str], contextlib.AbstractContextManager[CancelWake]] | None = None,
        poll_s: float = 1.0,
        resync_s: float = 30.0,
    ) -> None:
        self.spec = spec
        self.on_change = on_change
        self.cancels = cancels  # a run's cancel, as the run cache's watch brings it (see RunCache.cancels)
        self.wiring = Wiring(kube, events, pod_watch, on_launch, wrote, runs_of, store_shared, poll_s, resync_s)
        self._posts: set[asyncio.Future[None]] = set()  # Events on their way (best effort, never awaited)

    async def __call__(self, ctx: RunContext) -> None:
        try:
            await _unless_shutdown(ctx, self._attempt(ctx))
        except (RunFailed, RunInterrupted, RunGivenUp, RunSkipped, RunCancelled):
            raise
        except Exception as exc:
            # Only a Pod's outcome is the run's outcome. An API error that outlasted its retries
            # (or a bug here) says nothing about the workload: the attempt is interrupted, and
            # the next one adopts the Pod or takes the outcome it had.
            why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else f"{type(exc).__name__}: {exc}"
            if not transient(exc):
                log.exception("attempt %d of %s@%s broke off", ctx.attempt, ctx.job, ctx.slot)
            raise RunInterrupted(f"attempt {ctx.attempt} broke off: {why}") from exc

    async def _attempt(self, ctx: RunContext) -> None:
        spec = self.spec()
        # A later attempt, recreating a run object that attempt 1 never wrote, guesses.
        cause = ctx.cause if ctx.cause is not None else record.cause_guess(spec, ctx.slot)
        name = run_name(spec.name, ctx.slot)
        with self._cancel_of(spec.namespace, name) as wake:
            run = await record.ensure_run(self.wiring.kube, spec, ctx.slot, cause)
            held = Held(self.wiring, ctx, spec, name, wake, record.InHand(run))
            held.noted(run)
            status: record.Status = dict(run.get("status") or {})
            await _number_after_record(held, status)
            if ctx.previous is not None:
                self._took_over(held)
            if record.ended(status):
                _end_as_recorded(ctx, status)
                return
            await self._attempt_with(held, uid_of(run), status)

    def _took_over(self, held: Held) -> None:
        """Say so on the job, in the background: posted here, once the attempt is numbered after
        the run's object (the store's number is below it after the store lost its state)."""
        ctx = held.ctx
        previous = ctx.previous.instance if ctx.previous is not None else None
        message = f"run {held.name}: attempt {ctx.attempt} taken over by {ctx.instance} from {previous}"
        task = asyncio.ensure_future(
            in_background(held.events.about(held.spec, reason="TakeOver", warning=True, message=message))
        )
        self._posts.add(task)
        task.add_done_callback(self._posts.discard)

    def _cancel_of(self, namespace: str, name: str) -> contextlib.AbstractContextManager[CancelWake]:
        """The run's cancel while the attempt runs: the run cache's, or one only the run's own reads set."""
        return contextlib.nullcontext(CancelWake()) if self.cancels is None else self.cancels(namespace, name)

    async def _attempt_with(self, held: Held, run_uid: str, status: record.Status) -> None:
        ctx, spec, name = held.ctx, held.spec, held.name
        for old in ctx.replaced:
            await replace(held, run_name(spec.name, old.slot))
        if not status and spec.options.overlap in (Overlap.SKIP, Overlap.REPLACE):
            await overlap_in_kubernetes(held)
        try_number, existing = await current_try(held, status)
        next_try_at = record.next_try_time(status, try_number)
        if not any(v.fate is not PodFate.LOST for v in existing):  # nothing to adopt: this attempt launches
            if held.wake.is_set():
                await held.cancelled()  # before its Pod, or after it was stopped
            if record.try_past_deadline(status, try_number, spec.timeout_ms, datetime.now(UTC)):
                # Its Pod was deleted for its deadline by a runner that did not live to record it.
                await held.fail(past_timeout(held), record.DEADLINE_EXCEEDED)
            # maxAttempts bounds launches of the workload: a takeover that adopts the live Pod is free.
            if (
                launched := record.launches_before(status, ctx.attempt, pod_name(name, try_number))
            ) >= spec.max_attempts:
                await _give_up(held, status, launched)
        while True:
            # Watched from before its launch, a Pod needs no read after it: its create's reply is
            # its state then, and every change since reaches ``since``.
            with interest_in(held.wiring.pod_watch, spec.namespace, pod_name(name, try_number)) as since:
                # Asked for before the launch as well: a replica stopped while the launch's writes
                # wait for their replies still owes the job's status this run (it flushes it).
                await self._changed(spec, ended=False)
                view, new = await adopt_or_launch(held, run_uid, try_number, existing, next_try_at)
                await self._changed(spec, ended=False)
                try:
                    failed = await follow(held, view, try_number, since if new else None)
                finally:
                    with contextlib.suppress(Exception):
                        await self._changed(spec, ended=True)
            if failed is None:
                return
            if held.wake.is_set():
                await held.cancelled(failed=failed)  # no retry
            next_try_at = await retry_after(held, try_number, failed)
            try_number, existing = try_number + 1, []

    async def _changed(self, spec: JobSpec, *, ended: bool) -> None:
        if self.on_change is not None:
            try:
                await self.on_change(spec, ended)
            except Exception as exc:
                log.warning("status refresh of %s failed: %s", spec.engine_name, exc)


async def _give_up(held: Held, status: record.Status, launched: int) -> None:
    """The run's Pod is lost and was launched as often as maxAttempts allows: the run ends Interrupted."""
    spec = held.spec
    why = record.RunStatus.of(status).message or "its Pod was lost"
    message = f"gave up: its Pod was launched {launched} times (maxAttempts {spec.max_attempts}): {why}"
    await held.end(RunState.INTERRUPTED, message, final=True)
    await held.events.about(spec, reason="RunInterrupted", warning=True, message=f"run {held.name}: {message}")
    raise RunGivenUp(message)


async def _number_after_record(held: Held, status: record.Status) -> None:
    """Number the attempt after the last one the run's object records, if the store counts fewer.

    Only a store that lost its state counts fewer (it numbers a run it claims again from 1): a
    runner of a later attempt would hold the run, and the heartbeat here would fail. Without
    this the object's attempt guard refuses every write of the new attempts, and the run stays
    Running for ever.
    """
    ctx = held.ctx
    recorded = record.RunStatus.of(status).attempt or 0
    if recorded < ctx.attempt:
        return
    await held.confirm()
    log.warning(
        "%s@%s: the store counts attempt %d, the run's object %d already: this is attempt %d",
        ctx.job,
        ctx.slot,
        ctx.attempt,
        recorded,
        recorded + 1,
    )
    ctx.continue_after(recorded)


def _end_as_recorded(ctx: RunContext, status: record.Status) -> None:
    """The run's object says how the run ended, and the store still has it open (it lost the
    end, or claimed the run anew): the store ends it the same way. Returns for Succeeded."""
    run = record.RunStatus.of(status)
    phase, message = run.phase, run.message or ""
    log.warning("%s@%s: the run's object says %s; the store had it open", ctx.job, ctx.slot, phase)
    if phase is RunState.FAILED:
        raise RunFailed(message or "failed")
    if phase is RunState.SKIPPED:
        raise RunSkipped(message or "skipped")
    if phase is RunState.CANCELLED:
        raise RunCancelled(message or "cancelled")
    if phase is RunState.INTERRUPTED:
        raise RunGivenUp(message or "interrupted")
