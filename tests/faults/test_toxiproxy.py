"""The stores' own backends under TCP faults (tests/faults/toxiproxy.py), against real servers.

Every call goes through a toxiproxy proxy in front of a real redis-server or PostgreSQL;
what the server really holds is read by a second backend that bypasses the proxy. What is
checked: a fault surfaces as :class:`StoreError` (never a hang, never another exception)
within a bound the backend's own timeout explains, the backend works again once the fault
is gone, and a call whose reply was lost did happen on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import (
    ClaimOutcome,
    ClaimRequest,
    LeaseBackend,
    RunState,
    StoreError,
    TakeoverRequest,
    new_token,
)
from anarchon.engine.backends import from_url
from anarchon.engine.backends.postgres import CANCEL_GRACE_S, PostgresBackend
from anarchon.engine.backends.redis import RedisBackend
from anarchon.engine.batch import Coalescer
from tests.faults.toxiproxy import (
    BUILD_COMMAND,
    BUILD_SCRIPT,
    ProxiedStore,
    StoreProxy,
    Toxiproxy,
    ToxiproxyMissing,
    find_binary,
)
from tests.harness.until import until_async
from tests.servers.postgres import PostgresServer
from tests.servers.redis import RedisServer

SLOT = 1_800_000_000_000
TIMEOUT_S = 1.0  # the backends' call timeout in these tests (redis socket_timeout_s, postgres command_timeout_s)
PG_CONNECT_TIMEOUT_S = 2  # libpq's smallest connect_timeout: less counts as 2
FAST_S = 1.0  # a refused or reset connection is reported at once; this bounds "at once" on a loaded machine
SLACK_S = 1.5  # on top of a timeout, for a loaded 2-core machine


@dataclass
class Store:
    """One store behind a proxy, and the backends a test opens on it (closed at the end)."""

    kind: str
    proxied: ProxiedStore[Any]
    options: dict[str, Any]
    opened: list[LeaseBackend] = field(default_factory=list)

    @property
    def proxy(self) -> StoreProxy:
        return self.proxied.proxy

    async def _open(self, url: str, options: dict[str, Any]) -> LeaseBackend:
        backend = from_url(url, **options)
        assert isinstance(backend, LeaseBackend)
        self.opened.append(backend)
        await backend.setup()
        return backend

    async def through_proxy(self, **options: Any) -> LeaseBackend:
        """A backend on the proxy, set up (so it holds an open connection), with short timeouts."""
        return await self._open(self.proxied.url, {**self.options, **options})

    async def direct(self) -> LeaseBackend:
        """A backend on the server itself, for what it really holds."""
        return await self._open(self.proxied.direct_url, {})

    def unopened(self, **options: Any) -> LeaseBackend:
        """A backend on the proxy that has no connection yet."""
        backend = from_url(self.proxied.url, **{**self.options, **options})
        assert isinstance(backend, LeaseBackend)
        self.opened.append(backend)
        return backend


OPTIONS: dict[str, dict[str, Any]] = {
    "redis": {"socket_timeout_s": TIMEOUT_S},
    "postgres": {"command_timeout_s": TIMEOUT_S, "connect_timeout_s": PG_CONNECT_TIMEOUT_S},
}


async def _store(kind: str, proxied: ProxiedStore[Any]) -> AsyncIterator[Store]:
    s = Store(kind, proxied, OPTIONS[kind])
    try:
        yield s
    finally:
        s.proxy.clear()
        for backend in s.opened:
            await backend.close()


@pytest.fixture(params=["redis", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    kind = str(request.param)
    async for s in _store(kind, request.getfixturevalue(f"{kind}_behind_proxy")):
        yield s


@pytest.fixture
async def redis_store(redis_behind_proxy: ProxiedStore[RedisServer]) -> AsyncIterator[Store]:
    async for s in _store("redis", redis_behind_proxy):
        yield s


@pytest.fixture
async def postgres_store(postgres_behind_proxy: ProxiedStore[PostgresServer]) -> AsyncIterator[Store]:
    async for s in _store("postgres", postgres_behind_proxy):
        yield s


@pytest.fixture
def job() -> str:
    return f"tox-{uuid.uuid4().hex[:10]}"


def claim_request(job: str, token: str | None = None) -> ClaimRequest:
    return ClaimRequest(job, SLOT, "instance-a", token or new_token(), now_ms=SLOT, lease_ms=30_000)


async def store_error(call: Awaitable[Any], *, within: float, proxy: StoreProxy) -> tuple[StoreError, float]:
    """Await ``call``, which must raise StoreError within ``within`` seconds; the error and the time taken.

    The call is never cancelled by the test: a backend that swallowed the cancellation would
    hang the test too. When the bound passes, the faults are cleared so that it can end, and
    the test fails.
    """
    task = asyncio.ensure_future(call)
    t0 = time.monotonic()
    done, _ = await asyncio.wait({task}, timeout=within)
    elapsed = time.monotonic() - t0
    if not done:
        proxy.clear()
        with contextlib.suppress(BaseException):  # only freeing the loop: the test fails below anyway
            await asyncio.wait_for(task, timeout=30)
        pytest.fail(f"no StoreError within {within:.1f}s: the call was still waiting when the fault was removed")
    exc = task.exception()
    if not isinstance(exc, StoreError):
        pytest.fail(f"expected StoreError within {within:.1f}s, got {exc!r} after {elapsed:.2f}s")
    return exc, elapsed


# -- the tool itself -----------------------------------------------------------------------


def test_toxiproxy_is_the_built_version_on_loopback(toxiproxy: Toxiproxy) -> None:
    script_version = next(
        line.split('"')[1] for line in BUILD_SCRIPT.read_text().splitlines() if line.startswith("TOXIPROXY_VERSION=")
    )
    assert toxiproxy.version() == script_version.removeprefix("v")
    assert toxiproxy.url.startswith("http://127.0.0.1:")
    with pytest.raises(ValueError, match=r"127\.0\.0\.1 only"):
        toxiproxy.proxy("10.0.0.1:6379")


def test_a_fault_is_a_toxic_until_removed(redis_behind_proxy: ProxiedStore[RedisServer]) -> None:
    proxy = redis_behind_proxy.proxy
    assert proxy.host == "127.0.0.1" and proxy.port != redis_behind_proxy.server.port
    assert redis_behind_proxy.url == f"redis://{proxy.listen}/0"
    with proxy.stall():
        assert sorted(t["type"] for t in proxy.toxics()) == ["timeout", "timeout"]
        with proxy.latency(100):
            assert len(proxy.toxics()) == 3
        assert len(proxy.toxics()) == 2
    assert proxy.toxics() == []
    with proxy.down():
        assert proxy.describe()["enabled"] is False
    assert proxy.describe()["enabled"] is True
    proxy.reset()
    proxy.lose_replies()
    proxy.down()
    proxy.clear()
    assert proxy.toxics() == [] and proxy.describe()["enabled"] is True


def test_a_missing_binary_names_the_build_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ANARCHON_TOXIPROXY_BIN_DIR", str(tmp_path))
    with pytest.raises(ToxiproxyMissing, match=r"build-toxiproxy\.sh"):
        find_binary()
    assert "build-toxiproxy.sh" in BUILD_COMMAND


# -- the backends under faults ---------------------------------------------------------------


async def test_ping_and_claim_through_the_proxy(store: Store, job: str) -> None:
    backend = await store.through_proxy()
    await backend.ping()
    result = await backend.claim(claim_request(job))
    assert result.outcome is ClaimOutcome.WON and result.run is not None
    on_server = await (await store.direct()).get_run(job, SLOT)
    assert on_server is not None and on_server.token == result.run.token


async def test_down_fails_at_once_and_up_recovers(store: Store, job: str) -> None:
    backend = await store.through_proxy()
    await backend.ping()
    with store.proxy.down():
        # The open connection is closed under the backend, then a new one is refused.
        await store_error(backend.claim(claim_request(job)), within=FAST_S, proxy=store.proxy)
        await store_error(backend.ping(), within=FAST_S, proxy=store.proxy)
        await store_error(store.unopened().setup(), within=FAST_S, proxy=store.proxy)
    assert await (await store.direct()).get_run(job, SLOT) is None, "the server never saw the claim"
    await backend.ping()  # the first call after the outage reconnects: no stale connection kept
    assert (await backend.claim(claim_request(job))).outcome is ClaimOutcome.WON


async def test_reset_fails_at_once_and_the_server_never_sees_the_call(store: Store, job: str) -> None:
    backend = await store.through_proxy()
    await backend.ping()
    with store.proxy.reset():
        await store_error(backend.claim(claim_request(job)), within=FAST_S, proxy=store.proxy)
        await store_error(backend.ping(), within=FAST_S, proxy=store.proxy)
    assert await (await store.direct()).get_run(job, SLOT) is None
    await backend.ping()
    assert (await backend.claim(claim_request(job))).outcome is ClaimOutcome.WON


async def test_latency_delays_every_reply(store: Store) -> None:
    backend = await store.through_proxy()
    await backend.ping()
    with store.proxy.latency(300):
        t0 = time.monotonic()
        await backend.ping()
        elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 0.3 + SLACK_S
    t0 = time.monotonic()
    await backend.ping()
    assert time.monotonic() - t0 < 0.3


async def test_a_lost_reply_is_an_error_for_a_claim_the_server_made(store: Store, job: str) -> None:
    """The ambiguous failure: StoreError for the caller, a won claim with its token on the server."""
    backend = await store.through_proxy()
    await backend.ping()  # the claim must go out on an open connection
    request = claim_request(job)
    with store.proxy.lose_replies():
        await store_error(backend.claim(request), within=FAST_S, proxy=store.proxy)
    run = await (await store.direct()).get_run(job, SLOT)
    assert run is not None, "the server executed the claim whose reply was lost"
    assert (run.token, run.instance, run.attempt) == (request.token, request.instance, 1)
    # Claiming again with a new token does not find out "it was mine": the run is taken (by us).
    again = await backend.claim(claim_request(job))
    assert again.outcome is ClaimOutcome.TAKEN and again.run is not None
    assert again.run.token == request.token


async def test_redis_stall_ends_at_the_socket_timeout(redis_store: Store, job: str) -> None:
    s = redis_store
    backend = await s.through_proxy()
    await backend.ping()
    with s.proxy.stall():
        _, elapsed = await store_error(backend.claim(claim_request(job)), within=TIMEOUT_S + SLACK_S, proxy=s.proxy)
        assert elapsed >= TIMEOUT_S * 0.9, "a frozen server is noticed by the timeout, nothing earlier"
        # A new connection is stalled as well: bounded by the same timeout.
        await store_error(s.unopened().setup(), within=TIMEOUT_S + SLACK_S, proxy=s.proxy)
    assert await (await s.direct()).get_run(job, SLOT) is None, "a frozen server executes nothing"
    await backend.ping()
    assert (await backend.claim(claim_request(job))).outcome is ClaimOutcome.WON


async def test_redis_hung_reply_ends_at_the_socket_timeout_after_the_claim_was_made(
    redis_store: Store, job: str
) -> None:
    s = redis_store
    backend = await s.through_proxy()
    await backend.ping()
    request = claim_request(job)
    with s.proxy.lose_replies(hang=True):
        _, elapsed = await store_error(backend.claim(request), within=TIMEOUT_S + SLACK_S, proxy=s.proxy)
    assert elapsed >= TIMEOUT_S * 0.9
    run = await (await s.direct()).get_run(job, SLOT)
    assert run is not None and run.token == request.token
    await backend.ping()


async def test_redis_restarted_empty_behind_the_proxy_is_reached_again(redis_store: Store, job: str) -> None:
    s = redis_store
    backend = await s.through_proxy()
    assert (await backend.claim(claim_request(job))).outcome is ClaimOutcome.WON
    s.proxied.server.restart()  # same port, empty store
    try:
        run = await backend.get_run(job, SLOT)
    except StoreError:  # the open connection went with the old server, if the cut reaches us in time
        run = await backend.get_run(job, SLOT)
    assert run is None, "the restarted server lost the run, and the backend reads the new one"


async def test_postgres_stall_on_an_open_connection_ends_soon_after_the_timeout(
    postgres_store: Store, job: str
) -> None:
    """A frozen server under a running query: StoreError within ``command_timeout_s`` + the cancel grace.

    Interrupted, psycopg asks the server to cancel the statement (a cancel request on a new
    connection, which a frozen server never answers: up to 5 s) and waits for it to end (up to
    5 s more). Before, the call lasted ``command_timeout_s`` + ~10 s; a heartbeat stuck that
    long outlives a lease. Now the backend interrupts psycopg again after CANCEL_GRACE_S and
    psycopg closes the connection.
    """
    s = postgres_store
    backend = await s.through_proxy()
    await backend.ping()
    with s.proxy.stall():
        _, elapsed = await store_error(
            backend.claim(claim_request(job)), within=TIMEOUT_S + CANCEL_GRACE_S + SLACK_S, proxy=s.proxy
        )
    assert elapsed >= TIMEOUT_S * 0.9
    assert await (await s.direct()).get_run(job, SLOT) is None, "a frozen server executes nothing"
    await backend.ping()
    assert (await backend.claim(claim_request(job))).outcome is ClaimOutcome.WON


async def test_postgres_stall_at_connect_ends_at_the_connect_timeout(postgres_store: Store) -> None:
    s = postgres_store
    with s.proxy.stall():
        _, elapsed = await store_error(s.unopened().setup(), within=PG_CONNECT_TIMEOUT_S + SLACK_S, proxy=s.proxy)
    assert elapsed >= PG_CONNECT_TIMEOUT_S * 0.9
    await s.unopened().setup()


async def test_heartbeats_of_many_runs_at_once_go_together_on_one_connection(redis_store: Store, job: str) -> None:
    """300 runs' heartbeats at once, over one lease connection with 100 ms each way: all are
    answered, within a few round trips, and every lease moved.

    One round trip each, they queued for the connection past the pool's timeout and failed
    ("No connection available"): at 3,000 jobs a minute, 1,000 runs per instance beating every
    5 s on 10 connections of a busy event loop made backups take over runs that were fine.
    """
    backend = await redis_store.through_proxy(lease_connections=1)
    jobs = [f"{job}-{i}" for i in range(300)]
    requests = [claim_request(j) for j in jobs]
    won = await asyncio.gather(*(backend.claim(r) for r in requests))
    assert {w.outcome for w in won} == {ClaimOutcome.WON}
    beat_at = SLOT + 1_000
    with redis_store.proxy.latency(100):
        t0 = time.monotonic()
        answers = await asyncio.gather(
            *(backend.heartbeat(r.job, SLOT, r.token, beat_at, 30_000) for r in requests), return_exceptions=True
        )
        elapsed = time.monotonic() - t0
    assert answers == [True] * len(requests), [a for a in answers if a is not True][:3]
    assert elapsed < 0.2 * 3 + SLACK_S, elapsed  # a handful of round trips, not 300
    direct = await redis_store.direct()
    leases = [(await direct.get_run(j, SLOT)) for j in jobs]
    assert {run.lease_until_ms for run in leases if run is not None} == {beat_at + 30_000}


# -- the heartbeat batch (Redis, PostgreSQL) under faults ---------------------------------------
#
# The lease stores' heartbeat goes through a Coalescer (anarchon.engine.batch): a call is sent at
# once while fewer than two batches are out, and otherwise waits with the others for the next
# batch, which is one pipeline of EVALSHA (Redis) or one UPDATE (PostgreSQL) on one lease
# connection. These tests put the fault in the way of such a batch of many runs, written on a
# connection that was open and healthy.

LEASE_MS = 30_000
BEAT_AT = SLOT + 1_000  # the heartbeat every run has had before the fault
BEAT_2 = SLOT + 2_000  # the heartbeat that meets the fault
BEAT_3 = SLOT + 3_000  # the heartbeat after it
BATCH = 40  # runs in the batch: ~10 kB of EVALSHA, which Redis reads and runs in one go


def call_timeout_s(s: Store) -> float:
    """How long a call that gets no reply lasts: the timeout, and on PostgreSQL the cancel's grace."""
    return TIMEOUT_S + (CANCEL_GRACE_S if s.kind == "postgres" else 0.0)


