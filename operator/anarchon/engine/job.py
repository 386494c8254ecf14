"""A job: a name, a schedule, a handler and the policies that govern its runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime

from .backend import Backend
from .durations import format_duration
from .errors import ConfigError
from .limits import (
    MAX_ATTEMPTS,
    MAX_JITTER_MS,
    MAX_TAKEOVERS,
    MIN_ATTEMPTS,
    MIN_CATCH_UP_WINDOW_MS,
    MIN_EVERY_MS,
    MIN_HEARTBEAT_MS,
    MIN_LEASE_HEARTBEATS,
    MIN_STARTING_DEADLINE_OVER_JITTER_MS,
    MIN_TIMEOUT_MS,
)
from .model import Attempt, CatchUp, Cause, CrossCluster, Overlap, Run
from .schedule import Every, Schedule


async def _always_yours() -> bool:
    """Claim-only stores have no lease to check: the claim is all there is."""
    return True


def _no_timer() -> None:
    """Claim-only stores time the handler as a whole: there is no timer to pause or restart."""


class RunContext:
    """What a handler learns about the attempt it runs, and how it talks back.

    ``stop`` is set when the engine wants the handler to end: ``stop_reason`` says why
    ("fenced", "timeout", "shutdown"). A handler that cannot finish its work by then raises
    :class:`~anarchon.engine.RunInterrupted` to hand the run over; returning means success.

    ``set_alive(False)`` stops the heartbeats without ending the handler: the lease then
    runs out and a backup takes the next attempt. The operator uses it while a Pod is gone.

    The job's timeout bounds one try of the work, and an attempt may hold several (retries
    after a failure, see :mod:`anarchon.engine.tries`): ``pause_timeout()`` stops the timer
    while the handler waits out a backoff, ``restart_timeout()`` starts it anew when the next
    try begins. Without either call the timeout counts from the attempt's start.
    """

    def __init__(
        self,
        *,
        job: str,
        slot: int,
        attempt: int,
        token: str,
        instance: str,
        previous: Attempt | None = None,
        replaced: list[Run] | None = None,
        cause: Cause | None = None,
    ) -> None:
        self.job = job
        self.slot = slot
        self.attempt = attempt
        self.token = token
        self.instance = instance
        self.previous = previous
        self.replaced = replaced or []
        # Why the run exists; None for a later attempt, whose instance did not see it start.
        self.cause = cause
        self.stop = asyncio.Event()
        self.stop_reason: str | None = None
        self._alive = True
        self.confirm: Callable[[], Awaitable[bool]] = _always_yours
        self.pause_timeout: Callable[[], None] = _no_timer
        self.restart_timeout: Callable[[], None] = _no_timer

    # ``confirm()``: heartbeat now; False means this attempt was fenced off and must not act.

    @property
    def scheduled_at(self) -> datetime:
        return datetime.fromtimestamp(self.slot / 1000, UTC)

    @property
    def alive(self) -> bool:
        return self._alive

    def set_alive(self, alive: bool) -> None:
        self._alive = alive

    def continue_after(self, recorded: int) -> None:
        """Number this attempt after ``recorded``, the last attempt the handler's own durable
        record knows: a store that lost its state counts a run's attempts from 1 again, and
        numbers must never go back (a record's writes are guarded by them)."""
        self.attempt = max(self.attempt, recorded + 1)

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def __repr__(self) -> str:
        return f"<RunContext {self.job}@{self.slot} attempt={self.attempt} instance={self.instance}>"


Handler = Callable[[RunContext], Awaitable[None]]


#: How far apart the clocks of two instances may be, as far as claim windows are concerned.
CLOCK_SKEW_MARGIN_MS = 5_000


@dataclass(frozen=True)
class JobOptions:
    """Policies of a job. ``None`` means "the default for the store in use".

    Defaults on a lease store: overlap Skip, 3 attempts, no catch-up. On a claim-only store
    the only honourable values are overlap Allow, 1 attempt and no catch-up; asking for
    anything else there is a :class:`ConfigError`, never a silent downgrade.
    """

    jitter_ms: int = 1_000
    heartbeat_ms: int = 2_000
    lease_ms: int | None = None  # default: 3 heartbeats
    overlap: Overlap | None = None
    catch_up: CatchUp | None = None
    catch_up_window_ms: int = 3_600_000
    max_catch_up: int = 100
    starting_deadline_ms: int | None = None
    max_attempts: int | None = None
    timeout_ms: int | None = None
    stop_grace_ms: int = 5_000
    suspend: bool = False
    #: A takeover may resume the work where it still runs (the operator adopts a live Pod), so
    #: not every attempt starts the work anew. The handler then counts its own relaunches
    #: against ``max_attempts`` (raising RunGivenUp past them), and the store gives a run up
    #: only after :data:`~.limits.MAX_TAKEOVERS` attempts: never while its work lives.
    resumable: bool = False
    #: A run whose current attempt's instance is of another cluster (:mod:`.shared`), its lease
    #: run out: taken over from here only a lease later (that cluster's own backups first, which
    #: can adopt its work), and then relaunched here or, with NEVER, given up.
    cross_cluster: CrossCluster = CrossCluster.RELAUNCH

    @property
    def effective_lease_ms(self) -> int:
        return self.lease_ms if self.lease_ms is not None else 3 * self.heartbeat_ms


@dataclass(frozen=True)
class ResolvedOptions:
    """JobOptions with every default filled in for one store; what the loop runs on."""

    jitter_ms: int
    heartbeat_ms: int
    lease_ms: int
    overlap: Overlap
    catch_up: CatchUp
    catch_up_window_ms: int
    max_catch_up: int
    starting_deadline_ms: int | None
    max_attempts: int
    timeout_ms: int | None
    stop_grace_ms: int
    suspend: bool
    leases: bool
    resumable: bool = False
    cross_cluster: CrossCluster = CrossCluster.RELAUNCH

    @property
    def takeover_bound(self) -> int:
        """How many attempts the store lets a run have before it gives the run up."""
        return MAX_TAKEOVERS if self.resumable else self.max_attempts

    @property
    def claim_retry_ms(self) -> int:
        """How long after its slot a claim is still retried: the starting deadline, else 30 s or a lease."""
        return self.starting_deadline_ms if self.starting_deadline_ms is not None else max(self.lease_ms, 30_000)

    @property
    def claim_window_ms(self) -> int:
        """How long after its slot some instance may still claim it: the jitter, the claim's
        retries and a margin for clock skew between instances."""
        return self.jitter_ms + self.claim_retry_ms + CLOCK_SKEW_MARGIN_MS

    @property
    def records_needed_ms(self) -> int:
        """How long after its slot the store must keep a final run's record for the engine.

        A claim of a slot whose record is gone would win again, so the record outlives the
        claim window and, with catch-up, the catch-up window (catch-up claims slots that far
        back). The job's newest record, the base of catch-up, is kept by the store itself.
        """
        catch_up = 0 if self.catch_up is CatchUp.NONE else self.catch_up_window_ms
        return max(self.claim_window_ms, catch_up + CLOCK_SKEW_MARGIN_MS)


def _ms(ms: int) -> str:
    """A duration for a message: its short form, or the raw number when it is negative."""
    return format_duration(ms) if ms >= 0 else f"{ms} ms"


def resolve_options(options: JobOptions, backend: Backend, *, job: str = "job") -> ResolvedOptions:
    """Check ``options`` against what ``backend`` can honour and fill in the defaults."""
    leases = backend.capabilities.leases
    store = backend.capabilities.name
    if options.heartbeat_ms < MIN_HEARTBEAT_MS:
        raise ConfigError(
            f"{job}: heartbeat must be at least {format_duration(MIN_HEARTBEAT_MS)}, got {_ms(options.heartbeat_ms)}:"
            " each heartbeat is a store write per running attempt"
        )
    lease_ms = options.effective_lease_ms
    if leases and lease_ms < MIN_LEASE_HEARTBEATS * options.heartbeat_ms:
        raise ConfigError(
            f"{job}: the lease ({_ms(lease_ms)}) must last at least {MIN_LEASE_HEARTBEATS} heartbeats"
            f" ({_ms(MIN_LEASE_HEARTBEATS * options.heartbeat_ms)}): with less, one late heartbeat lets it run out"
            " under a live runner and a backup takes over a run that was fine"
        )
    if not 0 <= options.jitter_ms <= MAX_JITTER_MS:
        raise ConfigError(
            f"{job}: jitter must be between 0 and {format_duration(MAX_JITTER_MS)}, got {_ms(options.jitter_ms)}:"
            " it delays every run's start by up to its value"
        )
    if options.max_attempts is not None and not MIN_ATTEMPTS <= options.max_attempts <= MAX_ATTEMPTS:
        raise ConfigError(f"{job}: maxAttempts must be between {MIN_ATTEMPTS} and {MAX_ATTEMPTS}")
    if options.timeout_ms is not None and options.timeout_ms < MIN_TIMEOUT_MS:
        raise ConfigError(
            f"{job}: timeout must be at least {format_duration(MIN_TIMEOUT_MS)}, got {_ms(options.timeout_ms)}:"
            " a shorter one fails every attempt before its work can start"
        )
    least = options.jitter_ms + MIN_STARTING_DEADLINE_OVER_JITTER_MS
    if options.starting_deadline_ms is not None and options.starting_deadline_ms < least:
        raise ConfigError(
            f"{job}: startingDeadline must be at least the jitter plus"
            f" {format_duration(MIN_STARTING_DEADLINE_OVER_JITTER_MS)} ({_ms(least)}),"
            f" got {_ms(options.starting_deadline_ms)}: a run waits up to the jitter before its claim,"
            " so a shorter deadline misses slots at random"
        )
    if options.catch_up_window_ms < MIN_CATCH_UP_WINDOW_MS:
        raise ConfigError(
            f"{job}: the catch-up window must be at least {format_duration(MIN_CATCH_UP_WINDOW_MS)},"
            f" got {_ms(options.catch_up_window_ms)}: slots are at least a second apart, so a shorter"
            " window never holds a missed slot"
        )
    if not leases:
        refused = []
        if options.overlap not in (None, Overlap.ALLOW):
            refused.append(f"overlap={options.overlap} (needs a lease to see that an earlier run is active)")
        if options.max_attempts not in (None, 1):
            refused.append(f"maxAttempts={options.max_attempts} (retries need a lease that backups can check)")
        if options.catch_up not in (None, CatchUp.NONE):
            refused.append(f"catchUp={options.catch_up} (needs the run history a lease store keeps)")
        if refused:
            raise ConfigError(
                f"{job}: the {store} store is claim-only and cannot honour "
                + "; ".join(refused)
                + ". Use a lease store (sqlite, redis, postgresql) or drop these settings."
            )
    overlap = options.overlap or (Overlap.SKIP if leases else Overlap.ALLOW)
    resolved = ResolvedOptions(
        jitter_ms=options.jitter_ms,
        heartbeat_ms=options.heartbeat_ms,
        lease_ms=lease_ms,
        overlap=overlap,
        catch_up=options.catch_up or CatchUp.NONE,
        catch_up_window_ms=options.catch_up_window_ms,
        max_catch_up=max(1, options.max_catch_up),
        starting_deadline_ms=options.starting_deadline_ms,
        max_attempts=options.max_attempts or (3 if leases else 1),
        timeout_ms=options.timeout_ms,
        stop_grace_ms=options.stop_grace_ms,
        suspend=options.suspend,
        leases=leases,
        resumable=options.resumable,
        cross_cluster=options.cross_cluster,
    )
    if not leases:
        # Every contender of one slot must arrive while the store still remembers the claim.
        backend.require_window(resolved.claim_window_ms)
    return resolved


@dataclass(frozen=True)
class Job:
    """A named piece of work. The name is the job's identity in the store: keep it stable."""

    name: str
    schedule: Schedule
    handler: Handler
    options: JobOptions = field(default_factory=JobOptions)
    #: Why this instance must not work on the job now (None: it may): while it says so, the
    #: instance claims no slot of the job, takes no run of it over and lets the leases of the runs
    #: it has run out, so that other instances (of another cluster, which can) take them. The
    #: operator holds a shared job back while its API server is out of reach (:mod:`anarchon.kube.api.reach`).
    held: Callable[[], str | None] | None = field(default=None, compare=False)
    #: The newest slot the handler's own durable record holds (the operator's newest
    #: AnarchonRun), or None. Catch-up starts from it when the store has no history of the
    #: job: a store that lost its state while no instance ran has forgotten what ran.
    recorded: Callable[[], Awaitable[int | None]] | None = field(default=None, compare=False)
    #: The slots of the runs the handler's own durable record says are still open (the
    #: operator's AnarchonRuns without an end). After the store lost its state, each one the
    #: store has not got back a lease later (a living runner claims its run back) is claimed
    #: again at once: its runner died too, maybe before this instance ever saw the run.
    open_slots: Callable[[], Awaitable[Collection[int]]] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 200 or any(c.isspace() for c in self.name):
            raise ConfigError(f"job name {self.name!r}: use 1 to 200 characters without spaces")
        if isinstance(self.schedule, Every) and self.schedule.period_ms < MIN_EVERY_MS:
            raise ConfigError(
                f"{self.name}: every must be at least {format_duration(MIN_EVERY_MS)},"
                f" got {format_duration(self.schedule.period_ms)}: the finest cron grain is one second too,"
                " and each slot costs a claim in the store"
            )
