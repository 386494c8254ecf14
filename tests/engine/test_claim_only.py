"""Claim-only stores (Redis script/stream/idmp, NATS JetStream, RabbitMQ) against real servers.

The claim-only subset of the backend contract: exactly one winner per ``(job, slot)`` under
contention from separate connections and separate OS processes, no collision between jobs,
no lease in the capabilities. Plus each store's own failure modes: the idmp strategy on a
server without idempotent XADD, RabbitMQ's winner losing its connection (and a broker
restart), and the NATS duplicate window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from anarchon.engine import (
    Backend,
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ClaimStore,
    ConfigError,
    HistoryStore,
    LeaseBackend,
    LeaseStore,
    Overlap,
    PresenceStore,
    RunState,
    StoreError,
    new_token,
    observed,
)
from anarchon.engine.backends import from_url
from anarchon.engine.backends.nats import NatsBackend
from anarchon.engine.backends.rabbitmq import RabbitMQBackend
from anarchon.engine.backends.redis_claim import RedisIdmpBackend
from tests.harness.until import until_async

CLAIM_ONLY_STORES = ["redis+script", "redis+stream", "nats", "rabbitmq"]
NOW = 1_800_000_000_000
SLOT = 10_000  # every('10s')
REPO = Path(__file__).resolve().parents[2]


def req(job: str, slot: int, instance: str = "a", token: str | None = None) -> ClaimRequest:
    # lease_ms and overlap are ignored by claim-only stores; pass values a lease store would honour.
    return ClaimRequest(job, slot, instance, token or new_token(), NOW, 6_000, Overlap.SKIP)


def _url_for(request: pytest.FixtureRequest, store: str) -> str:
    if store.startswith("redis+"):
        return store + str(request.getfixturevalue("redis_url")).removeprefix("redis")
    if store == "nats":
        return str(request.getfixturevalue("nats_url"))
    if store == "rabbitmq":
        return str(request.getfixturevalue("amqp_url"))
    raise AssertionError(store)


@pytest.fixture(params=CLAIM_ONLY_STORES)
def claim_url(request: pytest.FixtureRequest) -> str:
    """The URL of a real claim-only store, one per parameter."""
    return _url_for(request, str(request.param))


@pytest.fixture
def make_claim_backend(claim_url: str) -> Callable[..., Backend]:
    """Fresh backends on the same store, each with its own connection (as instances have)."""

    def make(**options: object) -> Backend:
        return from_url(claim_url, **options)

    return make


@pytest.fixture
async def claim_backend(make_claim_backend: Callable[..., Backend]) -> AsyncIterator[Backend]:
    backend = make_claim_backend()
    await backend.setup()
    yield backend
    await backend.close()


async def _open(make: Callable[..., Backend], n: int) -> list[Backend]:
    backends = [make() for _ in range(n)]
    await asyncio.gather(*(b.setup() for b in backends))
    return backends


async def _close(backends: list[Backend]) -> None:
    await asyncio.gather(*(b.close() for b in backends))


# -- the claim-only subset of the contract ---------------------------------------------------


async def test_capabilities_say_no_lease(claim_backend: Backend) -> None:
    assert claim_backend.capabilities.leases is False
    assert not isinstance(claim_backend, LeaseBackend)
    assert claim_backend.capabilities.name in {"redis+script", "redis+stream", "nats", "rabbitmq"}
    assert claim_backend.claim_window_ms > 0  # type: ignore[attr-defined]


async def test_first_claim_wins_and_second_is_taken(claim_backend: Backend, job_name: str) -> None:
    first = await claim_backend.claim(req(job_name, NOW, "a", "tok-a"))
    second = await claim_backend.claim(req(job_name, NOW, "b", "tok-b"))
    assert first.outcome is ClaimOutcome.WON
    run = first.run
    assert run is not None
    assert (run.job, run.slot, run.state, run.attempt, run.instance, run.token, run.lease_until_ms) == (
        job_name,
        NOW,
        RunState.CLAIMED,
        1,
        "a",
        "tok-a",
        0,
    )
    assert (second.outcome, second.run) == (ClaimOutcome.TAKEN, None)
    third = await claim_backend.claim(req(job_name, NOW, "c"))
    assert third.outcome is ClaimOutcome.TAKEN


async def test_concurrent_contenders_have_exactly_one_winner(
    make_claim_backend: Callable[..., Backend], job_name: str
) -> None:
    backends = await _open(make_claim_backend, 8)
    try:
        for n in range(15):
            slot = NOW + n * SLOT
            results = await asyncio.gather(*(b.claim(req(job_name, slot, f"i{k}")) for k, b in enumerate(backends)))
            winners = [r.run.instance for r in results if r.won and r.run is not None]
            assert len(winners) == 1, (slot, results)
            assert all(r.outcome is ClaimOutcome.TAKEN for r in results if not r.won)
    finally:
        await _close(backends)


async def test_many_slots_claimed_all_at_once(make_claim_backend: Callable[..., Backend], job_name: str) -> None:
    backends = await _open(make_claim_backend, 3)
    slots = [NOW + n * SLOT for n in range(150)]
    try:
        results = await asyncio.gather(
            *(b.claim(req(job_name, slot, f"i{k}")) for slot in slots for k, b in enumerate(backends))
        )
        won = sorted(r.run.slot for r in results if r.won and r.run is not None)
        assert won == slots  # every slot exactly once: none lost, none twice
    finally:
        await _close(backends)


async def test_jobs_do_not_collide(claim_backend: Backend, job_name: str) -> None:
    assert (await claim_backend.claim(req(job_name, NOW))).won
    assert (await claim_backend.claim(req(job_name + "-other", NOW))).won
    assert (await claim_backend.claim(req(job_name + ".x", NOW))).won  # dots are separators in NATS/AMQP
    assert (await claim_backend.claim(req(job_name, NOW + SLOT))).won
    assert not (await claim_backend.claim(req(job_name, NOW))).won


async def test_odd_job_names(claim_backend: Backend, job_name: str) -> None:
    """Names with spaces, wildcards and unicode, or very long, still name one run each."""
    for job in (f"{job_name} with space", f"{job_name}.*.>", f"{job_name}-é", job_name + "x" * 300):
        assert (await claim_backend.claim(req(job, NOW))).won, job
        assert not (await claim_backend.claim(req(job, NOW))).won, job


async def test_setup_is_idempotent(make_claim_backend: Callable[..., Backend], job_name: str) -> None:
    backend = make_claim_backend()
    await backend.setup()
    await backend.setup()
    try:
        assert (await backend.claim(req(job_name, NOW))).won
    finally:
        await backend.close()
        await backend.close()


async def test_retry_of_own_claim(claim_backend: Backend, claim_url: str, job_name: str) -> None:
    """A claim resent with the same token (its reply was lost) is still the winner's.

    RabbitMQ cannot tell (reading the queue would weaken the length limit), so there the
    retry is "taken": the run is lost rather than run twice. Documented in the module.
    """
    assert (await claim_backend.claim(req(job_name, NOW, "a", "tok-a"))).won
    retry = await claim_backend.claim(req(job_name, NOW, "a", "tok-a"))
    expected = ClaimOutcome.TAKEN if claim_url.startswith("amqp") else ClaimOutcome.WON
    assert retry.outcome is expected


async def test_window_is_exposed_and_checked(make_claim_backend: Callable[..., Backend]) -> None:
    backend = make_claim_backend()
    window = backend.claim_window_ms  # type: ignore[attr-defined]
    backend.require_window(window - 1)  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="jitter"):
        backend.require_window(window)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    ["redis+script://127.0.0.1:1/0", "redis+stream://127.0.0.1:1/0", "nats://127.0.0.1:1", "amqp://g:g@127.0.0.1:1/"],
)
async def test_unreachable_store_is_a_store_error(url: str) -> None:
    backend = from_url(url)
    started = time.monotonic()
    with pytest.raises(StoreError):
        await backend.setup()
    assert time.monotonic() - started < 15  # promptly, not after minutes of reconnect attempts
    await backend.close()


def test_from_url_dispatch() -> None:
    assert type(from_url("redis+script://h:1/0")).__name__ == "RedisScriptBackend"
    assert type(from_url("rediss+stream://h:1/0")).__name__ == "RedisStreamBackend"
    assert type(from_url("redis+idmp://h:1/0")).__name__ == "RedisIdmpBackend"
    assert isinstance(from_url("nats://h:1"), NatsBackend)
    assert isinstance(from_url("amqp://h:1/"), RabbitMQBackend)
    with pytest.raises(ConfigError, match="strategy"):
        from_url("redis+lua://h:1/0")
    with pytest.raises(ConfigError):
        from_url("redis+script://h:1/0", ttl_ms=0)


def test_each_store_implements_the_concerns_of_its_kind(tmp_path: Path) -> None:
    """Callers take the narrowest interface and tell the kinds apart by it: a claim-only store
    (timed or not) must be no lease or history store, and a lease store all four concerns."""
    concerns = (ClaimStore, PresenceStore, LeaseStore, HistoryStore)
    claim_only = [
        from_url(url) for url in ("redis+script://h:1/0", "redis+stream://h:1/0", "nats://h:1", "amqp://h:1/")
    ]
    leased = [from_url(url) for url in (f"sqlite:///{tmp_path}/s.db", "redis://h:1/0", "postgresql://u@h:1/d")]
    for store in claim_only + [observed(store, lambda *_: None) for store in claim_only]:
        assert [isinstance(store, c) for c in concerns] == [True, True, False, False], store
    for store in leased + [observed(store, lambda *_: None) for store in leased]:
        assert all(isinstance(store, c) for c in concerns) and isinstance(store, LeaseBackend), store


# -- Redis ----------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["script", "stream"])
async def test_redis_claim_keys_expire(redis_url: str, job_name: str, strategy: str) -> None:
    from redis.asyncio import Redis

    backend = from_url(f"redis+{strategy}" + redis_url.removeprefix("redis"), ttl_ms=60_000)
    await backend.setup()
    client = Redis.from_url(redis_url)
    try:
        assert (await backend.claim(req(job_name, NOW))).won
        keys = [k async for k in client.scan_iter(match=f"anarchon:*{job_name}*")]
        assert len(keys) == 1
        ttl = await client.pttl(keys[0])
        assert 0 < ttl <= 60_000
    finally:
        await client.aclose()
        await backend.close()


async def test_redis_stream_claims_older_slot_after_newer(redis_url: str, job_name: str) -> None:
    """One stream per (job, slot): a late first claim of an older slot still wins."""
    backend = from_url("redis+stream" + redis_url.removeprefix("redis"))
    await backend.setup()
    try:
        assert (await backend.claim(req(job_name, NOW + 5 * SLOT))).won
        assert (await backend.claim(req(job_name, NOW))).won
        assert not (await backend.claim(req(job_name, NOW))).won
    finally:
        await backend.close()


async def test_redis_idmp_detection(redis_url: str, job_name: str) -> None:
    """Debian's Redis 7.0 has no idempotent XADD: setup must say so, naming the alternatives.

    On a server that does have it (Redis 8.6+), the strategy must hold the one-winner rule.
    """
    from redis.asyncio import Redis

    client = Redis.from_url(redis_url)
    try:
        docs = await client.execute_command("COMMAND DOCS", "XADD")
    finally:
        await client.aclose()
    url = "redis+idmp" + redis_url.removeprefix("redis")
    if "IDMP" not in repr(docs).upper():
        backend = RedisIdmpBackend(url)
        with pytest.raises(ConfigError, match=r"Redis 8\.6.*does not offer it.*redis\+script://"):
            await backend.setup()
        await backend.close()
        return
    backends = [RedisIdmpBackend(url) for _ in range(5)]  # pragma: no cover - needs Redis 8.6+
    await asyncio.gather(*(b.setup() for b in backends))
    try:
        for slot in (NOW, NOW + SLOT, NOW - SLOT):
            results = await asyncio.gather(*(b.claim(req(job_name, slot)) for b in backends))
            assert sum(r.won for r in results) == 1
    finally:
        await _close(list(backends))


def test_redis_idmp_window_limits() -> None:
    with pytest.raises(ConfigError, match="ttl_ms"):
        RedisIdmpBackend("redis+idmp://h:1/0", ttl_ms=2 * 86_400_000)


# -- NATS -----------------------------------------------------------------------------------


async def test_nats_duplicate_window(nats_url: str, job_name: str) -> None:
    """Within the window a repeat is a duplicate; after it, JetStream forgets the id.

    That second half is why the window must exceed jitter + clock skew + claim latency.
    """
    stream = "T" + job_name.replace("-", "_")
    short = NatsBackend(nats_url, stream=stream, subject_prefix=f"t.{job_name}", duplicate_window_ms=1_000)
    await short.setup()
    try:
        assert short.claim_window_ms == 1_000
        assert (await short.claim(req(job_name, NOW))).won
        await asyncio.sleep(0.3)
        assert not (await short.claim(req(job_name, NOW))).won
        await asyncio.sleep(1.5)
        assert (await short.claim(req(job_name, NOW))).won  # forgotten: a second winner
        with pytest.raises(ConfigError, match="duplicate_window_ms"):
            short.require_window(2_000)
    finally:
        await short.close()


async def test_nats_window_is_widened_never_narrowed(nats_url: str, job_name: str) -> None:
    import nats

    stream = "W" + job_name.replace("-", "_")
    options = {"stream": stream, "subject_prefix": f"w.{job_name}"}
    for window, expected in ((2_000, 2_000), (10_000, 10_000), (2_000, 10_000)):
        backend = NatsBackend(nats_url, duplicate_window_ms=window, **options)  # type: ignore[arg-type]
        await backend.setup()
        assert backend.claim_window_ms == expected
        await backend.close()
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(stream)
        assert info.config.duplicate_window == 10.0
        assert info.config.max_age is not None and info.config.max_age >= 10.0
    finally:
        await nc.close()


def test_nats_window_validation() -> None:
    with pytest.raises(ConfigError, match="duplicate_window_ms"):
        NatsBackend("nats://h:1", duplicate_window_ms=10)


async def test_nats_claim_survives_server_restart(nats_url: str, job_name: str) -> None:
    """The id table is rebuilt from the file store: a claim made before a restart still counts."""
    from tests.servers.nats import server_for

    backend = NatsBackend(nats_url)
    await backend.setup()
    try:
        assert (await backend.claim(req(job_name, NOW))).won
    finally:
        await backend.close()
    server_for(nats_url).restart()
    again = NatsBackend(nats_url)
    await again.setup()
    try:
        assert not (await again.claim(req(job_name, NOW))).won
        assert (await again.claim(req(job_name, NOW + SLOT))).won
    finally:
        await again.close()


async def test_nats_outage_is_a_store_error_then_heals(nats_url: str, job_name: str) -> None:
    from tests.servers.nats import server_for

    server = server_for(nats_url)
    backend = NatsBackend(nats_url, timeout_s=3)
    await backend.setup()
    try:
        assert (await backend.claim(req(job_name, NOW))).won
        server.kill()
        try:
            with pytest.raises(StoreError):
                await backend.claim(req(job_name, NOW + SLOT))
        finally:
            server.start()
        errors: list[str] = []
        result = None
        for _ in range(30):  # the client reconnects on its own, or the backend replaces it
            try:
                result = await backend.claim(req(job_name, NOW + 2 * SLOT))
                break
            except StoreError as exc:
                errors.append(str(exc))
                await asyncio.sleep(0.5)
        assert result is not None and result.won, (result, errors)
        again = await backend.claim(req(job_name, NOW))
        assert not again.won, "the claim made before the crash was forgotten"
    finally:
        await backend.close()


# -- RabbitMQ -------------------------------------------------------------------------------

_HOLDER = """
import asyncio, sys
from anarchon.engine import ClaimRequest
from anarchon.engine.backends import from_url