@dataclass
class Beats:
    """Runs of one backend on the proxy, claimed and heartbeating, and the batches they went in."""

    store: Store
    backend: RedisBackend | PostgresBackend
    runs: list[ClaimRequest]
    blockers: list[ClaimRequest]  # two more runs, whose heartbeats take the Coalescer's two slots
    sizes: list[int] = field(default_factory=list)  # the size of each batch the Coalescer sent, in order
    _before: Callable[[], object] | None = None
    _blocking: list[asyncio.Future[bool]] = field(default_factory=list)
    _sent: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        send = self.coalescer.send

        async def spy(beats: list[Any]) -> Sequence[Any]:
            self.sizes.append(len(beats))
            if self._before is not None and len(beats) == len(self.runs):
                self._before, before = None, self._before
                await asyncio.wait(self._blocking)  # the fault meets this batch alone
                before()
                self._sent.set()
            return await send(beats)

        self.coalescer.send = spy

    @property
    def coalescer(self) -> Coalescer[Any, Any]:
        return self.backend._beats

    def beat(self, run: ClaimRequest, at: int) -> asyncio.Future[bool]:
        return asyncio.ensure_future(self.backend.heartbeat(run.job, SLOT, run.token, at, LEASE_MS))

    async def beat_all(self, at: int) -> list[object]:
        """Every run's heartbeat at once (the first two go alone, the others in one batch)."""
        return list(await asyncio.gather(*(self.beat(r, at) for r in self.runs), return_exceptions=True))

    async def leases(self) -> list[int | None]:
        """Each run's lease end as the server holds it (read past the proxy)."""
        direct = await self.store.direct()
        runs = [await direct.get_run(r.job, SLOT) for r in self.runs]
        return [None if run is None else run.lease_until_ms for run in runs]

    def idle(self) -> None:
        """The Coalescer holds nothing: no batch out, no call waiting (its two slots are free again)."""
        assert (len(self.coalescer._out), len(self.coalescer._pending)) == (0, 0)

    async def batch_meets(self, fault: Callable[[], object], at: int) -> list[asyncio.Future[bool]]:
        """Every run's heartbeat in one batch of its own, sent on an open connection with
        ``fault()`` put in place just before (it stays until the test removes it).

        The blockers' heartbeats go first, each alone (the Coalescer's two slots); the runs'
        heartbeats meanwhile wait together, and go as one batch when the first blocker is
        answered, once the second is too (so that the fault meets the batch alone), on a
        connection one of them has just used. What the blockers get is not checked.
        """
        self._before = fault
        self._sent.clear()
        self._blocking = [self.beat(blocker, at) for blocker in self.blockers]
        for blocker in self._blocking:  # their outcome is read here, so that no error goes unretrieved
            blocker.add_done_callback(lambda b: b.cancelled() or b.exception())
        await asyncio.sleep(0)
        assert len(self.coalescer._out) == 2, "the blockers' heartbeats take the two slots"
        batch = [self.beat(r, at) for r in self.runs]
        await asyncio.sleep(0)
        assert len(self.coalescer._pending) == len(self.runs), "the runs' heartbeats wait together"
        await asyncio.wait_for(self._sent.wait(), timeout=FAST_S)
        assert self.sizes[-3:] == [1, 1, len(self.runs)], self.sizes
        return batch


