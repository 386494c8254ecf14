"""Running one attempt under a lease: the handler, its heartbeats, its timeout and its end.

This is the lease logic of the runner side. While the handler runs and says it is alive,
the lease is pushed forward every heartbeat. Whatever happens, exactly one of these ends
the attempt in the store, always with the attempt's own token:

* handler returns → ``finish(Succeeded)``; raises → ``finish(Failed)`` (RunGivenUp:
  ``finish(Interrupted)``, RunSkipped: ``finish(Skipped)``, RunCancelled: ``finish(Cancelled)``);
* timeout (of the current try, see ``RunContext.restart_timeout``) → the handler is told to
  stop, then cancelled, ``finish(Failed)``;
* handler raises RunInterrupted, or the instance stops → ``release`` (next attempt at once);
* the store rejects our token (a backup took over, or Replace) → fenced: nothing is written,
  the handler is told to stop and then cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .backend import ClaimRequest, LeaseStore
from .clock import Clock, timer
from .durations import format_duration
from .errors import (
    RunCancelled,
    RunFailed,
    RunGivenUp,
    RunInterrupted,
    RunSkipped,
    StoreError,
    StoreLostState,
    is_store_error,
)
from .events import EngineListener
from .job import Handler, ResolvedOptions, RunContext
from .model import HANDED_OVER, REPLACED_BY, Overlap, RunState, token_hash
from .retry import retry

log = logging.getLogger("anarchon.engine.attempt")

FENCED = "fenced"
TIMEOUT = "timeout"
SHUTDOWN = "shutdown"
LEASE_LOST = "lease lost"
#: Fenced because a newer run replaced this one (overlap Replace): the run is over for good,
#: so its runner may clean up after itself (nobody will take the run over).
REPLACED = "replaced"
#: Fenced because the run is over in the store (given up, or ended by another attempt):
#: nobody will take it over, so whatever this attempt just started has nobody to follow it.
ENDED = "ended"


class AttemptRunner:
    """Runs one attempt of one run; create one per attempt."""

    def __init__(
        self,
        backend: LeaseStore,
        handler: Handler,
        ctx: RunContext,
        options: ResolvedOptions,
        clock: Clock,
        listener: EngineListener,
        lease_until_ms: int,
        held: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.backend = backend
        #: While it gives a reason, no heartbeat goes out: the lease runs out for another instance (:attr:`Job.held`).
        self.held = held
        self.handler = handler
        self.ctx = ctx
        self.options = options
        self.clock = clock
        self.listener = listener
        self._lease_until_ms = lease_until_ms
        self._fenced = asyncio.Event()
        #: Set once the attempt's end is being written: no heartbeat may be sent after that.
        self._beats_over = False
        self._beat_task: asyncio.Task[None] | None = None
        #: Since when (clock ms) the timeout counts; None while the handler paused it.
        self._timer_from_ms: int | None = clock.now_ms()
        self._timer_changed = asyncio.Event()
        ctx.confirm = self.confirm
        ctx.pause_timeout = self._pause_timeout
        ctx.restart_timeout = self._restart_timeout

    def _pause_timeout(self) -> None:
        self._timer_from_ms = None
        self._timer_changed.set()

    def _restart_timeout(self) -> None:
        self._timer_from_ms = self.clock.now_ms()
        self._timer_changed.set()

    async def confirm(self) -> bool:
        """Heartbeat now and say whether this attempt still holds the run.

        Handlers call it right before a side effect that must not happen twice (launching a
        Pod, writing a final status): a runner that froze past its lease learns here that it
        was fenced off, before it acts.
        """
        ctx = self.ctx
        if self._fenced.is_set():
            return False
        opts = self.options

        async def beat() -> tuple[bool, int]:
            now = self.clock.now_ms()
            return await self._beat(now), now

        try:
            # A store error is not an answer: try again while the lease we hold lasts.
            ok, now = await retry(
                beat,
                clock=self.clock,
                transient=is_store_error,
                deadline_ms=lambda: self._lease_until_ms,
                on_error=lambda exc, _: self.listener.heartbeat_failed(ctx.job, ctx.slot, str(exc)),
            )
        except StoreError:
            # Past our lease without an answer: a backup may hold the run now. We cannot
            # prove otherwise, so we act as fenced (write nothing, launch nothing).
            self._fence(LEASE_LOST)
            return False
        if ok:
            self._lease_until_ms = now + opts.lease_ms
            return True
        return await self._refused()

    def _fence(self, reason: str) -> None:
        self.ctx.request_stop(reason)
        self._fenced.set()

    async def _refused(self) -> bool:
        """The store refused our token. True if the run is ours again (the store had lost it).

        Otherwise we are fenced; the handler is told whether the run was replaced.
        """
        ctx = self.ctx
        try:
            run = await self.backend.get_run(ctx.job, ctx.slot)
        except StoreError:
            self._fence(FENCED)
            return False
        if run is None and await self._reclaim():
            return True
        if run is None or run.state.active:
            self._fence(FENCED)
        else:
            self._fence(REPLACED if (run.error or "").startswith(REPLACED_BY) else ENDED)
        return False

    async def _reclaim(self) -> bool:
        """Claim again, with our token, a run the store has no record of; True if it is ours.

        A running run is never pruned, so a store without it has lost its state (a Redis
        restart without persistence, a failover to an empty replica). Nobody else holds the
        run then, and its Pod (or whatever the handler started) still runs: fencing ourselves
        would orphan it, with no lease left for a backup to take over. If another instance
        claimed the slot anew meanwhile, the claim is refused and we are fenced after all.
        """
        ctx = self.ctx
        now = self.clock.now_ms()
        request = ClaimRequest(ctx.job, ctx.slot, ctx.instance, ctx.token, now, self.options.lease_ms, Overlap.ALLOW)
        try:
            try:
                result = await self.backend.claim(request)
            except StoreLostState:
                # Told so by this very claim (it was not applied): we are the ones to claim
                # back what we run, at once; new claims wait for us.
                result = await self.backend.claim(request)
        except StoreError:
            return False
        if result.run is None or result.run.token != ctx.token:
            return False
        log.warning(
            "%s@%s: the store had lost this running run; attempt %d claimed it again", ctx.job, ctx.slot, ctx.attempt
        )
        self.listener.store_error("reclaim", ctx.job, f"run {ctx.slot} was missing from the store; claimed again")
        self._lease_until_ms = now + self.options.lease_ms
        return True

    async def run(self) -> RunState | None:
        """Run the attempt to its end; returns the outcome written, or None if fenced/released."""
        ctx = self.ctx
        self.listener.started(ctx.job, ctx.slot, ctx.attempt)
        handler_task = asyncio.create_task(self._call_handler(), name=f"anarchon:{ctx.job}@{ctx.slot}")
        beat_task = asyncio.create_task(self._heartbeats(), name=f"anarchon-heartbeat:{ctx.job}@{ctx.slot}")
        self._beat_task = beat_task
        try:
            return await self._until_end(handler_task)
        finally:
            # Normally nothing is left; if this attempt itself is cancelled (the instance dies
            # without hand-over), the handler and the heartbeats go with it. asyncio.wait, not
            # await: it never swallows a cancellation of this task.
            self._beats_over = True
            beat_task.cancel()
            handler_task.cancel()
            await asyncio.wait({beat_task, handler_task}, timeout=self.options.stop_grace_ms / 1000)

    async def _call_handler(self) -> None:
        await self.handler(self.ctx)

    async def _until_end(self, handler_task: asyncio.Task[None]) -> RunState | None:
        ctx = self.ctx
        fenced_wait = asyncio.create_task(self._fenced.wait())
        stop_wait = asyncio.create_task(ctx.stop.wait())
        try:
            done = await self._until_timeout({handler_task, fenced_wait, stop_wait})
            if handler_task not in done and not self._fenced.is_set() and not ctx.stop.is_set():
                ctx.request_stop(TIMEOUT)
            if handler_task not in done:
                # Give the handler its grace to wind down after a stop request.
                grace = 0 if ctx.stop_reason == FENCED else self.options.stop_grace_ms / 1000
                await asyncio.wait({handler_task}, timeout=grace)
        finally:
            fenced_wait.cancel()
            stop_wait.cancel()
        if not handler_task.done():
            handler_task.cancel()
            await asyncio.wait({handler_task})
        await self._stop_heartbeats()
        if self._fenced.is_set():
            self.listener.fenced(ctx.job, ctx.slot, ctx.attempt, ctx.stop_reason or FENCED)
            return None
        return await self._record_end(handler_task)

    async def _until_timeout(self, waits: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
        """Wait for the first of ``waits``; an empty set if the timeout ran out first.

        The timer follows the handler's pauses and restarts (one timeout per try of the work),
        and the engine's clock, so tests can fast-forward it.
        """
        timeout_ms = self.options.timeout_ms
        while True:
            self._timer_changed.clear()
            changed = asyncio.create_task(self._timer_changed.wait())
            expiry = None
            if timeout_ms is not None and self._timer_from_ms is not None:
                expiry = asyncio.create_task(self.clock.sleep_until(self._timer_from_ms + timeout_ms))
            try:
                done, _ = await asyncio.wait(
                    {*waits, changed, *([expiry] if expiry else [])}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()
                if expiry is not None:
                    expiry.cancel()
            if done & waits:
                return done & waits
            if expiry is not None and expiry in done:
                return set()

    async def _record_end(self, task: asyncio.Task[None]) -> RunState | None:
        ctx = self.ctx
        error: str | None = None
        if ctx.stop_reason == TIMEOUT:
            # However the handler ended after the timeout, the attempt did not make it in time.
            return await self._finish(RunState.FAILED, f"timed out after {self.options.timeout_ms} ms")
        if task.cancelled():
            return await self._release(f"{HANDED_OVER}: {ctx.stop_reason or 'cancelled'}")
        exc = task.exception()
        if exc is None:
            return await self._finish(RunState.SUCCEEDED, None)
        if isinstance(exc, RunInterrupted):
            if ctx.stop_reason == SHUTDOWN:
                return await self._release(f"{HANDED_OVER}: {exc or SHUTDOWN}")
            return await self._release(str(exc) or "interrupted")
        if isinstance(exc, RunGivenUp):
            reason = str(exc) or "given up"
            if (ended := await self._finish(RunState.INTERRUPTED, reason)) is not None:
                self.listener.gave_up(ctx.job, ctx.slot, ctx.attempt, reason)
            return ended
        if isinstance(exc, RunSkipped):
            return await self._finish(RunState.SKIPPED, str(exc) or "skipped")
        if isinstance(exc, RunCancelled):
            return await self._finish(RunState.CANCELLED, str(exc) or "cancelled")
        if isinstance(exc, RunFailed):
            error = str(exc) or "failed"
        else:
            log.error("handler of %s@%s raised", ctx.job, ctx.slot, exc_info=exc)
            error = f"{type(exc).__name__}: {exc}"
        return await self._finish(RunState.FAILED, error)

    async def _with_retries(self, what: str, op: Callable[[], Awaitable[bool]], outcome: RunState) -> bool | None:
        """Write the attempt's end while our lease may still be valid; None if it never got through.

        A reply may be lost after the store applied the write: the retry is then refused
        (the run is no longer ours to end), and a read tells whether it was our own write.
        """
        ctx = self.ctx
        errors = 0

        def failed(exc: BaseException, _wait_ms: int | None) -> None:
            nonlocal errors
            errors += 1
            self.listener.store_error(what, ctx.job, str(exc))

        try:
            ok = bool(
                await retry(
                    op,
                    clock=self.clock,
                    transient=is_store_error,
                    deadline_ms=lambda: self._lease_until_ms,
                    on_error=failed,
                )
            )
        except StoreError:
            return None
        if ok:
            return True
        try:
            run = await self.backend.get_run(ctx.job, ctx.slot)
            if run is None and await self._reclaim():
                return bool(await op())  # the store had lost the run: write our end into it anew
        except StoreError:
            return None
        if run is None or not errors:
            return False
        mine = token_hash(ctx.token)
        return any(a.token_hash == mine and a.ended_ms is not None and a.outcome is outcome for a in run.attempts)

    async def _finish(self, outcome: RunState, error: str | None) -> RunState | None:
        ctx = self.ctx
        ok = await self._with_retries(
            "finish",
            lambda: self.backend.finish(ctx.job, ctx.slot, ctx.token, self.clock.now_ms(), outcome, error),
            outcome,
        )
        if ok:
            self.listener.finished(ctx.job, ctx.slot, ctx.attempt, outcome, error)
            return outcome
        self.listener.fenced(
            ctx.job, ctx.slot, ctx.attempt, "finish rejected: " + ("fenced" if ok is False else "store unreachable")
        )
        return None

    async def _release(self, reason: str) -> RunState | None:
        ctx = self.ctx
        ok = await self._with_retries(
            "release",
            lambda: self.backend.release(ctx.job, ctx.slot, ctx.token, self.clock.now_ms(), reason),
            RunState.INTERRUPTED,
        )
        if ok:
            self.listener.finished(ctx.job, ctx.slot, ctx.attempt, RunState.INTERRUPTED, reason)
            return RunState.INTERRUPTED
        return None

    async def _stop_heartbeats(self) -> None:
        """End the heartbeats, and wait for one in flight, before the attempt's end is written.

        A heartbeat sent before the release but applied after it (the lease writes have
        several connections) would push the released lease forward again: the backups would
        wait a whole lease for the next attempt. The flag stops the loop even if a store
        client swallowed the cancellation of its call, which redis-py has done; the stores
        also refuse a released attempt's token, so a heartbeat still in flight when the wait
        gives up changes nothing.
        """
        self._beats_over = True
        task = self._beat_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=self.options.stop_grace_ms / 1000)

    async def _beat(self, now: int) -> bool:
        """One heartbeat at ``now``, waited for until the next one is due, and no longer.

        A store call that gets no reply ends only at the store client's own timeout (seconds,
        and a connection's worth of them on PostgreSQL): waited for, it held the next beat
        back by as much, and two such beats lost a lease that was fine. Given up at the next
        beat (the call is cancelled: its batch, if nobody else waits for it, and its
        connection go), it raises StoreError and the next beat goes out at once.
        """
        ctx, opts = self.ctx, self.options
        call = asyncio.ensure_future(self.backend.heartbeat(ctx.job, ctx.slot, ctx.token, now, opts.lease_ms))
        due = timer(self.clock, now + opts.heartbeat_ms)
        try:
            first: list[asyncio.Future[Any]] = [call, due]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        finally:
            due.cancel()
            if not call.done():
                call.cancel()
                # A store client may end the call with its own error after all: read, not logged.
                call.add_done_callback(lambda c: c.cancelled() or c.exception())
        if not call.done():
            raise StoreError(f"no answer within a heartbeat ({format_duration(opts.heartbeat_ms)})")
        return call.result()

    async def _heartbeats(self) -> None:
        """Push the lease forward every heartbeat while the handler is alive.

        The claim or takeover that started the attempt set the lease: the first beat is due a
        heartbeat after that, like every other (one store call per run fewer than a beat at
        once, which pushed a lease set a moment before). Beats are a heartbeat apart from
        start to start, however long the store took to answer the last one.
        """
        ctx = self.ctx
        opts = self.options
        next_ms = self._lease_until_ms - opts.lease_ms + opts.heartbeat_ms
        while not self._beats_over:
            if (wait_ms := next_ms - self.clock.now_ms()) > 0:
                await self.clock.sleep(wait_ms)
                if self._beats_over:
                    return
            now = self.clock.now_ms()
            next_ms = now + opts.heartbeat_ms
            try:
                if ctx.alive and self.held() is None:
                    ok = await self._beat(now)
                    if ok:
                        self._lease_until_ms = now + opts.lease_ms
                else:
                    run = await self.backend.get_run(ctx.job, ctx.slot)
                    ok = run is not None and run.token == ctx.token and run.state.active
            except StoreError as exc:
                self.listener.heartbeat_failed(ctx.job, ctx.slot, str(exc))
                if self.clock.now_ms() >= self._lease_until_ms:
                    # We cannot prove we still hold the run; a backup may have taken it.
                    self._fence(LEASE_LOST)
                    return
                continue
            if self._beats_over:
                return
            if not ok and not await self._refused():
                return
