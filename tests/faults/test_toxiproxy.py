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
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import ClaimOutcome, ClaimRequest, LeaseBackend, StoreError, new_token
from anarchon.engine.backends import from_url
from anarchon.engine.backends.postgres import CANCEL_GRACE_S
from tests.faults.toxiproxy import (
    BUILD_COMMAND,
    BUILD_SCRIPT,
    ProxiedStore,
    StoreProxy,
    Toxiproxy,
    ToxiproxyMissing,
    find_binary,
)
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