async def heartbeating(s: Store, job: str, n: int = BATCH) -> Beats:
    """``n`` runs claimed, each heartbeat once at BEAT_AT (which opens the lease connections)."""
    backend = await s.through_proxy()
    assert isinstance(backend, (RedisBackend, PostgresBackend))
    runs = [claim_request(f"{job}-{i}") for i in range(n)]
    blockers = [claim_request(f"{job}-blocker-{i}") for i in range(2)]
    won = await asyncio.gather(*(backend.claim(r) for r in runs + blockers))
    assert {w.outcome for w in won} == {ClaimOutcome.WON}
    beats = Beats(s, backend, runs, blockers)
    assert await beats.beat_all(BEAT_AT) == [True] * n
    assert beats.sizes == [1, 1, n - 2], "the batch path: two alone, then the others together"
    assert await beats.leases() == [BEAT_AT + LEASE_MS] * n
    beats.idle()
    return beats


async def settle(
    calls: Sequence[asyncio.Future[Any]], *, within: float, proxy: StoreProxy
) -> list[tuple[BaseException | None, float]]:
    """Wait for every call, which must raise StoreError within ``within`` seconds: for each,
    its exception and when it ended (seconds from now).

    A call still waiting then fails the test (the faults are cleared first, so that it ends);
    so does one that returned, or raised anything else.
    """
    t0 = time.monotonic()
    ended: dict[asyncio.Future[Any], float] = {}
    for call in calls:
        call.add_done_callback(lambda c: ended.setdefault(c, time.monotonic() - t0))
    _, waiting = await asyncio.wait(calls, timeout=within)
    if waiting:
        proxy.clear()
        await asyncio.wait(waiting, timeout=30)
        pytest.fail(f"{len(waiting)} of {len(calls)} heartbeats still waiting {within:.1f}s after the fault came")
    wrong = [c.exception() or c.result() for c in calls if not isinstance(c.exception(), StoreError)]
    assert not wrong, f"{len(wrong)} of {len(calls)} heartbeats did not raise StoreError: {wrong[:3]}"
    return [(c.exception(), ended[c]) for c in calls]


