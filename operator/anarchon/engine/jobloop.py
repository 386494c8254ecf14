"""One job's life on one instance: compute slots, claim them, run what it wins.

Every instance runs the same loop for the same job. The loop never asks the others
anything: the slot numbers agree because they come from the schedule alone, and the store
decides who wins each one. Two concerns live here, each in its own coroutine:

* the slot loop: wait for the next slot, then (after jitter) claim it;
* catch-up, once at start: the slots missed while no instance ran, per policy.

Backing up the others is not per job: the instance's one sweep (:mod:`.backups`) finds the
runs whose lease ran out, across all jobs, and hands each to its job's :meth:`JobLoop.take_over`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .attempt import LEASE_LOST, SHUTDOWN, AttemptRunner
from .backend import Backend, ClaimRequest, HistoryStore, LeaseStore, TakeoverRequest
from .batch import ClaimBatcher
from .clock import Clock, timer
from .errors import ConfigError, RunCancelled, StoreError, StoreLostState, is_store_error
from .events import EngineListener
from .job import Job, ResolvedOptions, RunContext, resolve_options
from .lag import LoopLag
from .limits import MAX_SLOT_MS, MIN_SLOT_MS
from .logcontext import RunFields, attempt_running
from .model import (
    HANDED_OVER,
    CatchUp,
    Cause,
    ClaimOutcome,
    ClaimResult,
    CrossCluster,
    Overlap,
    Run,
    RunState,
    new_token,
)
from .retry import Backoff, retry
from .schedule import Schedule, slots_between
from .shared import cluster_of

log = logging.getLogger("anarchon.engine.jobloop")
T = TypeVar("T")
#: Slots computed between two yields to the event loop while listing missed slots.
_SLOTS_PER_YIELD = 256
#: How many leases a loop remembers the slots another instance's run held, and keeps asking
#: a store that stopped answering about a run whose lease it lost: a store that lost its
#: state forgets such runs, and only these memories can claim them again.
_RECOVERY_LEASES = 10


async def _slots_between(schedule: Schedule, after_ms: int, until_ms: int) -> list[int]:
    """:func:`slots_between` as a list, letting other tasks run every few hundred slots.

    A long catch-up window of a frequent schedule holds thousands of slots (3600 in an hour
    of ``* * * * * *``): listed in one go, they would stall heartbeats and the health probe.
    """
    slots: list[int] = []
    for slot in slots_between(schedule, after_ms, until_ms):
        slots.append(slot)
        if len(slots) % _SLOTS_PER_YIELD == 0:
            await asyncio.sleep(0)
    return slots


class _Wake:
    """A flag the slot loop waits for beside its timer, as a bare future: no task of its own.

    With an ``asyncio.Event`` each idle job would cost two tasks besides its slot loop (one
    waiting on the event, one on the timer).
    """

    def __init__(self) -> None:
        self._set = False
        self._waiters: set[asyncio.Future[None]] = set()

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def future(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._set:
            future.set_result(None)
        else:
            self._waiters.add(future)
            future.add_done_callback(self._waiters.discard)
        return future


async def _sleep_unless(clock: Clock, t_ms: int, wake: _Wake) -> bool:
    """Sleep until ``t_ms``; True if ``wake`` was set first (the sleep is then dropped)."""
    sleeper = timer(clock, t_ms)
    woken = wake.future()
    # One bare future done by whichever comes first: asyncio.wait would hold two more coroutine
    # frames, a set and a waiter for each idle job.
    either: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def first(_: asyncio.Future[None]) -> None:
        if not either.done():
            either.set_result(None)

    sleeper.add_done_callback(first)
    woken.add_done_callback(first)
    try:
        await either
    finally:
        sleeper.cancel()
        woken.cancel()
    if not sleeper.done() or sleeper.cancelled():
        return True
    await clock.sleep_until(t_ms)  # the system clock's timer fires a precise millisecond early
    return False


class JobLoop:
    """Drives one job on one instance until :meth:`stop`."""

    def __init__(
        self,
        job: Job,
        backend: Backend,
        *,
        instance: str,
        clock: Clock,
        listener: EngineListener | None = None,
        rng: random.Random | None = None,
        claims: ClaimBatcher | None = None,
        lag: LoopLag | None = None,
    ) -> None:
        self.backend = backend
        #: Where claims go: the instance's batcher (shared by its jobs), or one of our own.
        self._claims = claims or ClaimBatcher(backend)
        #: The instance's event-loop lateness: while it is late, new slots wait (see :mod:`.lag`).
        self._lag = lag or LoopLag()
        self.instance = instance
        self.clock = clock
        self.listener = listener or EngineListener()
        self.rng = rng or random.Random()
        self._job = job
        self._opts = resolve_options(job.options, backend, job=job.name)
        self._changed = _Wake()
        self._tasks: set[asyncio.Task[object]] = set()
        self._running: dict[int, AttemptRunner] = {}
        self._main: list[asyncio.Task[None]] = []
        self._stopping = False
        self._since_ms: int | None = None
        #: Until when claims wait, after the store said it lost its state (:class:`StoreLostState`).
        self._held_until_ms = 0
        #: Slots the handler's record says are open and the store had no record of, and since when.
        self._forgotten: dict[int, int] = {}
        #: Slots whose claim another instance's active run held, and when we saw it (oldest first).
        self._taken: dict[int, int] = {}
        #: The store's last loss of state this loop acted on (:meth:`LeaseStore.lost_since`).
        self._loss_seen_ms: int | None = None
        self._recovery: asyncio.Future[None] | None = None

    @property
    def job(self) -> Job:
        return self._job

    @property
    def options(self) -> ResolvedOptions:
        return self._opts

    @property
    def running_slots(self) -> list[int]:
        """Slots whose attempt this instance is running right now."""
        return sorted(self._running)

    def update(self, job: Job) -> None:
        """Swap in a new definition; it takes effect from the next slot, nothing restarts.

        Raises ConfigError (and keeps the old definition) if the new one is not honourable.
        """
        if job.name != self._job.name:
            raise ValueError("a job loop cannot change the job's name")
        old_job, old_opts = self._job, self._opts
        self._opts = resolve_options(job.options, self.backend, job=job.name)
        self._job = job
        # Only what moves slots wakes the slot loop (the rest is read at each slot): the
        # operator re-adds a job on every watch event, its own status writes included.
        if job.schedule.fingerprint != old_job.schedule.fingerprint or self._opts.suspend != old_opts.suspend:
            self._changed.set()

    def start(self) -> None:
        if self._main:
            return
        self._main.append(asyncio.create_task(self._slot_loop(), name=f"anarchon-slots:{self._job.name}"))

    async def stop(self, *, handover: bool = True) -> None:
        """Stop claiming; hand running attempts over (release their leases) or cancel them."""
        self._stopping = True
        for task in self._main:
            task.cancel()
        if self._recovery is not None:
            self._recovery.cancel()  # it may wait a lease: never hold up a shutdown
        for runner in list(self._running.values()):
            runner.ctx.request_stop(SHUTDOWN)
        if not handover:
            for spawned in self._tasks:
                spawned.cancel()
        pending: set[asyncio.Task[object]] = {*self._main, *self._tasks}
        if pending:
            # Bounded: a handler that ignores its stop request must not hold up the shutdown.
            _, late = await asyncio.wait(pending, timeout=self._opts.stop_grace_ms / 1000 + 10)
            for straggler in late:
                log.error("%s did not stop in time; cancelling it", straggler.get_name())
                straggler.cancel()
        self._main.clear()

    async def trigger(self, slot: int | None = None) -> ClaimResult:
        """Claim (and run, if won) a run now, outside the schedule: a manual trigger.

        A slot no store can hold is refused here, with a :class:`ConfigError`, rather than
        sent: the store would fail on it (PostgreSQL: bigint out of range) on every retry.
        """
        slot = self.clock.now_ms() if slot is None else slot
        if not MIN_SLOT_MS <= slot <= MAX_SLOT_MS:
            raise ConfigError(
                f"{self._job.name}: slot {slot} is out of range: slots are ms since 1970-01-01T00:00:00Z,"
                f" from {MIN_SLOT_MS} to {MAX_SLOT_MS} (the end of year 9999)"
            )
        result = await self._claim(slot)
        self._report(slot, result, Cause.MANUAL)  # overlap applies to manual runs too
        if result.won and result.run is not None:
            run = self._run_attempt(result.run, result, cause=Cause.MANUAL)
            self._spawn(run, f"anarchon-run:{self._job.name}@{slot}")
        return result

    async def resume(self, slot: int) -> bool:
        """Claim again, and run, a run the store has forgotten while it was open: True if won.

        For a caller whose own durable record (the operator's run object) says the run never
        ended while the store has no record of it: a store that lost its state. A runner still
        alive claims its run back at its next heartbeat, so a slot is claimed here only once it
        has been missing for a lease (two calls at least a lease apart); the handler of the won
        attempt then picks the run up where its record and its work stand.
        """
        now = self.clock.now_ms()
        lease = self._opts.lease_ms
        self._forgotten = {s: t for s, t in self._forgotten.items() if now - t < 10 * lease}
        since = self._forgotten.setdefault(slot, now)
        if self._stopping or slot in self._running or now - since < lease:
            return False
        del self._forgotten[slot]
        return await self._claim_forgotten(slot, "the store had forgotten this open run")

    async def _claim_forgotten(self, slot: int, why: str) -> bool:
        """Claim a run the store has no record of, and run it if won: True if won.

        Overlap does not apply: the run is not new, it was open when the store forgot it.
        """
        job = self._job
        request = ClaimRequest(
            job.name, slot, self.instance, new_token(), self.clock.now_ms(), self._opts.lease_ms, Overlap.ALLOW
        )
        try:
            try:
                result = await self._claims.claim(request)
            except StoreLostState as lost:  # told so by this very claim, which was not applied
                self._noticed_loss(lost.since_ms)
                result = await self._claims.claim(dataclasses.replace(request, now_ms=self.clock.now_ms()))
        except StoreError as exc:
            self.listener.store_error("claim", job.name, str(exc))
            return False
        if not result.won or result.run is None:
            return False
        log.warning("%s@%s: %s; claimed it again", job.name, slot, why)
        self._spawn(self._run_attempt(result.run, result), f"anarchon-resume:{job.name}@{slot}")
        return True

    # -- the slot loop -------------------------------------------------------------------------

    async def _slot_loop(self) -> None:
        cursor = await self._start_cursor()
        while True:
            job = self._job
            suspended = self._opts.suspend
            slot = job.schedule.next_after(cursor)
            self._changed.clear()
            woke_for_change = await self._sleep_until(slot)
            if woke_for_change:
                # Read the time before the store round trip: a slot falling due during it
                # is still ahead of the cursor, not skipped.
                woke_at = self.clock.now_ms()
                if suspended and not self._opts.suspend:
                    # Resumed: slots due while suspended count as missed, per catch-up policy.
                    cursor = max(cursor, await self._start_cursor("missed while suspended"))
                else:
                    await self._note_schedule()
                    # The new definition counts from now: slots it would have had before the
                    # edit were never due, so they are not run.
                    cursor = max(cursor, woke_at)
                continue
            if self._opts.suspend:
                cursor = slot
                continue
            # Woken late (an event-loop stall, SIGSTOP, a paused VM, the clock stepped forward):
            # the slots slept through are missed slots and follow the catch-up policy, never
            # fire all at once. Only the newest of them is simply due.
            now = self.clock.now_ms()
            due = await _slots_between(job.schedule, cursor, now) or [slot]
            cursor = due[-1]
            if len(due) > 1:
                self._catch_up(due[:-1], "slept through")
            self._spawn(self._handle_slot(due[-1], Cause.SCHEDULE), f"anarchon-slot:{job.name}@{due[-1]}")

    async def _sleep_until(self, t_ms: int) -> bool:
        """Sleep until ``t_ms``; True if woken early because the job's definition changed."""
        return await _sleep_unless(self.clock, t_ms, self._changed)

    async def _note_schedule(self) -> int:
        """Record the current schedule's fingerprint; returns since when it is in force."""
        if not isinstance(self.backend, HistoryStore):
            return self.clock.now_ms()
        backend = self.backend
        job = self._job
        self._since_ms = await self._retry(
            "schedule", lambda: backend.schedule_since(job.name, job.schedule.fingerprint, self.clock.now_ms())
        )
        return self._since_ms

    async def _restore_schedule_since(self) -> None:
        """Tell a store that lost its state since when the schedule is in force, as this loop
        noted it: otherwise the next start takes the schedule for new from then on and catches
        nothing up from before (an outage of every replica after a Redis restart lost its slots).
        Best effort: a store error leaves the store's own note."""
        if self._since_ms is None or not isinstance(self.backend, HistoryStore):
            return
        try:
            await self.backend.schedule_since(self._job.name, self._job.schedule.fingerprint, self._since_ms)
        except StoreError as exc:
            self.listener.store_error("schedule", self._job.name, str(exc))

    async def _start_cursor(self, why: str = "missed while no instance ran") -> int:
        """Where the slot loop starts (or resumes): now, after catching up on missed slots per policy.

        A suspended job catches nothing up: its missed slots wait for the resume. Under catch-up
        None the missed slots are still reported: ``anarchon why`` must be able to say why.
        """
        now = self.clock.now_ms()
        since = await self._note_schedule()
        opts = self._opts
        if not isinstance(self.backend, HistoryStore) or opts.suspend:
            return now
        backend = self.backend
        job = self._job
        last = await self._retry("last_slot", lambda: backend.last_slot(job.name))
        if last is None:
            # No history in the store: a new job, or a store that lost its state while no
            # instance ran. Then the handler's own record is the base, and the schedule the
            # store just noted as new has been in force since that run.
            last = await self._recorded_slot()
            if last is None:
                return now  # nothing ran: nothing was missed
            since = last + 1
        base = max(last, since - 1, now - opts.catch_up_window_ms)
        self._catch_up(await _slots_between(job.schedule, base, now), why)
        return now

    async def _recorded_slot(self) -> int | None:
        """The newest slot of the handler's durable record; None without one, or if it cannot be read
        (logged: the catch-up it would have based is lost, the job runs on from now)."""
        if self._job.recorded is None:
            return None
        try:
            return await self._job.recorded()
        except Exception as exc:
            log.warning("%s: reading the newest recorded run failed: %s: %s", self._job.name, type(exc).__name__, exc)
            return None

    def _catch_up(self, missed: list[int], why: str) -> None:
        """Run the missed slots the catch-up policy chooses; report the others as missed."""
        opts = self._opts
        job = self._job
        if opts.catch_up is CatchUp.NONE:
            chosen: list[int] = []
        elif opts.catch_up is CatchUp.LATEST:
            chosen = missed[-1:]
        else:
            chosen = missed[-opts.max_catch_up :]
        left = missed[: len(missed) - len(chosen)]  # the chosen ones are the newest
        if left:
            self.listener.missed_slots(
                job.name, left, f"{why}: catch-up policy {opts.catch_up} runs {len(chosen)} of {len(missed)}"
            )
        if not chosen:
            return
        log.info("%s: catching up %d missed slot(s)", job.name, len(chosen))
        if opts.overlap is Overlap.SKIP:
            # One after the other, or each would be skipped for the one before it.
            self._spawn(self._catch_up_in_order(chosen), f"anarchon-catchup:{job.name}")
        else:
            for slot in chosen:
                self._spawn(self._handle_slot(slot, Cause.CATCH_UP), f"anarchon-catchup:{job.name}@{slot}")

    async def _catch_up_in_order(self, slots: list[int]) -> None:
        """Catch up under overlap Skip: each slot once the catch-up run before it has ended, on any instance.

        Every instance walks the missed slots it found (a late starter may find fewer: a peer
        has claimed the first already), and any of them may win any slot. Before claiming a
        slot, an instance waits while a run of an earlier slot is active anywhere; otherwise
        it would find that run active and record this slot Skipped. The starting deadline,
        if any, still bounds how late a slot may start.
        """
        assert isinstance(self.backend, LeaseStore)
        backend = self.backend
        for slot in slots:
            while not self._stopping and any(
                run.slot < slot for run in await self._retry("active_runs", lambda: backend.active_runs(self._job.name))
            ):
                await self.clock.sleep(self._opts.heartbeat_ms)
            await self._handle_slot(slot, Cause.CATCH_UP)

    async def _handle_slot(self, slot: int, cause: Cause) -> None:
        opts = self._opts
        job = self._job
        if opts.jitter_ms:
            await self.clock.sleep(self.rng.randint(0, opts.jitter_ms))
        if penalty := self._lag.penalty_ms():
            await self.clock.sleep(penalty)  # overloaded: let the instances on time claim it first
        if self._stopping:
            return
        if (why := self._held()) is not None:
            log.info("%s@%s: not claimed here (%s): left to the other instances", job.name, slot, why)
            return
        late = self.clock.now_ms() - slot
        if opts.starting_deadline_ms is not None and late > opts.starting_deadline_ms:
            self.listener.missed(job.name, slot, f"{late} ms late, past the starting deadline")
            return
        try:
            result = await self._claim(slot)
        except StoreError as exc:
            self.listener.missed(job.name, slot, f"store unreachable until the deadline: {exc}")
            return
        self._report(slot, result, cause)
        if result.won and result.run is not None:
            await self._run_attempt(result.run, result, cause=cause)

    def _report(self, slot: int, result: ClaimResult, cause: Cause) -> None:
        """Tell the listener what a claim decided beside winning: a slot skipped, runs replaced."""
        if result.outcome is ClaimOutcome.SKIPPED:
            reason = (result.run.error if result.run else None) or "overlap"
            self.listener.skipped(self._job.name, slot, reason, cause)
        elif result.outcome is ClaimOutcome.TAKEN and result.run is not None and result.run.state is RunState.SKIPPED:
            self.listener.skipped_elsewhere(self._job.name, slot, result.run)
        for old in result.replaced:
            self.listener.replaced(self._job.name, old.slot, slot)

    async def _claim(self, slot: int) -> ClaimResult:
        """Claim with retries on store errors; a lost reply is recognised by our own token."""
        job = self._job
        opts = self._opts
        token = new_token()
        deadline = slot + opts.claim_retry_ms
        retried = False

        def failed(exc: BaseException, _wait_ms: int | None) -> None:
            nonlocal retried
            retried = True
            self.listener.store_error("claim", job.name, str(exc))

        async def claim() -> ClaimResult:
            await self.clock.sleep_until(self._held_until_ms)
            request = ClaimRequest(
                job.name, slot, self.instance, token, self.clock.now_ms(), opts.lease_ms, opts.overlap
            )
            try:
                return await self._claims.claim(request)
            except StoreLostState as lost:
                self.listener.store_error("claim", job.name, f"{lost}; claims wait a lease for running attempts")
                self._noticed_loss(lost.since_ms)
                await self.clock.sleep_until(self._held_until_ms)
                return await self._claims.claim(dataclasses.replace(request, now_ms=self.clock.now_ms()))

        result = await retry(
            claim,
            clock=self.clock,
            transient=is_store_error,
            deadline_ms=lambda: self.clock.now_ms() if self._stopping else deadline,
            on_error=failed,
        )
        if retried and result.outcome is ClaimOutcome.TAKEN and isinstance(self.backend, LeaseStore):
            result = await self._own_lost_reply(self.backend, slot, token, result)
        self.listener.claimed(job.name, slot, result.outcome, self.clock.now_ms() - slot)
        if isinstance(self.backend, LeaseStore):
            if result.outcome is ClaimOutcome.TAKEN and result.run is not None and result.run.state.active:
                self._note_taken(slot)
            if (since := self.backend.lost_since(job.name)) is not None:
                self._noticed_loss(since)  # maybe learnt by another caller (a runner's reclaim)
        return result

    # -- a store that lost its state -------------------------------------------------------------

    def _note_taken(self, slot: int) -> None:
        now = self.clock.now_ms()
        self._taken[slot] = now
        horizon = now - _RECOVERY_LEASES * self._opts.lease_ms
        while (oldest := next(iter(self._taken.items()), None)) is not None and oldest[1] < horizon:
            del self._taken[oldest[0]]

    def _noticed_loss(self, since_ms: int) -> None:
        """The store began again empty at ``since_ms``: act on it once.

        Attempts still running claim their runs back at their next heartbeat: every claim of
        this job waits for that (a lease), or an overlap policy would not see them and Skip
        would launch beside a live run. Then :meth:`_recover`.
        """
        if self._loss_seen_ms is not None and since_ms <= self._loss_seen_ms:
            return
        self._loss_seen_ms = since_ms
        self._held_until_ms = max(self._held_until_ms, since_ms + self._opts.lease_ms)
        if not self._stopping:
            self._recovery = self._spawn(self._recover(since_ms), f"anarchon-recover:{self._job.name}")

    async def _recover(self, since_ms: int) -> None:
        """After a loss of the store's state: what only this loop remembers goes back in.

        First since when the schedule is in force (:meth:`_restore_schedule_since`). Then,
        for a resumable job, the slots another instance's run held before the loss, and those
        the handler's record says are open: their runners that live claimed them back within
        a lease, so a slot still unknown to the store after that lost its runner too, maybe
        before the run left any other record (killed between its claim and its run object).
        It is claimed again; the handler picks it up from whatever record its work left, or
        starts it.
        """
        await self._restore_schedule_since()
        if not self._opts.resumable or not isinstance(self.backend, LeaseStore):
            return
        backend = self.backend
        taken = {slot for slot, seen in self._taken.items() if seen <= since_ms + self._opts.lease_ms}
        await self.clock.sleep_until(since_ms + self._opts.lease_ms + self._opts.heartbeat_ms)
        for slot in sorted(taken | await self._open_slots()):
            if self._stopping:
                return
            self._taken.pop(slot, None)
            try:
                run = await backend.get_run(self._job.name, slot)
            except StoreError as exc:
                self.listener.store_error("get_run", self._job.name, str(exc))
                continue
            if run is None and slot not in self._running:
                await self._claim_forgotten(slot, "another instance held this run when the store lost its state")

    async def _open_slots(self) -> set[int]:
        """The slots of the handler's durable record that are open and not run here; none without
        a record, or if it cannot be read (logged: the handler's own mending is then the way back)."""
        if self._job.open_slots is None:
            return set()
        try:
            return set(await self._job.open_slots()) - set(self._running)
        except Exception as exc:
            log.warning("%s: reading the open runs' record failed: %s: %s", self._job.name, type(exc).__name__, exc)
            return set()

    async def _reclaim_after_lease_lost(self, slot: int) -> None:
        """Our attempt lost its lease because the store did not answer: ask it again until it does.

        A store that kept the run lets a backup take it over as usual. One that answers
        without it lost its state meanwhile: nobody's lease covers the run, and no backup
        would take it over; we claim it again at once rather than leave it to the handler's
        record (mending, a lease later at best).
        """
        opts = self._opts
        assert isinstance(self.backend, LeaseStore)
        backend = self.backend
        until = self.clock.now_ms() + _RECOVERY_LEASES * opts.lease_ms
        while not self._stopping and self.clock.now_ms() < until:
            try:
                run = await backend.get_run(self._job.name, slot)
            except StoreError:
                await self.clock.sleep(opts.heartbeat_ms)
                continue
            if run is None and slot not in self._running:
                await self._claim_forgotten(slot, "the store lost this run while our lease on it lapsed")
            return

    async def _own_lost_reply(self, backend: LeaseStore, slot: int, token: str, taken: ClaimResult) -> ClaimResult:
        """A retried claim found the slot taken: it may have been our own claim, its reply lost.

        Won, our token holds the run. Skipped (overlap Skip), the record has no token but
        names this instance: the skip is recorded once, for everyone, so if we did not report
        it nobody would, and the slot would have no run object at all (seen in the chaos soak
        with replies lost).
        """
        if (mine := await self._mine(backend, slot, token)) is not None:
            return ClaimResult(ClaimOutcome.WON, mine)
        run = taken.run
        if run is not None and run.state is RunState.SKIPPED and run.instance == self.instance:
            return ClaimResult(ClaimOutcome.SKIPPED, run)
        return taken

    async def _mine(self, backend: LeaseStore, slot: int, token: str) -> Run | None:
        """The run if our token holds it: a claim or takeover whose reply was lost did go through."""
        run = await self._retry("get_run", lambda: backend.get_run(self._job.name, slot))
        return run if run is not None and run.token == token and run.state.active else None

    # -- running what we won --------------------------------------------------------------------

    async def _run_attempt(self, run: Run, result: ClaimResult, *, cause: Cause | None = None) -> None:
        job = self._job
        ctx = RunContext(
            job=job.name,
            slot=run.slot,
            attempt=run.attempt,
            token=run.token,
            instance=self.instance,
            previous=run.attempts[-2] if len(run.attempts) >= 2 else None,
            replaced=result.replaced,
            cause=cause,
        )
        with attempt_running(RunFields(job.name, run.slot, run.attempt, self.instance)):
            if not isinstance(self.backend, LeaseStore):
                await self._run_claim_only(ctx)
                return
            runner = AttemptRunner(
                self.backend, job.handler, ctx, self._opts, self.clock, self.listener, run.lease_until_ms, self._held
            )
            self._running[run.slot] = runner
            if self._stopping:
                # Won (a takeover) while stopping began: hand it straight back, as stop() did
                # for the attempts already running.
                runner.ctx.request_stop(SHUTDOWN)
            try:
                await runner.run()
            finally:
                self._running.pop(run.slot, None)
            if runner.ctx.stop_reason == LEASE_LOST and self._opts.resumable and not self._stopping:
                self._spawn(self._reclaim_after_lease_lost(run.slot), f"anarchon-reclaim:{job.name}@{run.slot}")

    async def _run_claim_only(self, ctx: RunContext) -> None:
        """Without a lease there is nothing to heartbeat or record; just run the handler."""
        job = self._job
        self.listener.started(job.name, ctx.slot, ctx.attempt)
        timeout = None if self._opts.timeout_ms is None else self._opts.timeout_ms / 1000
        try:
            await asyncio.wait_for(job.handler(ctx), timeout)
        except TimeoutError:
            self.listener.finished(job.name, ctx.slot, 1, RunState.FAILED, "timed out")
        except RunCancelled as exc:
            self.listener.finished(job.name, ctx.slot, 1, RunState.CANCELLED, str(exc) or "cancelled")
        except Exception as exc:
            self.listener.finished(job.name, ctx.slot, 1, RunState.FAILED, f"{type(exc).__name__}: {exc}")
        else:
            self.listener.finished(job.name, ctx.slot, 1, RunState.SUCCEEDED, None)

    # -- backups ---------------------------------------------------------------------------------

    async def take_over(self, run: Run) -> None:
        """Run the next attempt of ``run``, whose lease the sweep found expired, if the store agrees.

        Several instances may try at once; the store lets one win. Nothing is tried for a run
        this instance runs itself, or once it is stopping (it would hand the run straight back).
        A run of another cluster (:mod:`.shared`) is left to that cluster's backups for one more
        lease (they can adopt its work; we can only start it anew), then relaunched here, or given
        up if the job says :attr:`CrossCluster.NEVER`.
        """
        assert isinstance(self.backend, LeaseStore)
        backend = self.backend
        if self._stopping or run.slot in self._running or self._held() is not None:
            return
        opts = self._opts
        now = self.clock.now_ms()
        # An attempt handed over on shutdown did not fail: it does not use up one of the tries.
        handed_over = sum(1 for a in run.attempts if (a.error or "").startswith(HANDED_OVER))
        bound = opts.takeover_bound + handed_over
        there = cluster_of(run.instance)
        if there is not None and there != cluster_of(self.instance):
            if now < run.lease_until_ms + opts.lease_ms:
                return  # its own cluster's turn
            if opts.cross_cluster is CrossCluster.NEVER:
                bound = run.attempt  # no attempt left: the store gives the run up
        request = TakeoverRequest(run.job, run.slot, self.instance, new_token(), now, opts.lease_ms, bound)
        try:
            result = await backend.takeover(request)
        except StoreError as exc:
            self.listener.store_error("takeover", run.job, str(exc))
            # The takeover may have gone through with its reply lost: then the run is ours,
            # and leaving it would burn the attempt when our lease runs out unused.
            mine = await self._mine(backend, run.slot, request.token)
            if mine is None:
                return
            result = ClaimResult(ClaimOutcome.WON, mine)
        if result.won and result.run is not None:
            self.listener.took_over(run.job, run.slot, result.run.attempt, run.instance)
            self._spawn(self._run_attempt(result.run, result), f"anarchon-takeover:{run.job}@{run.slot}")
        elif (
            result.run is not None
            and result.run.state is RunState.INTERRUPTED
            and result.run.updated_ms == request.now_ms
        ):
            self.listener.run_interrupted_final(result.run)

    # -- plumbing --------------------------------------------------------------------------------

    def _held(self) -> str | None:
        """Why this instance must not work on the job now (:attr:`Job.held`); None if it may."""
        held = self._job.held
        return None if held is None else held()

    def _spawn(self, coro: Awaitable[T], name: str) -> asyncio.Future[T]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s crashed", task.get_name(), exc_info=exc)

    async def _retry(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Retry a store call the loop cannot go on without, logging each store error."""
        return await retry(
            op,
            clock=self.clock,
            transient=is_store_error,
            on_error=lambda exc, _: self.listener.store_error(what, self._job.name, str(exc)),
            delays=Backoff(max_ms=5_000).delays(),
        )