async def main():
    backend = from_url(sys.argv[1])
    await backend.setup()
    result = await backend.claim(ClaimRequest(sys.argv[2], int(sys.argv[3]), "holder", "tok-holder", 0, 6000))
    print(result.outcome.value, flush=True)
    await asyncio.sleep(3600)  # keep the connection open until killed

asyncio.run(main())
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO), env.get("PYTHONPATH", "")])
    return env


async def _no_connections(ctl: Callable[..., str]) -> None:
    async def none_listed() -> bool:
        out = await asyncio.to_thread(ctl, "list_connections", "pid", "--quiet", "--no-table-headers")
        return not out.strip()

    await until_async("RabbitMQ to list no connection", none_listed, interval=0.5)


async def test_rabbitmq_winner_losing_its_connection_does_not_free_the_run(amqp_url: str, job_name: str) -> None:
    """The winner's process is SIGKILLed with its connection open; the run stays taken."""
    from tests.servers.rabbitmq import server_for

    server = server_for(amqp_url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, amqp_url, job_name, str(NOW), stdout=subprocess.PIPE, env=_env(), cwd=REPO
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"won"
        assert server.ctl("list_connections", "pid", "--quiet", "--no-table-headers").strip()
    finally:
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 10)
    await _no_connections(server.ctl)  # the broker has seen the connection die

    losers = [RabbitMQBackend(amqp_url) for _ in range(5)]
    await asyncio.gather(*(b.setup() for b in losers))
    try:
        results = await asyncio.gather(*(b.claim(req(job_name, NOW, f"late{k}")) for k, b in enumerate(losers)))
        assert [r.outcome for r in results] == [ClaimOutcome.TAKEN] * 5
    finally:
        await _close(list(losers))
    queues = server.ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")
    assert f"anarchon.claim.{job_name}.{NOW}\t1" in queues