@pytest.mark.parametrize("fault", ["reset", "down"])
async def test_heartbeat_batch_cut_fails_each_heartbeat_at_once_then_recovers(
    store: Store, job: str, fault: str
) -> None:
    """A batch whose connection is reset, or whose proxy goes down, under it: StoreError for each
    of its heartbeats at once, nothing done on the server; once the fault is gone the same runs'
    next heartbeats go together again and each returns True (no broken connection kept, no
    slot of the Coalescer lost)."""
    s = store
    beats = await heartbeating(s, job)
    cut = s.proxy.reset if fault == "reset" else s.proxy.down
    batch = await beats.batch_meets(cut, BEAT_2)
    outcomes = await settle(batch, within=FAST_S, proxy=s.proxy)
    assert len(outcomes) == BATCH
    # Calls made while the fault is still there fail at once too (a new connection is refused or reset).
    later = [beats.beat(r, BEAT_2) for r in beats.runs]
    await settle(later, within=FAST_S, proxy=s.proxy)
    beats.idle()
    assert await beats.leases() == [BEAT_AT + LEASE_MS] * BATCH, "the server never saw the batch"
    s.proxy.clear()
    assert await beats.beat_all(BEAT_3) == [True] * BATCH
    assert beats.sizes[-1] == BATCH - 2, "they went together again"
    assert await beats.leases() == [BEAT_3 + LEASE_MS] * BATCH
    beats.idle()


