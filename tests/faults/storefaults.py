"""Faults placed on one exact store call, in front of a real store.

toxiproxy (``toxiproxy.py`` here) breaks the TCP connection to a store, which is how a
store fails in production, but it cannot aim: "the reply of the first takeover is lost"
is a matter of which bytes pass when. This layer aims. It wraps a real
:class:`~anarchon.engine.LeaseBackend` (every call still goes to the real server) and, for
the operation a rule names, either fails it before it is sent (the store never saw it),
sends it and then raises as if the reply had been lost (the store applied it), or stalls it
(a frozen connection: no answer, ever, until the caller gives up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from anarchon.engine import ClaimRequest, ClaimResult, LeaseBackend, Run, RunState, StoreError, TakeoverRequest
from anarchon.engine.shared import SharedSide


@dataclass
class Rule:
    operation: str  # "claim", "claim_many", "heartbeat", "finish", "release", "takeover", "get_run", "active_runs"...
    times: int = 1  # how many calls it hits, the first ones to come
    reply_lost: bool = False  # True: the store applied the call, the caller hears an error
    stall: bool = False  # True: the call is not sent and never answers (until cancelled)
    fired: int = 0


@dataclass
class FaultyStore(LeaseBackend):
    """A real lease store with a fault layer in front; ``calls`` counts every operation."""

    inner: LeaseBackend
    rules: list[Rule] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.capabilities = self.inner.capabilities  # type: ignore[misc]

    def fail(self, operation: str, times: int = 1, *, reply_lost: bool = False) -> Rule:
        rule = Rule(operation, times, reply_lost)
        self.rules.append(rule)
        return rule

    def stall(self, operation: str, times: int = 1) -> Rule:
        """The next ``times`` calls of ``operation`` hang, unsent, until their callers give up."""
        rule = Rule(operation, times, stall=True)
        self.rules.append(rule)
        return rule

    async def _through(self, operation: str, call: Any) -> Any:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        rule = next((r for r in self.rules if r.operation == operation and r.fired < r.times), None)
        if rule is None:
            return await call()
        rule.fired += 1
        if rule.stall:
            await asyncio.get_running_loop().create_future()  # never done: only a cancel ends it
        if rule.reply_lost:
            await call()
            raise StoreError(f"{operation}: connection reset after the request was sent (fault layer)")
        raise StoreError(f"{operation}: connection refused (fault layer)")

    async def setup(self) -> None:
        await self.inner.setup()

    async def close(self) -> None:
        await self.inner.close()

    async def ping(self) -> None:
        await self._through("ping", self.inner.ping)

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        result: ClaimResult = await self._through("claim", lambda: self.inner.claim(request))
        return result

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        """The store's own batch (one round trip), faulted as one call: a "claim_many" rule hits
        the whole batch. While a "claim" rule is pending, the claims go one by one instead, so
        that it hits a claim whether the engine sent it alone or in a batch (a trigger's is)."""
        if any(r.operation == "claim" and r.fired < r.times for r in self.rules):
            return await super().claim_many(requests)
        answers: list[ClaimResult | BaseException] = await self._through(
            "claim_many", lambda: self.inner.claim_many(requests)
        )
        return answers

    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        return bool(await self._through("heartbeat", lambda: self.inner.heartbeat(job, slot, token, now_ms, lease_ms)))

    async def finish(
        self, job: str, slot: int, token: str, now_ms: int, outcome: RunState, error: str | None = None
    ) -> bool:
        return bool(await self._through("finish", lambda: self.inner.finish(job, slot, token, now_ms, outcome, error)))

    async def release(self, job: str, slot: int, token: str, now_ms: int, reason: str) -> bool:
        return bool(await self._through("release", lambda: self.inner.release(job, slot, token, now_ms, reason)))

    async def takeover(self, request: TakeoverRequest) -> ClaimResult:
        result: ClaimResult = await self._through("takeover", lambda: self.inner.takeover(request))
        return result

    async def get_run(self, job: str, slot: int) -> Run | None:
        run: Run | None = await self._through("get_run", lambda: self.inner.get_run(job, slot))
        return run

    async def active_runs(self, job: str) -> list[Run]:
        runs: list[Run] = await self._through("active_runs", lambda: self.inner.active_runs(job))
        return runs

    async def expired_runs(self, now_ms: int, limit: int) -> list[Run]:
        runs: list[Run] = await self._through("expired_runs", lambda: self.inner.expired_runs(now_ms, limit))
        return runs

    async def last_slot(self, job: str) -> int | None:
        slot: int | None = await self._through("last_slot", lambda: self.inner.last_slot(job))
        return slot

    async def history(self, job: str, limit: int = 50) -> list[Run]:
        return await self.inner.history(job, limit)

    async def schedule_since(self, job: str, fingerprint: str, now_ms: int) -> int:
        since: int = await self._through("schedule_since", lambda: self.inner.schedule_since(job, fingerprint, now_ms))
        return since

    async def prune(self, job: str, before_slot: int) -> int:
        return await self.inner.prune(job, before_slot)

    async def forget_job(self, job: str) -> None:
        await self.inner.forget_job(job)

    async def note_served(self, jobs: Sequence[str], now_ms: int) -> None:
        await self._through("note_served", lambda: self.inner.note_served(jobs, now_ms))

    async def forget_unserved(self, before_ms: int) -> list[str]:
        gone: list[str] = await self._through("forget_unserved", lambda: self.inner.forget_unserved(before_ms))
        return gone

    async def note_shared_spec(
        self, job: str, cluster: str, fingerprint: str, now_ms: int, ttl_ms: int
    ) -> list[SharedSide]:
        sides: list[SharedSide] = await self._through(
            "note_shared_spec", lambda: self.inner.note_shared_spec(job, cluster, fingerprint, now_ms, ttl_ms)
        )
        return sides

    async def drop_shared_spec(self, job: str, cluster: str) -> None:
        await self.inner.drop_shared_spec(job, cluster)

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        await self._through("note_presence", lambda: self.inner.note_presence(instance, now_ms, ttl_ms))

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        found: set[str] = await self._through("present", lambda: self.inner.present(instances, now_ms))
        return found