async def test_rabbitmq_claim_survives_broker_restart(amqp_url: str, job_name: str) -> None:
    from tests.servers.rabbitmq import server_for

    backend = RabbitMQBackend(amqp_url)
    await backend.setup()
    try:
        assert (await backend.claim(req(job_name, NOW))).won
        await asyncio.to_thread(server_for(amqp_url).restart)
        # The old connection and its channels are gone: the next claim reconnects, and does not
        # fail on a channel kept from before (a claim in flight would be a StoreError).
        again = await backend.claim(req(job_name, NOW))
        assert again.outcome is ClaimOutcome.TAKEN  # durable queue + persistent message
        assert (await backend.claim(req(job_name, NOW + 2 * SLOT))).won
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def _claimed_with_other_expiry(amqp_url: str, job: str) -> AsyncIterator[RabbitMQBackend]:
    """A backend whose queues expire later than those of another that has just won ``job@NOW``."""
    first = RabbitMQBackend(amqp_url, expires_ms=60_000)
    other = RabbitMQBackend(amqp_url, expires_ms=120_000)
    await first.setup()
    await other.setup()
    try:
        assert (await first.claim(req(job, NOW))).won
        yield other
    finally:
        await first.close()
        await other.close()


async def test_rabbitmq_mismatched_expiry_is_a_clear_error(amqp_url: str, job_name: str) -> None:
    async with _claimed_with_other_expiry(amqp_url, job_name) as other:
        with pytest.raises(StoreError, match="same expires_ms"):
            await other.claim(req(job_name, NOW))
        assert (await other.claim(req(job_name, NOW + SLOT))).won  # the channel was reopened


