"""The interface between the engine and a store, one abstract class per concern.

* :class:`ClaimStore`: names exactly one winner per ``(job, slot)``.
* :class:`PresenceStore`: knows which instances use it (:mod:`anarchon.kube.job.sharing`).
* :class:`LeaseStore`: a claim that also keeps a lease with an expiry and the current
  attempt's token: heartbeat, finish, release, takeover by backups, fencing of stale runners.
* :class:`HistoryStore`: the runs a job had, the base of catch-up, pruning and forgetting.
* :class:`SharedSpecStore`: each cluster's spec of a job shared between clusters (:mod:`.shared`).

Two kinds of store exist (see the README's table), each the sum of some of them:

* :class:`Backend`: claim-only (claims and presence). It guarantees one winner per run and
  nothing else: no lease, so no backups, no overlap protection, no catch-up, no hand-over.
* :class:`LeaseBackend`: all five.

Callers take the narrowest one they need and tell a lease store from a claim-only one with
``isinstance``. Times are passed in by the caller (``now_ms``) rather than read from the
store's clock, so that the whole engine runs on one injectable clock and tests can
fast-forward it. The instances' clocks must agree to well under a lease anyway, since they
compute slots.
"""

from __future__ import annotations

import asyncio
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from .errors import StoreError
from .model import Attempt, ClaimOutcome, ClaimResult, Overlap, Run, RunState, token_hash
from .shared import SharedSide


@dataclass(frozen=True)
class Capabilities:
    """What a backend can promise, so callers can refuse policies it cannot honour."""

    name: str
    leases: bool


@dataclass(frozen=True)
class RunRequest:
    """One instance's attempt at a run, at ``now_ms``: what a claim and a takeover both say."""

    job: str
    slot: int
    instance: str
    token: str
    now_ms: int
    lease_ms: int

    def started(self, attempt: int) -> Attempt:
        """The attempt number ``attempt`` of the run, as this request starts it."""
        return Attempt(attempt, self.instance, token_hash(self.token), self.now_ms)


@dataclass(frozen=True)
class ClaimRequest(RunRequest):
    """ "Record that I am running this run, unless it is already taken"."""

    overlap: Overlap = Overlap.SKIP

    def claimed(self, *, lease: bool) -> Run:
        """The run this claim records when it wins: Claimed, attempt 1 by this instance.

        With ``lease`` (a lease store) it holds the lease and its first attempt; a claim-only
        store keeps neither.
        """
        return Run(
            job=self.job,
            slot=self.slot,
            state=RunState.CLAIMED,
            attempt=1,
            instance=self.instance,
            token=self.token,
            lease_until_ms=self.now_ms + self.lease_ms if lease else 0,
            created_ms=self.now_ms,
            updated_ms=self.now_ms,
            attempts=[self.started(1)] if lease else [],
        )

    def skipped(self, other_slot: int) -> Run:
        """The run this claim records when overlap Skip finds the run of ``other_slot`` still active."""
        return dataclasses.replace(
            self.claimed(lease=False),
            state=RunState.SKIPPED,
            attempt=0,
            token="",
            error=f"skipped: the run of slot {other_slot} is still active",
        )


@dataclass(frozen=True)
class TakeoverRequest(RunRequest):
    """ "The lease of this run ran out: let me run its next attempt"."""

    max_attempts: int


