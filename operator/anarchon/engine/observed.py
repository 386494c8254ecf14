"""A store with a stopwatch in front: how long each call took, for the engine's user to record.

The engine stays free of any metrics library: :func:`observed` wraps a backend, times every
call the engine makes through it (on the monotonic clock: a latency is real time, whatever
clock schedules the slots) and hands ``(operation, seconds, error)`` to a plain callable. The
operator turns that into a Prometheus histogram; a library user can log it, or ignore it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .backend import Backend, ClaimRequest, LeaseBackend, TakeoverRequest
from .model import ClaimResult, Run, RunState
from .shared import SharedSide

T = TypeVar("T")

#: ``(operation, seconds, error)``: ``operation`` is the backend method's name (``claim``,
#: ``heartbeat``, ``takeover``...), ``error`` the exception the call raised, if any. Called on the
#: engine's event loop after every call: it must not block.
StoreObserver = Callable[[str, float, BaseException | None], None]


class _Observed:
    """What both wrappers share: the inner store, its capabilities, and the timing."""

    def __init__(self, inner: Backend, observer: StoreObserver) -> None:
        self.inner = inner
        self.observer = observer
        self.capabilities = inner.capabilities  # per instance: the inner store's

    async def _timed(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        failed: Callable[[T], BaseException | None] = lambda _: None,
    ) -> T:
        """Await ``call()`` and report its time; ``failed`` finds an error in a result that holds one."""
        start = time.perf_counter()
        try:
            result = await call()
        except BaseException as exc:
            self.observer(operation, time.perf_counter() - start, exc)
            raise
        self.observer(operation, time.perf_counter() - start, failed(result))
        return result


def _all_failed(answers: list[ClaimResult | BaseException]) -> BaseException | None:
    """The first error of a batch of claims that all failed, else None."""
    errors = [a for a in answers if isinstance(a, BaseException)]
    return errors[0] if errors and len(errors) == len(answers) else None


class ObservedBackend(_Observed, Backend):
    """A claim-only store, timed."""

    inner: Backend

    async def setup(self) -> None:
        await self._timed("setup", self.inner.setup)

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> None:
        await self._timed("ping", self.inner.ping)

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        return await self._timed("claim", lambda: self.inner.claim(request))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        # One round trip of claims, batched or not, is one observation of "claim"; it failed
        # if every claim in it did (a batch of one: if that claim did).
        return await self._timed("claim", lambda: self.inner.claim_many(requests), _all_failed)

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        await self._timed("note_presence", lambda: self.inner.note_presence(instance, now_ms, ttl_ms))

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        return await self._timed("present", lambda: self.inner.present(instances, now_ms))

    def require_window(self, needed_ms: int) -> None:
        self.inner.require_window(needed_ms)


class ObservedLeaseBackend(ObservedBackend, LeaseBackend):
    """A lease store, timed: every operation of :class:`LeaseBackend` goes through the stopwatch."""

    inner: LeaseBackend

    def __init__(self, inner: LeaseBackend, observer: StoreObserver) -> None:
        super().__init__(inner, observer)

    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        return await self._timed("heartbeat", lambda: self.inner.heartbeat(job, slot, token, now_ms, lease_ms))

    async def finish(
        self, job: str, slot: int, token: str, now_ms: int, outcome: RunState, error: str | None = None
    ) -> bool:
        return await self._timed("finish", lambda: self.inner.finish(job, slot, token, now_ms, outcome, error))

    async def release(self, job: str, slot: int, token: str, now_ms: int, reason: str) -> bool:
        return await self._timed("release", lambda: self.inner.release(job, slot, token, now_ms, reason))

    async def takeover(self, request: TakeoverRequest) -> ClaimResult:
        return await self._timed("takeover", lambda: self.inner.takeover(request))

    async def get_run(self, job: str, slot: int) -> Run | None:
        return await self._timed("get_run", lambda: self.inner.get_run(job, slot))

    async def active_runs(self, job: str) -> list[Run]:
        return await self._timed("active_runs", lambda: self.inner.active_runs(job))

    async def expired_runs(self, now_ms: int, limit: int) -> list[Run]:
        return await self._timed("expired_runs", lambda: self.inner.expired_runs(now_ms, limit))

    async def last_slot(self, job: str) -> int | None:
        return await self._timed("last_slot", lambda: self.inner.last_slot(job))

    async def history(self, job: str, limit: int = 50) -> list[Run]:
        return await self._timed("history", lambda: self.inner.history(job, limit))

    async def schedule_since(self, job: str, fingerprint: str, now_ms: int) -> int:
        return await self._timed("schedule_since", lambda: self.inner.schedule_since(job, fingerprint, now_ms))

    async def prune(self, job: str, before_slot: int) -> int:
        return await self._timed("prune", lambda: self.inner.prune(job, before_slot))

    async def forget_job(self, job: str) -> None:
        await self._timed("forget_job", lambda: self.inner.forget_job(job))

    async def note_served(self, jobs: Sequence[str], now_ms: int) -> None:
        await self._timed("note_served", lambda: self.inner.note_served(jobs, now_ms))

    async def forget_unserved(self, before_ms: int) -> list[str]:
        return await self._timed("forget_unserved", lambda: self.inner.forget_unserved(before_ms))

    async def note_shared_spec(
        self, job: str, cluster: str, fingerprint: str, now_ms: int, ttl_ms: int
    ) -> list[SharedSide]:
        return await self._timed(
            "note_shared_spec", lambda: self.inner.note_shared_spec(job, cluster, fingerprint, now_ms, ttl_ms)
        )

    async def drop_shared_spec(self, job: str, cluster: str) -> None:
        await self._timed("drop_shared_spec", lambda: self.inner.drop_shared_spec(job, cluster))


def observed(backend: Backend, observer: StoreObserver) -> Backend:
    """``backend`` behind a stopwatch; a lease store stays a :class:`LeaseBackend`.

    The engine tells the two kinds apart with ``isinstance``, so the wrapper must be of the
    same kind as what it wraps.
    """
    if isinstance(backend, LeaseBackend):
        return ObservedLeaseBackend(backend, observer)
    return ObservedBackend(backend, observer)