async def test_heartbeat_batch_stalled_ends_at_the_call_timeout_and_frees_its_slot(store: Store, job: str) -> None:
    """A batch that gets no reply (a frozen server): StoreError for each heartbeat at the call
    timeout, not before and not much after. Calls made meanwhile are not held for ever: one
    goes at once in the free slot, one waiting for a slot goes when the stalled batch ends
    (at most one call's timeout more); all ended, the Coalescer holds nothing, and after the
    stall the runs' heartbeats succeed."""
    s = store
    timeout = call_timeout_s(s)
    beats = await heartbeating(s, job)
    batch = await beats.batch_meets(s.proxy.stall, BEAT_2)
    alone = beats.beat(beats.runs[0], BEAT_2)  # one slot is free: it goes at once
    await asyncio.sleep(0)
    queued = beats.beat(beats.runs[1], BEAT_2)  # both slots taken: it waits for one
    await asyncio.sleep(0)
    assert (len(beats.coalescer._out), len(beats.coalescer._pending)) == (2, 1)
    outcomes = await settle([*batch, alone, queued], within=2 * timeout + SLACK_S, proxy=s.proxy)
    *in_batch, (_, alone_s), (_, queued_s) = outcomes
    assert all(("Timeout" in str(exc) or "no answer within" in str(exc)) for exc, _ in in_batch), in_batch[0]
    batch_s = [t for _, t in in_batch]
    assert min(batch_s) >= TIMEOUT_S * 0.9 and max(batch_s) < timeout + SLACK_S, batch_s
    assert TIMEOUT_S * 0.9 <= alone_s < timeout + SLACK_S, alone_s
    # It waited for the first batch out to end (one timeout), then for its own call (one more).
    assert TIMEOUT_S * 0.9 <= queued_s < 2 * timeout + SLACK_S, queued_s
    beats.idle()
    assert await beats.leases() == [BEAT_AT + LEASE_MS] * BATCH, "a frozen server runs nothing"
    s.proxy.clear()
    assert await beats.beat_all(BEAT_3) == [True] * BATCH
    assert await beats.leases() == [BEAT_3 + LEASE_MS] * BATCH
    beats.idle()


