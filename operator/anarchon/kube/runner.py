"""The engine handler of an AnarchonJob: one attempt of a run becomes (or adopts) one Pod.

The engine keeps the lease while this handler says the attempt is alive; this handler says
so only while the Pod is Pending or Running. Its rules:

* Before launching a Pod, deleting one or writing a final status it calls ``ctx.confirm()``:
  a runner that was frozen past its lease learns there that it was fenced off, and does
  nothing.
* A later attempt first looks for the run's Pods: a live one is adopted (never a second
  Pod), a finished one gives the run its outcome, a lost one is deleted and replaced. A Pod
  that is being deleted, or whose node stopped reporting, may still run: it is followed
  until it is gone, and nothing is launched beside it.
* The outcome comes from the Pod alone: Succeeded → run Succeeded; Failed (exit code ≠ 0)
  → a new Pod, the next *try*, after a backoff, while the job's ``retries`` allow, else run
  Failed ("failed after N tries"); deadline exceeded (``timeout``, which bounds one try) →
  run Failed, no retry; lost (deleted, evicted) → attempt Interrupted, the next attempt
  relaunches the same try's Pod.
* Tries are not attempts: an attempt is this replica's turn at the run, a try one Pod of
  it. Each try has its own Pod name (``<run>``, then ``<run>-r1``...) and the run's status
  says which try is current and when it starts (``try``, ``nextTryTime``), written before
  its Pod is launched: a backup taking the run over during a backoff launches that try at
  that time, and one that finds the try's Pod adopts it. A try's Pod is launched only once
  the Pod before it has failed: never two live Pods of a run.
* A Pod that stays Pending says why on the run (``status.reason``, condition PodPending, an
  Event); past the job's ``pendingTimeout`` it is deleted and the run fails, not retried.
* Anything else that ends this handler early (the API server or the store not answering,
  being fenced) ends the attempt as interrupted, never as a success or a failure: the next
  attempt picks up from the Pods, which are the record of what really ran.
* On shutdown the Pod is left running and the run handed over; a backup adopts it.
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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from ..engine import Overlap, RunCancelled, RunContext, RunFailed, RunGivenUp, RunInterrupted, RunSkipped, RunState
from ..engine.attempt import ENDED, FENCED, REPLACED, SHUTDOWN
from ..engine.durations import format_duration
from . import runs
from .client import ApiException, Kube, in_background, transient
from .constants import RUN_KIND
from .events import EventPoster
from .pods import (
    PodFate,
    PodView,
    Waiting,
    build_pod,
    create_pod,
    delete_pod,
    fate_of,
    follow_pod,
    follower_of,
    pending_for_s,
    pods_of_run,
    read_pod,
    run_of,
    running_for_s,
    try_of,
    waiting_of,
)
from .podwatch import PodChange, PodWatch, interest_in, wait_for_change
from .runcache import CancelWake
from .spec import JobSpec, pod_name, run_name
from .watching import uid_of

log = logging.getLogger("anarchon.kube.runner")

#: The phase of a cancelled run, and the reason of its Events.
CANCELLED = str(RunState.CANCELLED)


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


@dataclass
class _Label:
    """What one follow of a Pod saw of its follower label: ours at some look, and gone from us since."""

    ours: bool = False
    lost: bool = False


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
        self.kube = kube
        self.events = events
        self.spec = spec
        self.on_change = on_change
        self.pod_watch = pod_watch
        self.on_launch = on_launch  # called once a Pod was created (metrics)
        self.wrote = wrote  # told each run object we created or wrote (the run cache)
        self.runs_of = runs_of  # a job's run objects as the run cache has them (None: not live)
        self.store_shared = store_shared  # False while the store is found not shared (see .sharing)
        self.cancels = cancels  # a run's cancel, as the run cache's watch brings it (see RunCache.cancels)
        self.poll_s = poll_s  # how often a Pod is read when no watch wakes us
        self.resync_s = resync_s  # ... and when one does: a missed event only delays an outcome
        #: Each running attempt's run object as last created or written (by run name).
        self._in_hand: dict[str, runs.InHand] = {}
        #: Each running attempt's cancel: set once its run's object asks for one (by run name).
        self._wakes: dict[str, CancelWake] = {}

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
        trigger = str(ctx.cause) if ctx.cause is not None else runs.trigger_guess(spec, ctx.slot)
        name = run_name(spec.name, ctx.slot)
        with self._cancel_of(spec.namespace, name) as wake:
            self._wakes[name] = wake
            try:
                run = await runs.ensure_run(self.kube, spec, ctx.slot, trigger)
                self._noted(run)
                self._in_hand[name] = runs.InHand(run)
                status: runs.Status = dict(run.get("status") or {})
                await _number_after_record(ctx, status)
                if runs.ended(status):
                    _end_as_recorded(ctx, status)
                    return
                await self._attempt_with(ctx, spec, name, run, status)
            finally:
                self._in_hand.pop(name, None)
                self._wakes.pop(name, None)

    def _cancel_of(self, namespace: str, name: str) -> contextlib.AbstractContextManager[CancelWake]:
        """The run's cancel while the attempt runs: the run cache's, or one only the run's own reads set."""
        return contextlib.nullcontext(CancelWake()) if self.cancels is None else self.cancels(namespace, name)

    async def _attempt_with(
        self, ctx: RunContext, spec: JobSpec, name: str, run: dict[str, Any], status: runs.Status
    ) -> None:
        run_uid = uid_of(run)
        for old in ctx.replaced:
            await self._replace(spec, run_name(spec.name, old.slot), name)
        if not status and spec.options.overlap in (Overlap.SKIP, Overlap.REPLACE):
            await self._overlap_in_kubernetes(ctx, spec, name)
        try_number, existing = await self._current_try(ctx, spec, name, status)
        next_try_at = runs.next_try_time(status, try_number)
        if not any(v.fate is not PodFate.LOST for v in existing):  # nothing to adopt: this attempt launches
            if self._wakes[name].is_set():
                await self._cancelled(ctx, spec, name)  # before its Pod, or after it was stopped
            if runs.try_past_deadline(status, try_number, spec.timeout_ms, datetime.now(UTC)):
                # Its Pod was deleted for its deadline by a runner that did not live to record it.
                await self._fail(ctx, spec, name, _past_timeout(spec), runs.DEADLINE_EXCEEDED)
            # maxAttempts bounds launches of the workload: a takeover that adopts the live Pod is free.
            if (launched := runs.launches_before(status, ctx.attempt, pod_name(name, try_number))) >= spec.max_attempts:
                await self._give_up(ctx, spec, name, status, launched)
        while True:
            # Watched from before its launch, a Pod needs no read after it: its create's reply is
            # its state then, and every change since reaches ``since``.
            with interest_in(self.pod_watch, spec.namespace, pod_name(name, try_number)) as since:
                view, new = await self._adopt_or_launch(ctx, spec, name, run_uid, try_number, existing, next_try_at)
                await self._changed(spec, ended=False)
                try:
                    failed = await self._follow(ctx, spec, name, view, try_number, since if new else None)
                finally:
                    with contextlib.suppress(Exception):
                        await self._changed(spec, ended=True)
            if failed is None:
                return
            if self._wakes[name].is_set():
                await self._cancelled(ctx, spec, name, failed=failed)  # no retry
            next_try_at = await self._try_failed(ctx, spec, name, try_number, failed)
            try_number, existing = try_number + 1, []

    async def _give_up(self, ctx: RunContext, spec: JobSpec, name: str, status: runs.Status, launched: int) -> None:
        """The run's Pod is lost and was launched as often as maxAttempts allows: the run ends Interrupted."""
        why = str(status.get("message") or "its Pod was lost")
        message = f"gave up: its Pod was launched {launched} times (maxAttempts {spec.max_attempts}): {why}"
        await self._end(ctx, spec, name, "Interrupted", message, final=True)
        await self.events.about(spec, reason="RunInterrupted", warning=True, message=f"run {name}: {message}")
        raise RunGivenUp(message)

    async def _overlap_in_kubernetes(self, ctx: RunContext, spec: JobSpec, name: str) -> None:
        """Overlap Skip and Replace by what runs, not only by what the store remembers.

        A store that lost its state (or a run it ended while its Pod lived on) lets a new slot be
        claimed beside a live Pod of an earlier run. Skip then ends this run Skipped; Replace
        ends the earlier run first, as it does for the runs the store names.
        """
        live = await self._live_of_other_runs(spec, name)
        if not live:
            return
        if spec.options.overlap is Overlap.REPLACE:
            for other in sorted({run for run, _ in live}):
                await self._replace(spec, other, name)
            return
        other, pod = live[0]
        message = f"skipped: the run {other} is still active (its Pod {pod} is live)"
        await _confirm(ctx)
        await self._write(ctx, spec, name, lambda s: runs.skipped(s, message=message, instance=ctx.instance))
        await self.events.about(spec, reason="Skipped", message=f"run {name}: {message}")
        raise RunSkipped(message)

    async def _live_of_other_runs(self, spec: JobSpec, name: str) -> list[tuple[str, str]]:
        """Live Pods of the job's other runs, as (run, Pod): those of the runs whose object is open
        (most often none: no request), from the run cache when it is live, else one LIST of runs."""
        objects = self.runs_of(spec.namespace, spec.name) if self.runs_of is not None else None
        if objects is None:
            objects = await runs.list_runs(self.kube, spec.namespace, spec.name)
        pods = []
        for obj in objects:
            other = str(obj["metadata"]["name"])
            if other != name and not runs.ended(obj.get("status") or {}):
                pods += await pods_of_run(self.kube, spec.namespace, other)
        live = (PodFate.LIVE, PodFate.LINGERING)
        return [(run_of(p), fate_of(p).name) for p in pods if run_of(p) != name and fate_of(p).fate in live]

    async def _changed(self, spec: JobSpec, *, ended: bool) -> None:
        if self.on_change is not None:
            try:
                await self.on_change(spec, ended)
            except Exception as exc:
                log.warning("status refresh of %s failed: %s", spec.engine_name, exc)

    async def _adopt_or_launch(
        self,
        ctx: RunContext,
        spec: JobSpec,
        name: str,
        run_uid: str,
        try_number: int,
        existing: list[PodView],
        next_try_at: datetime | None,
    ) -> tuple[PodView, bool]:
        """Adopt the Pod of the current try, or launch it (after its backoff, if it waits one).

        The Pod's view, and whether it was launched (read by its create, not before).
        """
        keep = next((v for v in reversed(existing) if v.fate is not PodFate.LOST), None)
        if keep is not None:
            await _confirm(ctx)
            if keep.fate not in (PodFate.SUCCEEDED, PodFate.FAILED):
                # A Pod that already ended only gives the run its outcome: the run is not
                # reopened as Running on the way (it may already say how it ended).
                await self._start_attempt(ctx, spec, name, keep.name, try_number, adopted=True)
            await self.events.about(
                spec,
                reason="Adopted",
                message=f"run {name} attempt {ctx.attempt} on {ctx.instance} adopted Pod {keep.name} ({keep.message})",
            )
            return keep, False
        if next_try_at is not None:
            await self._back_off(ctx, spec, name, try_number, next_try_at)
        if self._wakes[name].is_set():
            await self._cancelled(ctx, spec, name)
        await _confirm(ctx)
        pod = pod_name(name, try_number)
        for lost in existing:
            # Lost Pods are terminal (evicted, their node shut down): nothing of them runs.
            await delete_pod(self.kube, spec.namespace, lost.name, grace_seconds=0)
        await self._start_attempt(ctx, spec, name, pod, try_number)
        body = build_pod(
            spec,
            run=name,
            pod=pod,
            slot=ctx.slot,
            attempt=ctx.attempt,
            try_number=try_number,
            instance=ctx.instance,
            run_uid=run_uid or None,
        )
        while True:
            created, new = await create_pod(self.kube, body)
            if new or fate_of(created).fate is not PodFate.LOST:
                break
            # The lost Pod deleted above is not gone yet and holds the try's one name.
            await self._until_gone(ctx, spec, pod)
        # AlreadyExists is our own create whose reply was lost, or another attempt's Pod (a
        # backup launched while we were frozen before our create): either way it is the try's
        # one Pod, never a second. Now that it exists, check that we still hold the run.
        if not await ctx.confirm():
            await self._fenced_after_launch(ctx, spec, name, pod, new)
            raise _fenced(ctx)
        if new and self.on_launch is not None:
            self.on_launch(ctx)
        tried = f" try {try_number}" if try_number > 1 else ""
        await self.events.about(
            spec,
            reason="Launched",
            message=f"run {name} attempt {ctx.attempt}{tried} on {ctx.instance}: Pod {pod}",
        )
        return fate_of(created), True

    async def _current_try(
        self, ctx: RunContext, spec: JobSpec, name: str, status: runs.Status
    ) -> tuple[int, list[PodView]]:
        """The try this attempt takes up, and that try's Pods.

        The run's status says which try is current (written before a retry's Pod is
        launched), and so do the Pods (each carries its try): whichever is further wins, so a
        status write lost with its runner never sends the run back to a try that already ran.
        A run whose object has no status yet has no Pod: an attempt writes the run's status
        before it launches a Pod, so it is the first try and nothing is read (the create finds a
        Pod left by an earlier object of the same name, being collected with it). Attempt 1 of
        a run that has a status (its object outlived the store's record of the run) reads its
        first try's Pod, one GET. A later attempt lists the run's Pods by label (the listing
        also finds a Pod that an earlier version named per attempt, ``<run>-a<N>``, as try 1);
        a LIST costs the API server a scan of the namespace's Pods, and most runs never need it.
        """
        if ctx.attempt == 1 and not status:
            return 1, []
        if ctx.attempt == 1:
            pod = await read_pod(self.kube, spec.namespace, pod_name(name))
            return 1, [] if pod is None else [fate_of(pod)]
        pods = await pods_of_run(self.kube, spec.namespace, name)
        current = max([int(status.get("try") or 1), *(try_of(p) for p in pods)])
        return current, [fate_of(p) for p in pods if try_of(p) == current]

    async def _try_failed(self, ctx: RunContext, spec: JobSpec, name: str, try_number: int, view: PodView) -> datetime:
        """Try ``try_number`` failed and another follows: the run says which and when, before it waits."""
        wait_ms = spec.retries.backoff_after_ms(try_number)
        # Whole seconds, as the run's status has it, rounded up: no runner starts the try early.
        at = datetime.now(UTC) + timedelta(milliseconds=wait_ms)
        at = at.replace(microsecond=0) + timedelta(seconds=1 if at.microsecond else 0)
        following = pod_name(name, try_number + 1)
        await self._write(
            ctx,
            spec,
            name,
            lambda s: runs.try_failed(
                s, try_number=try_number, message=view.message, next_try_at=at, next_pod=following
            ),
        )
        await self.events.about(
            spec,
            reason="TryFailed",
            warning=True,
            message=(
                f"run {name} try {try_number} of {spec.retries.max_tries} failed: {view.message};"
                f" try {try_number + 1} (Pod {following}) in {format_duration(wait_ms)}"
            ),
        )
        return at

    async def _back_off(self, ctx: RunContext, spec: JobSpec, name: str, try_number: int, at: datetime) -> None:
        """Wait until try ``try_number`` may start, holding the run (heartbeating its lease) all along.

        The timeout does not count meanwhile (it bounds a try, and a backoff is no work); it
        starts anew with the try. Stopped meanwhile, there is no Pod to leave or delete: on
        shutdown a backup launches the try at the same time; replaced, the run just ends.
        """
        ctx.set_alive(True)
        wake = self._wakes[name]
        while (left_s := (at - datetime.now(UTC)).total_seconds()) > 0 and not ctx.stop.is_set() and not wake.is_set():
            waits = {asyncio.ensure_future(ctx.stop.wait()), asyncio.ensure_future(wake.wait())}
            try:
                await asyncio.wait(waits, timeout=left_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        if ctx.stop.is_set():
            if ctx.stop_reason == SHUTDOWN:
                raise RunInterrupted(f"{ctx.instance} stopping in the backoff: a backup launches try {try_number}")
            if ctx.stop_reason == REPLACED:
                await end_replaced(self.kube, spec.namespace, name, [], "replaced by a newer run (overlap Replace)")
                raise RunInterrupted(f"replaced in the backoff before try {try_number}")
            raise _fenced(ctx)

    async def _fenced_after_launch(self, ctx: RunContext, spec: JobSpec, name: str, pod: str, new: bool) -> None:
        """Fenced with the run's Pod just created (frozen past the lease between check and create).

        If another attempt holds the run, the Pod is left to it: it adopts the run's one Pod.
        If the run is over in the store, nobody would follow a Pod we started: it goes.
        """
        if ctx.stop_reason == REPLACED:
            await end_replaced(self.kube, spec.namespace, name, [pod], "replaced by a newer run (overlap Replace)")
        elif ctx.stop_reason == ENDED and new:
            log.warning("%s attempt %d: the run ended while it launched: deleting its Pod %s", name, ctx.attempt, pod)
            await delete_pod(self.kube, spec.namespace, pod, grace_seconds=0)
        else:
            log.warning("%s attempt %d fenced while launching: Pod %s left to the holder", name, ctx.attempt, pod)

    async def _until_gone(self, ctx: RunContext, spec: JobSpec, pod: str) -> None:
        while True:
            with interest_in(self.pod_watch, spec.namespace, pod) as changed:
                if (lost := await read_pod(self.kube, spec.namespace, pod)) is None:
                    return
                # The lost Pod may be another replica's to watch: then its deletion is polled for.
                await self._wait(ctx, changed if self.pod_watch is None or self.pod_watch.covers(lost) else None)
            if ctx.stop.is_set():
                raise _fenced(ctx) if ctx.stop_reason != SHUTDOWN else RunInterrupted(f"{ctx.instance} stopping")

    async def _start_attempt(
        self, ctx: RunContext, spec: JobSpec, name: str, pod: str, try_number: int, *, adopted: bool = False
    ) -> None:
        try:
            await self._write(
                ctx,
                spec,
                name,
                lambda s: runs.start_attempt(
                    s, attempt=ctx.attempt, instance=ctx.instance, pod=pod, try_number=try_number, adopted=adopted
                ),
            )
        except runs.RunEnded as exc:
            # Replaced or given up while this attempt was held up: nothing to launch or follow.
            raise RunInterrupted(f"attempt {ctx.attempt}: {exc}") from None

    async def _write(
        self, ctx: RunContext, spec: JobSpec, name: str, change: Callable[[runs.Status], runs.Status | None]
    ) -> None:
        """Write the run's status for this attempt; a refusal ends the attempt (a later one owns the run)."""
        in_hand = self._in_hand.setdefault(name, runs.InHand())
        if not await runs.update_status(self.kube, spec.namespace, name, ctx.attempt, change, in_hand=in_hand):
            raise RunInterrupted(f"attempt {ctx.attempt}: the run {name} is owned by a later attempt, or gone")
        if in_hand.body is not None:
            self._noted(in_hand.body)

    def _noted(self, run: dict[str, Any]) -> None:
        """Our own read or write of the run's object: the run cache keeps it, and a cancel on it counts."""
        if self.wrote is not None:
            self.wrote(run)
        if (wake := self._wakes.get(str((run.get("metadata") or {}).get("name")))) is not None:
            wake.asked(run)

    async def _follow(
        self, ctx: RunContext, spec: JobSpec, name: str, view: PodView, try_number: int, since: PodChange | None
    ) -> PodView | None:
        """Follow the try's Pod to its end; the Pod's view if it failed and another try follows.

        ``since`` holds the Pod's changes since ``view`` was read, if the watch was told to
        keep them (None: ``view`` may be stale, the Pod is read first).
        """
        pod = view.name
        shown: str | None = None  # the reason the run shows for its Pending Pod, if any
        woke = since  # what woke us last, with the Pod if the watch delivered it
        current = since is not None and not since.is_set()  # ``view`` is the Pod as it is
        # Woken by the clock while the watch was up (nothing changed, most likely): that read
        # is background work, behind the requests that launch runs and write their ends. At
        # 3,000 jobs a minute these reads were 6 per run, of runs kept waiting by the backlog.
        resync = False
        past_deadline = False  # the Pod ran past the job's timeout: it was deleted, and is followed to its end
        label = _Label()  # whether the Pod's follower label was ours, and left us since
        cancel = self._wakes[name]
        while True:
            if ctx.stop.is_set():
                await self._stopped(ctx, spec, name, pod)
                return None
            with interest_in(self.pod_watch, spec.namespace, pod) as changed:  # before the read: no change slips by
                try:
                    if current:
                        current = False  # nothing changed since ``view``: no read
                    elif woke is not None and woke.delivered and woke.uid == uid_of(view.body):
                        view = fate_of(woke.pod)  # the watch's copy: no read
                    elif resync:
                        view = fate_of(await in_background(read_pod(self.kube, spec.namespace, pod)))
                    else:
                        view = fate_of(await read_pod(self.kube, spec.namespace, pod))
                except ApiException as exc:
                    log.warning("reading Pod %s/%s failed: %s", spec.namespace, pod, exc.reason)
                    woke = None
                    await self._wait(ctx, None)
                    continue
                if view.fate is PodFate.LIVE and cancel.is_set():
                    await self._stop_for_cancel(ctx, spec, view)
                    woke, resync = None, False  # read it again: being deleted, gone, or changed meanwhile
                    continue
                if view.fate in (PodFate.LIVE, PodFate.LINGERING):
                    # A lingering Pod may still run: the lease is kept, so nobody launches beside it.
                    ctx.set_alive(True)
                    covered = await self._covered(ctx, spec, view, label)
                    shown, left_s = await self._pending(ctx, spec, name, view, shown)
                    deadline_s = await self._deadline(ctx, spec, name, view)
                    past_deadline = past_deadline or deadline_s == 0
                    if deadline_s:
                        left_s = deadline_s if left_s is None else min(left_s, deadline_s)
                    watched = covered and self.pod_watch is not None and self.pod_watch.healthy
                    # A cancel wakes us while the Pod lives (also one that came during the calls
                    # above: the wait returns at once); once it is being deleted, its end does.
                    wake = cancel if view.fate is PodFate.LIVE else None
                    await self._wait(ctx, changed if covered else None, at_most_s=left_s, wake=wake)
                    woke = changed if changed is not None and changed.is_set() else None
                    resync = woke is None and watched and self.pod_watch is not None and self.pod_watch.healthy
                    resync = resync and not cancel.is_set()  # a cancel's read is no background work
                    continue
            # A Pod that ended being deleted, on a cancelled run, was stopped for the cancel (by
            # us, or by an attempt before us); one that ended on its own first keeps its outcome.
            ended = view.fate in (PodFate.SUCCEEDED, PodFate.FAILED)
            stopped = cancel.is_set() and (not ended or _being_deleted(view))
            if view.fate is PodFate.SUCCEEDED and not stopped:
                await self._end(ctx, spec, name, "Succeeded", view.message, final=True)
                return None
            if stopped:
                if view.fate is PodFate.LOST:
                    await delete_pod(self.kube, spec.namespace, pod, grace_seconds=0)
                await self._cancelled(ctx, spec, name)
            if past_deadline:
                # Deleted for its deadline (by us, or by an attempt before us), and not succeeded first: it failed.
                view = PodView(pod, PodFate.FAILED, _past_timeout(spec), view.body)
            if view.fate is PodFate.FAILED:
                # A try that ran past its deadline is not retried: it would most likely hang again.
                deadline = past_deadline or _deadline_exceeded(view)
                if spec.retries.may_retry(try_number) and not deadline:
                    return view
                message = view.message if try_number == 1 else f"failed after {try_number} tries: {view.message}"
                await self._fail(ctx, spec, name, message, runs.DEADLINE_EXCEEDED if deadline else None)
            # Lost or gone: this attempt is over, the next one relaunches.
            ctx.set_alive(False)
            if view.fate is PodFate.LOST:
                await delete_pod(self.kube, spec.namespace, pod, grace_seconds=0)
            await self._end(ctx, spec, name, "Interrupted", f"Pod {pod}: {view.message}", final=False)
            await self.events.about(
                spec,
                reason="PodLost",
                warning=True,
                message=f"run {name} attempt {ctx.attempt}: Pod {pod}: {view.message}; the next attempt relaunches it",
            )
            raise RunInterrupted(f"Pod {pod}: {view.message}")

    async def _stop_for_cancel(self, ctx: RunContext, spec: JobSpec, view: PodView) -> None:
        """Delete the run's live Pod for a cancel, with the Pod's own grace period (its template's).

        Conditional on the version read: a Pod that changed meanwhile (it may have ended on its
        own) is not deleted but read again, so that a Pod that Succeeded first gives the run its
        outcome. A repeat (a backup after a runner that died) finds it being deleted already.
        """
        await _confirm(ctx)
        version = str(((view.body or {}).get("metadata") or {}).get("resourceVersion") or "")
        if await delete_pod(self.kube, spec.namespace, view.name, if_version=version or None):
            log.info("Pod %s/%s deleted for a cancel of its run", spec.namespace, view.name)

    async def _cancelled(self, ctx: RunContext, spec: JobSpec, name: str, failed: PodView | None = None) -> NoReturn:
        """End the run Cancelled, its Pod stopped or never launched: the run's object says who asked
        and why, an Event on the run and on the job, and the engine ends it for good (no backup
        takes it over). ``failed``: the try's Pod had failed on its own first, and is not retried."""
        message = (self._wakes[name].cancel or runs.Cancel("")).message
        failed_try = None if failed is None else failed.message
        await self._end(ctx, spec, name, CANCELLED, message, final=True, failed_try=failed_try)
        held = self._in_hand[name].body
        await self.events.post(
            namespace=spec.namespace, name=name, uid=uid_of(held), reason=CANCELLED, message=message, kind=RUN_KIND
        )
        await self.events.about(spec, reason=CANCELLED, message=f"run {name}: {message}")
        raise RunCancelled(message)

    async def _fail(self, ctx: RunContext, spec: JobSpec, name: str, message: str, reason: str | None) -> None:
        """The run failed (its last try's Pod did): the object says so, an Event, the engine is told."""
        await self._end(ctx, spec, name, "Failed", message, final=True, reason=reason)
        await self.events.about(spec, reason="RunFailed", warning=True, message=f"run {name}: {message}")
        raise RunFailed(message)

    async def _deadline(self, ctx: RunContext, spec: JobSpec, name: str, view: PodView) -> float | None:
        """Seconds until the try's Pod reaches the job's timeout (None: no bound, or not started).

        At the deadline the Pod is deleted, with its own grace period, and 0 returned: the run
        then follows it until it has stopped (Succeeded if it did first, else Failed). The
        kubelet enforces the Pod's activeDeadlineSeconds too, but not every node does (one cut
        off from the API server runs it on), and a run written Failed beside a Pod that goes
        on is a lie.
        """
        if spec.timeout_ms is None:
            return None
        ran_s = running_for_s(view.body, datetime.now(UTC))
        if ran_s is None:
            return None
        if (left_s := spec.timeout_ms / 1000 - ran_s) > 0:
            return left_s
        if view.fate is PodFate.LIVE:
            await _confirm(ctx)
            await delete_pod(self.kube, spec.namespace, view.name)
            message = f"run {name}: Pod {view.name} ran past timeout ({format_duration(spec.timeout_ms)}): deleting it"
            await self.events.about(spec, reason=runs.DEADLINE_EXCEEDED, warning=True, message=message)
        return 0.0

    async def _covered(self, ctx: RunContext, spec: JobSpec, view: PodView, label: _Label) -> bool:
        """Whether our Pod watch delivers the Pod's changes; if it does not (an adopted Pod carries
        the launching replica's follower label), label the Pod as ours first.

        The label moves only while this attempt holds the run: a stale runner taking it back
        would leave the holder's watch blind. A failed relabel is tried again at the next look;
        until then the Pod is polled, so a failed call only makes the outcome seen later.

        Once ours, the label is never taken back: if it leaves us while this attempt holds the
        run, another replica follows the Pod as its holder too, which one shared store never
        allows (replicas on stores of their own each win every run: see :mod:`.sharing`). Taking
        it back each time was a war: three such replicas made 1,293 events of one Pod in 10 s.
        The Pod is polled instead; and once the store is known not to be shared, no label is
        moved at all.
        """
        watch = self.pod_watch
        if watch is None or watch.follower is None:
            return True
        if watch.covers(view.body):
            label.ours = True
            return True
        if self.store_shared is not None and not self.store_shared():
            return False
        if label.ours:
            if not label.lost:
                label.lost = True
                log.warning(
                    "Pod %s/%s is now followed by %s while attempt %d here holds its run: polling it"
                    " (do the replicas share one store?)",
                    spec.namespace,
                    view.name,
                    follower_of(view.body),
                    ctx.attempt,
                )
            return False
        await _confirm(ctx)
        try:
            # The relabel is an event of our watch: it wakes the interest registered before the read.
            label.ours = await follow_pod(self.kube, spec.namespace, view.name, watch.follower) is not None
        except Exception as exc:
            log.warning("labelling Pod %s/%s as followed here failed (%s): polling it", spec.namespace, view.name, exc)
            return False
        return label.ours

    async def _pending(
        self, ctx: RunContext, spec: JobSpec, name: str, view: PodView, shown: str | None
    ) -> tuple[str | None, float | None]:
        """Say why the attempt's Pod is Pending (run status and condition, an Event); end the run
        once it has been Pending for ``pendingTimeout``.

        Returns the reason the run now shows, and the seconds left until ``pendingTimeout``
        (None: no bound applies), so the caller looks again by then.
        """
        waiting = waiting_of(view.body) if view.fate is PodFate.LIVE else None
        if waiting is not None and waiting.reason != shown:
            message = f"Pod {view.name} is Pending: {waiting.reason}: {waiting.message}"
            await self._write(
                ctx,
                spec,
                name,
                lambda s: runs.pod_pending(s, attempt=ctx.attempt, reason=waiting.reason, message=message),
            )
            await self.events.about(spec, reason=runs.POD_PENDING, warning=True, message=f"run {name}: {message}")
            shown = waiting.reason
        elif waiting is None and shown is not None and view.fate is PodFate.LIVE:
            started = f"Pod {view.name}: {view.message}"
            await self._write(ctx, spec, name, lambda s: runs.pod_started(s, attempt=ctx.attempt, message=started))
            shown = None
        bound_ms = spec.pending_timeout_ms
        pending_s = pending_for_s(view.body, datetime.now(UTC)) if view.fate is PodFate.LIVE else None
        if bound_ms is None or pending_s is None:
            return shown, None
        left_s = bound_ms / 1000 - pending_s
        if left_s > 0:
            return shown, left_s
        await self._pending_timeout(ctx, spec, name, view, waiting)
        return shown, 0.0  # the Pod changed before it could be deleted (it may have started): look again

    async def _pending_timeout(
        self, ctx: RunContext, spec: JobSpec, name: str, view: PodView, waiting: Waiting | None
    ) -> None:
        """The Pod stayed Pending past ``pendingTimeout``: delete it and fail the run (no retry: a
        new Pod would most likely wait the same). Returns only if the Pod changed meanwhile."""
        await _confirm(ctx)
        version = str(((view.body or {}).get("metadata") or {}).get("resourceVersion") or "")
        if not await delete_pod(self.kube, spec.namespace, view.name, if_version=version or None):
            return
        bound = format_duration(spec.pending_timeout_ms or 0)
        why = f": {waiting.reason}: {waiting.message}" if waiting is not None else ""
        message = f"Pod {view.name} stayed Pending longer than pendingTimeout ({bound}){why}"
        await self._end(ctx, spec, name, "Failed", message, final=True, reason=runs.PENDING_TIMEOUT)
        await self.events.about(spec, reason=runs.PENDING_TIMEOUT, warning=True, message=f"run {name}: {message}")
        raise RunFailed(message)

    async def _stopped(self, ctx: RunContext, spec: JobSpec, name: str, pod: str) -> None:
        if ctx.stop_reason == SHUTDOWN:
            raise RunInterrupted(f"{ctx.instance} stopping: Pod {pod} left running for a backup to adopt")
        if ctx.stop_reason == REPLACED:
            why = "replaced by a newer run (overlap Replace)"
            ended = await end_replaced(self.kube, spec.namespace, name, [pod], why)
            raise RunInterrupted(f"replaced: Pod {pod} {ended or 'deleted'}")
        log.warning("%s attempt %d fenced (%s): leaving Pod %s alone", name, ctx.attempt, ctx.stop_reason, pod)
        raise _fenced(ctx)

    async def _end(
        self,
        ctx: RunContext,
        spec: JobSpec,
        name: str,
        outcome: str,
        message: str,
        *,
        final: bool,
        reason: str | None = None,
        failed_try: str | None = None,
    ) -> None:
        await _confirm(ctx)
        await self._write(
            ctx,
            spec,
            name,
            lambda s: runs.end_attempt(
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

    async def _wait(
        self,
        ctx: RunContext,
        changed: asyncio.Event | None,
        *,
        at_most_s: float | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        poll_s, resync_s = self.poll_s, self.resync_s
        if at_most_s is not None:
            poll_s, resync_s = min(poll_s, at_most_s), min(resync_s, at_most_s)
        await wait_for_change(self.pod_watch, changed, ctx.stop, poll_s=poll_s, resync_s=resync_s, wake=wake)

    async def _replace(self, spec: JobSpec, old: str, new: str) -> None:
        """Overlap Replace, by the new run's winner: the older run's Pods go, its object says why.

        The older run's own runner does the same when the store tells it it was replaced, so
        neither dying half-way leaves the old Pod running. Best effort here: the new run
        does not fail because the old one could not be cleaned up.
        """
        message = f"replaced by the run of {new}"
        try:
            pods = [p["metadata"]["name"] for p in await pods_of_run(self.kube, spec.namespace, old)]
            await end_replaced(self.kube, spec.namespace, old, pods, message)
        except Exception as exc:
            log.warning("cleaning up %s, replaced by %s, failed: %s", old, new, exc)
            return
        await self.events.about(spec, reason="Replaced", message=f"run {old} {message}")


async def end_replaced(kube: Kube, namespace: str, name: str, pods: list[str], message: str) -> str | None:
    """The run was replaced (final in the store): its live Pods go, its object says how it ended.

    A Pod that already ended keeps its outcome: the run is then Succeeded or Failed, as its
    Pod was (the newest Pod, of the run's current try: ``pods`` come oldest try first). Each
    delete is conditional on the version of the Pod we read, so a Pod that ends between our
    read and our delete is not taken for interrupted; and it has no grace period, so the Pod
    cannot go on to end Succeeded after its run was recorded Interrupted (the kubelet still
    stops its containers with SIGTERM, then SIGKILL). Returns the Pod's outcome, if one
    ended. Safe to repeat, and to run on several replicas at once.
    """
    last: PodView | None = None  # how the newest of them (the current try's) had ended, if it had
    for pod in pods:
        last = await _stop_pod(kube, namespace, pod)
    tried = 0 if last is None else try_of(last.body or {})

    def change(s: runs.Status) -> runs.Status | None:
        # An earlier try's failed Pod is not the run's outcome: a run replaced while it waited
        # out a backoff (its next try had no Pod yet) was interrupted, not failed.
        if last is None or tried < int(s.get("try") or 1):
            return runs.interrupted(s, message=message)
        why = f"{last.message} (then replaced by a newer run)"
        return runs.end_attempt(s, attempt=int(s.get("attempt") or 1), outcome=str(last.fate), message=why, final=True)

    # Whatever attempt wrote last: the store has already ended the run.
    await runs.update_status(kube, namespace, name, 10**6, change)
    return None if last is None else str(last.fate)


async def _stop_pod(kube: Kube, namespace: str, pod: str) -> PodView | None:
    """Delete a live Pod of a replaced run; the Pod's view if it had ended instead."""
    while True:
        view = fate_of(await read_pod(kube, namespace, pod))
        if view.fate in (PodFate.SUCCEEDED, PodFate.FAILED):
            return view
        if view.body is None:
            return None
        version = str((view.body.get("metadata") or {}).get("resourceVersion") or "")
        if await delete_pod(kube, namespace, pod, grace_seconds=0, if_version=version or None):
            return None


def _past_timeout(spec: JobSpec) -> str:
    return f"the Pod ran past timeout ({format_duration(spec.timeout_ms or 0)}) and was stopped"


def _being_deleted(view: PodView) -> bool:
    """The Pod was asked to go (it has a deletionTimestamp), whatever phase it ended in since."""
    return bool(((view.body or {}).get("metadata") or {}).get("deletionTimestamp"))


def _deadline_exceeded(view: PodView) -> bool:
    """The Pod ran past its activeDeadlineSeconds (the job's timeout), rather than exiting non-zero."""
    return str(((view.body or {}).get("status") or {}).get("reason") or "") == "DeadlineExceeded"


async def _number_after_record(ctx: RunContext, status: runs.Status) -> None:
    """Number the attempt after the last one the run's object records, if the store counts fewer.

    Only a store that lost its state counts fewer (it numbers a run it claims again from 1): a
    runner of a later attempt would hold the run, and the heartbeat here would fail. Without
    this the object's attempt guard refuses every write of the new attempts, and the run stays
    Running for ever.
    """
    recorded = int(status.get("attempt") or 0)
    if recorded < ctx.attempt:
        return
    await _confirm(ctx)
    log.warning(
        "%s@%s: the store counts attempt %d, the run's object %d already: this is attempt %d",
        ctx.job,
        ctx.slot,
        ctx.attempt,
        recorded,
        recorded + 1,
    )
    ctx.continue_after(recorded)


def _end_as_recorded(ctx: RunContext, status: runs.Status) -> None:
    """The run's object says how the run ended, and the store still has it open (it lost the
    end, or claimed the run anew): the store ends it the same way. Returns for Succeeded."""
    phase, message = status.get("phase"), str(status.get("message") or "")
    log.warning("%s@%s: the run's object says %s; the store had it open", ctx.job, ctx.slot, phase)
    if phase == "Failed":
        raise RunFailed(message or "failed")
    if phase == "Skipped":
        raise RunSkipped(message or "skipped")
    if phase == CANCELLED:
        raise RunCancelled(message or "cancelled")
    if phase == "Interrupted":
        raise RunGivenUp(message or "interrupted")


async def _confirm(ctx: RunContext) -> None:
    """Go on only while this attempt holds the run (a heartbeat that must succeed)."""
    if not await ctx.confirm():
        raise _fenced(ctx)


def _fenced(ctx: RunContext) -> RunInterrupted:
    # The engine writes nothing for a fenced attempt; raising (not returning) keeps a fenced
    # handler from ever looking like a success.
    return RunInterrupted(f"attempt {ctx.attempt} fenced ({ctx.stop_reason or FENCED}): another attempt holds the run")