class Store(ABC):
    """A connection to a store: what every concern below needs."""

    capabilities: ClassVar[Capabilities]

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Connect and create whatever schema the store needs; idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    async def ping(self) -> None:
        """One round trip to the store; StoreError if it does not answer.

        For readiness probes: an instance that cannot reach its store can claim nothing and
        should say so, without being restarted for it (restarting does not bring a store
        back). This default only re-runs the idempotent :meth:`setup`; the stores in this
        package override it with a real round trip.
        """
        await self.setup()

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class ClaimStore(Store):
    """Names exactly one winner per run."""

    @abstractmethod
    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Atomically claim a run; exactly one concurrent caller gets ``won``."""

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        """Claim several runs in as few round trips as the store allows: one answer per request, in order.

        Each claim is exactly as atomic as :meth:`claim` alone and is decided in order, so two
        slots of one job in one batch meet each other as two separate claims would; together
        they are not a transaction. An answer is a result or the error that claim raised
        (:class:`StoreError` when the batch failed as a whole: its outcome is then unknown,
        request by request). This default sends the claims of different jobs concurrently
        and those of one job one after the other (only those can meet); stores that can do
        better (one pipeline, one transaction) override it.
        """
        answers: list[ClaimResult | BaseException] = [StoreError("not sent")] * len(requests)
        by_job: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            by_job.setdefault(request.job, []).append(i)

        async def in_order(indexes: list[int]) -> None:
            for i in indexes:
                try:
                    answers[i] = await self.claim(requests[i])
                except Exception as exc:
                    answers[i] = exc

        await asyncio.gather(*(in_order(indexes) for indexes in by_job.values()))
        return answers

    def require_window(self, needed_ms: int) -> None:
        """Refuse (ConfigError) if contenders ``needed_ms`` apart could both win.

        Lease stores keep every claim, so any spread is fine. Claim-only stores that forget
        a claim after a while (a TTL, a de-duplication window) override this.
        """


class PresenceStore(Store):
    """Knows which instances use it: what tells replicas that share a store from replicas that do not."""

    @abstractmethod
    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        """Record that ``instance`` uses this store, until ``now_ms + ttl_ms``; records that ran out may go.

        What tells replicas that share a store from replicas on stores of their own (a SQLite
        file each, two Redis databases): each one notes itself here every little while, and one
        that sees another at work (the operator sees it in Kubernetes) asks :meth:`present`
        whether its store knows it. Each would otherwise win every slot in its own store.
        """

    @abstractmethod
    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        """Those of ``instances`` whose presence record (:meth:`note_presence`) is alive at ``now_ms``."""


class Backend(ClaimStore, PresenceStore):
    """Every store: it names one winner per run and knows who uses it. Alone, a claim-only store."""


class LeaseStore(ClaimStore):
    """The lease protocol: a claimed run's lease, its heartbeats, its end, its takeover by a backup."""

    @abstractmethod
    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        """Push the lease to ``now_ms + lease_ms`` and mark the run Running.

        Returns False when ``token`` is not the current attempt's or the run is final:
        the caller has been fenced off and must stop.
        """

    @abstractmethod
    async def finish(
        self, job: str, slot: int, token: str, now_ms: int, outcome: RunState, error: str | None = None
    ) -> bool:
        """End the run with a final ``outcome``; only the current token may do it."""

    @abstractmethod
    async def release(self, job: str, slot: int, token: str, now_ms: int, reason: str) -> bool:
        """End the current attempt as Interrupted and expire the lease at once (it ends at ``now_ms``).

        Used for hand-over on stop and when a handler knows its attempt is lost, so that
        the next attempt does not wait for the lease to run out.
        """

    @abstractmethod
    async def takeover(self, request: TakeoverRequest) -> ClaimResult:
        """Start the next attempt of a run whose lease has run out.

        ``won`` only if the run is active, its lease is expired and fewer than
        ``max_attempts`` attempts were made. When the lease is expired and no attempt is
        left, the run is made final (Interrupted) and the result is ``taken``.
        """

    def lost_since(self, job: str) -> int | None:
        """When the store began again empty for ``job``, as this client last learnt it; None if never.

        A store that can lose its state says so once, through one caller's claim
        (:class:`~.errors.StoreLostState`); this tells the other users of the same client.
        """
        return None

    @abstractmethod
    async def get_run(self, job: str, slot: int) -> Run | None:
        """The run as stored, with its current token and attempts."""

    @abstractmethod
    async def active_runs(self, job: str) -> list[Run]:
        """Runs of ``job`` in Claimed or Running, oldest first."""

    @abstractmethod
    async def expired_runs(self, now_ms: int, limit: int) -> list[Run]:
        """Active runs of every job whose lease ran out by ``now_ms`` (or was released).

        One query however many jobs the store holds, read from an index of leases by expiry:
        it is what every instance's backup sweep asks, every heartbeat, so an instance with
        10,000 idle jobs costs the store one cheap query per heartbeat, not 10,000. At most
        ``limit`` runs, the most recently expired first (:meth:`release` ends a lease at its
        ``now_ms``): runs of jobs that no instance runs any more (their lease ran out long ago
        and nobody takes them over) come last and never hide a fresh one.
        """