async def test_rabbitmq_a_channel_error_fails_only_its_own_claim(amqp_url: str, job_name: str) -> None:
    """AMQP closes a channel on any error of one of its operations, and fails all the others.

    Claims in flight on a shared channel would fail with the one that erred (CI saw a
    broker race on one queue fail another slot's claim after its publish, an unknown
    outcome: the engine's retry is then nacked and the slot lost). Each claim in flight
    has its own channel, so here only the refused declare fails.
    """
    async with _claimed_with_other_expiry(amqp_url, job_name) as other:
        slots = [NOW + n * SLOT for n in range(1, 41)]
        results = await asyncio.gather(
            other.claim(req(job_name, NOW)),  # refused: PRECONDITION_FAILED closes its channel
            *(other.claim(req(job_name, slot)) for slot in slots),
            return_exceptions=True,
        )
        assert isinstance(results[0], StoreError) and "same expires_ms" in str(results[0])
        failed = [r for r in results[1:] if isinstance(r, BaseException)]
        assert not failed, f"{len(failed)} of 40 claims failed with the refused one: {failed[0]}"
        assert all(isinstance(r, ClaimResult) and r.won for r in results[1:])


def test_rabbitmq_window_validation() -> None:
    with pytest.raises(ConfigError, match="expires_ms"):
        RabbitMQBackend("amqp://h:1/", expires_ms=5)