async def test_heartbeat_batches_stalled_and_given_up_free_their_slots_and_connections_at_once(
    store: Store, job: str
) -> None:
    """A stalled batch (a frozen server) whose callers give up, as an attempt does when its next
    beat is due: the batch is cancelled with its connection, the heartbeat made next goes out at
    once (and ends at its own timeout), and once the stall is over the runs' heartbeats succeed
    at once. Before, a heartbeat made then waited for a free slot until a stalled batch timed
    out (on PostgreSQL there was no batch, and it waited for a free lease connection)."""
    s = store
    beats = await heartbeating(s, job)
    batch = await beats.batch_meets(s.proxy.stall, BEAT_2)
    # Both slots stalled: the batch's, and a heartbeat whose caller keeps waiting.
    kept = beats.beat(beats.blockers[0], BEAT_2)
    coalescer = beats.coalescer
    await until_async("both slots stalled", lambda: len(coalescer._out) == 2 and not coalescer._pending, timeout=10)
    for call in batch:
        call.cancel()
    await asyncio.sleep(0.1)
    assert len(beats.coalescer._out) == 1, "the given-up batch left its slot"
    sent = len(beats.sizes)
    late = beats.beat(beats.runs[0], BEAT_2)
    await asyncio.sleep(0.1)
    assert len(beats.sizes) == sent + 1, "it went out at once"
    await settle([late, kept], within=call_timeout_s(s) + SLACK_S, proxy=s.proxy)
    s.proxy.clear()
    t0 = time.monotonic()
    assert await beats.beat_all(BEAT_3) == [True] * BATCH
    assert time.monotonic() - t0 < FAST_S, "no heartbeat waited for a stalled call"
    assert await beats.leases() == [BEAT_3 + LEASE_MS] * BATCH
    beats.idle()