class HistoryStore(Store):
    """The runs a job had, and their end: history, the base of catch-up, pruning and forgetting jobs."""

    @abstractmethod
    async def last_slot(self, job: str) -> int | None:
        """The newest slot recorded for ``job`` in any state; the base of catch-up."""

    @abstractmethod
    async def history(self, job: str, limit: int = 50) -> list[Run]:
        """The newest ``limit`` runs of ``job``, newest first, tokens blanked."""

    @abstractmethod
    async def schedule_since(self, job: str, fingerprint: str, now_ms: int) -> int:
        """When the job's schedule became ``fingerprint``.

        Records ``now_ms`` the first time a fingerprint is seen for a job. Catch-up never
        reaches before it, so editing a schedule never causes retroactive runs.
        """

    @abstractmethod
    async def prune(self, job: str, before_slot: int) -> int:
        """Delete final runs of ``job`` older than ``before_slot``; returns how many.

        Active runs stay, and so does the job's newest run whatever its slot: it is
        :meth:`last_slot`, the base of catch-up, and without it an instance that starts later
        would see no history and catch nothing up (or, with a stale base, too much).
        """

    @abstractmethod
    async def forget_job(self, job: str) -> None:
        """Delete everything the store keeps for ``job``: its runs, its schedule's fingerprint, its clusters' specs.

        For a job that is gone for good, once its runs were stopped. Idempotent, and safe
        when several instances forget the same job at once.
        """

    @abstractmethod
    async def note_served(self, jobs: Sequence[str], now_ms: int) -> None:
        """Note that ``jobs`` are served (an instance runs them) as of ``now_ms``: one call for all.

        What tells a job deleted while no instance watched from a job served elsewhere
        (another cluster or namespace sharing the store): see :meth:`forget_unserved`.
        """

    @abstractmethod
    async def forget_unserved(self, before_ms: int) -> list[str]:
        """:meth:`forget_job` every job last noted served before ``before_ms``; their names.

        A job never noted is left alone. An instance notes its jobs before it forgets.
        """


class SharedSpecStore(Store):
    """Each cluster's spec of a job shared between clusters: what tells them they disagree (:mod:`.shared`)."""

    @abstractmethod
    async def note_shared_spec(
        self, job: str, cluster: str, fingerprint: str, now_ms: int, ttl_ms: int
    ) -> list[SharedSide]:
        """Note that ``cluster`` runs ``job`` with spec ``fingerprint`` as of ``now_ms``; every cluster's note.

        A cluster's ``since`` stays while its fingerprint stays, and comes after every other note's
        when it changes (:func:`.shared.note_side`). Notes of other clusters not renewed within
        ``ttl_ms`` are gone (their cluster stopped serving the job) and not returned. One atomic
        step per job: of two clusters noting at once, the later sees the earlier's note.
        """

    @abstractmethod
    async def drop_shared_spec(self, job: str, cluster: str) -> None:
        """``cluster`` serves ``job`` no more (it was deleted there): its note goes. Idempotent."""


class LeaseBackend(Backend, LeaseStore, HistoryStore, SharedSpecStore):
    """A store that also holds leases, tokens and the history of each run: every concern."""


def claim_only_win(request: ClaimRequest) -> ClaimResult:
    """The winner's answer from a claim-only store: a run built from the request, no lease."""
    return ClaimResult(ClaimOutcome.WON, request.claimed(lease=False))