# -- several OS processes -------------------------------------------------------------------

_WORKER = """
import asyncio, json, sys, time
from anarchon.engine import ClaimRequest, StoreError, new_token
from anarchon.engine.backends import from_url
from anarchon.engine.clock import SystemClock
from anarchon.engine.retry import retry

async def main():
    url, job, first, count, start_at, name = sys.argv[1:7]
    backend = from_url(url)
    await backend.setup()
    gate = asyncio.Semaphore(32)
    clock = SystemClock()

    async def one(slot):
        # As the scheduler claims: a store error is retried with the same token, so a claim
        # that failed after it landed (an unknown outcome) shows up here as a lost slot.
        request = ClaimRequest(job, slot, name, new_token(), 0, 6000)
        async with gate:
            result = await retry(
                lambda: backend.claim(request),
                clock=clock,
                transient=lambda exc: isinstance(exc, StoreError),
                deadline_ms=lambda: int(float(start_at) * 1000) + 60_000,
            )
            return slot if result.won else None

    await asyncio.sleep(max(0.0, float(start_at) - time.time()))  # all processes start together
    slots = [int(first) + n * 10000 for n in range(int(count))]
    won = [s for s in await asyncio.gather(*(one(s) for s in slots)) if s is not None]
    await backend.close()
    print(json.dumps(won))

asyncio.run(main())
"""