@pytest.mark.parametrize("hang", [False, True], ids=["closed", "hung"])
async def test_heartbeat_batch_whose_reply_is_lost_was_done_and_a_retry_is_true(
    store: Store, job: str, hang: bool
) -> None:
    """The store ran the batch's heartbeats and their replies were lost (the connection closed as
    they came, or they never came): StoreError for each (at once, or at the call timeout),
    every lease was moved all the same, and each heartbeat sent again with the same token
    returns True and leaves the lease where it is (a heartbeat done twice is done once)."""
    s = store
    beats = await heartbeating(s, job)
    batch = await beats.batch_meets(lambda: s.proxy.lose_replies(hang=hang), BEAT_2)
    outcomes = await settle(batch, within=(call_timeout_s(s) + SLACK_S) if hang else FAST_S, proxy=s.proxy)
    if hang:
        assert min(t for _, t in outcomes) >= TIMEOUT_S * 0.9, "no reply is noticed at the call timeout"
    assert await beats.leases() == [BEAT_2 + LEASE_MS] * BATCH, "the server ran every heartbeat of the batch"
    s.proxy.clear()
    assert await beats.beat_all(BEAT_2) == [True] * BATCH, "the same heartbeat again: still the holder"
    assert beats.sizes[-1] == BATCH - 2
    assert await beats.leases() == [BEAT_2 + LEASE_MS] * BATCH
    assert await beats.beat_all(BEAT_3) == [True] * BATCH
    assert await beats.leases() == [BEAT_3 + LEASE_MS] * BATCH
    beats.idle()