@pytest.mark.slow
async def test_three_processes_claim_the_same_1000_slots(claim_url: str, job_name: str) -> None:
    count, processes = 1000, 3
    start_at = time.time() + 8  # enough for every interpreter to import and connect
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", _WORKER, claim_url, job_name, str(NOW), str(count), str(start_at), f"p{k}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(),
            cwd=REPO,
        )
        for k in range(processes)
    ]
    outputs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 300)
    won: list[list[int]] = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()[-2000:]
        won.append(json.loads(out))
    every = [slot for per_process in won for slot in per_process]
    assert len(every) == count, f"{len(every) - len(set(every))} duplicates, {count - len(set(every))} lost"
    assert sorted(every) == [NOW + n * SLOT for n in range(count)]


# -- with the scheduler ---------------------------------------------------------------------


async def test_schedulers_on_a_claim_only_store_run_each_slot_once(claim_url: str, job_name: str) -> None:
    """Three instances, real clock, jitter: every slot's handler runs on exactly one of them."""
    from anarchon.engine.job import RunContext
    from anarchon.engine.scheduler import Scheduler

    seen: list[tuple[str, int]] = []

    async def handler(ctx: RunContext) -> None:
        seen.append((ctx.instance, ctx.slot))

    schedulers = [Scheduler(from_url(claim_url), instance_id=f"i{k}") for k in range(3)]
    for scheduler in schedulers:
        scheduler.every(job_name, "1s", handler, jitter="100ms")  # 1 s: the shortest period (engine.limits)
    await asyncio.gather(*(s.start() for s in schedulers))
    try:
        await asyncio.sleep(6.5)
    finally:
        await asyncio.gather(*(s.stop() for s in schedulers))
        await asyncio.gather(*(s.backend.close() for s in schedulers))
    slots = [slot for _, slot in seen]
    assert len(slots) >= 6, seen
    assert len(slots) == len(set(slots)), f"slots run twice: {sorted(s for s in slots if slots.count(s) > 1)}"
    assert all(slot % 1000 == 0 for slot in slots)


async def test_scheduler_refuses_lease_policies_on_a_claim_only_store(claim_url: str, job_name: str) -> None:
    from anarchon.engine.scheduler import Scheduler

    async def handler(ctx: object) -> None:
        raise AssertionError("must not run")

    scheduler = Scheduler(from_url(claim_url))
    with pytest.raises(ConfigError, match="claim-only"):
        scheduler.every(job_name, "1s", handler, overlap="Skip")
    with pytest.raises(ConfigError, match="claim-only"):
        scheduler.every(job_name, "1s", handler, catch_up="All")


async def test_ping_answers_on_a_live_store(claim_backend: Backend) -> None:
    await claim_backend.ping()  # raises StoreError if the store does not answer