async def test_heartbeat_batch_answers_each_heartbeat_on_its_own(store: Store, job: str) -> None:
    """One batch of heartbeats of current and fenced attempts: each gets its own answer (True
    for the holder, False for a token taken over, released, finished or never claimed), and
    only the holders' leases move. A refused heartbeat is an answer, not a failure of the batch."""
    s = store
    beats = await heartbeating(s, job, n=24)
    backend, runs = beats.backend, beats.runs
    expired = BEAT_AT + LEASE_MS + 1
    taken = runs[0::4]  # taken over by another instance once their lease ran out: their tokens are stale
    takeovers = [
        await backend.takeover(TakeoverRequest(r.job, SLOT, "instance-b", new_token(), expired, LEASE_MS, 3))
        for r in taken
    ]
    assert {t.outcome for t in takeovers} == {ClaimOutcome.WON}
    released, finished = runs[1], runs[2]
    assert await backend.release(released.job, SLOT, released.token, expired, "handed over")
    assert await backend.finish(finished.job, SLOT, finished.token, expired, RunState.SUCCEEDED)
    never = claim_request(f"{job}-never")  # no such run
    new_holders = [
        ClaimRequest(r.job, SLOT, "instance-b", t.run.token, expired, LEASE_MS)
        for r, t in zip(taken, takeovers, strict=True)
        if t.run is not None
    ]
    stale = {r.token for r in [*taken, released, finished, never]}
    mixed = [*runs, never, *new_holders]
    now, far = expired + 1_000, expired + 600_000  # a refused heartbeat must not move a lease to `far`
    answers = await asyncio.gather(
        *(beats.beat(b, now) for b in beats.blockers),
        *(beats.beat(r, far if r.token in stale else now) for r in mixed),
        return_exceptions=True,
    )
    assert beats.sizes[-3:] == [1, 1, len(mixed)], "the mixed heartbeats went in one batch"
    assert answers[2:] == [r.token not in stale for r in mixed]
    assert answers.count(False) == len(stale) and answers.count(True) == len(mixed) - len(stale) + 2
    direct = await s.direct()
    for r in runs:
        run = await direct.get_run(r.job, SLOT)
        assert run is not None
        if r is released:
            assert (run.token, run.lease_until_ms) == ("", expired)
        elif r is finished:
            assert (run.state, run.lease_until_ms) == (RunState.SUCCEEDED, 0)
        else:
            assert run.lease_until_ms == now + LEASE_MS, (r.job, run)
            assert run.token == (r.token if r not in taken else next(n.token for n in new_holders if n.job == r.job))
    assert await direct.get_run(never.job, SLOT) is None
    beats.idle()
