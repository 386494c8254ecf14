"""What only the Redis backend has: its key layout, its scripts, its outages, its retention.

The lease rules themselves are in test_conformance.py; here a differential test also plays
the same random sequences of operations against Redis and against SQLite (which calls
``transitions`` directly) and demands identical answers and identical stored records.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot

from anarchon.engine import (
    ClaimOutcome,
    ClaimRequest,
    ConfigError,
    Overlap,
    RunState,
    StoreError,
    StoreLostState,
    TakeoverRequest,
)
from anarchon.engine.backends import from_url
from anarchon.engine.backends.redis import RedisBackend, redact_url
from anarchon.engine.backends.sqlite import SqliteBackend
from tests.harness.until import until_async
from tests.servers.redis import RedisServer, free_port, start_or_fail

NOW = 1_800_000_000_000
LEASE = 6_000


def req(
    job: str, slot: int, instance: str = "a", token: str = "t", now: int = NOW, overlap: Overlap = Overlap.ALLOW
) -> ClaimRequest:
    return ClaimRequest(job, slot, instance, token, now, LEASE, overlap)


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def backend(redis_url: str, prefix: str) -> AsyncIterator[RedisBackend]:
    async with RedisBackend(redis_url, prefix=prefix) as b:
        assert isinstance(b, RedisBackend)
        yield b


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, which it may pause, kill and restart."""
    server = start_or_fail()
    try:
        yield server
    finally:
        server.stop()


# -- keys --------------------------------------------------------------------------------


async def test_key_layout_and_types(backend: RedisBackend, prefix: str) -> None:
    await backend.claim(req("sync", 1000, token="t1"))
    await backend.claim(req("sync", 2000, token="t2"))
    await backend.finish("sync", 1000, "t1", NOW + 1, RunState.SUCCEEDED)
    await backend.schedule_since("sync", "every:1000", NOW)
    r = backend.client
    keys = sorted(await r.keys(f"{prefix}:*"))
    assert keys == sorted(
        [
            f"{prefix}:{{sync}}:run:1000",
            f"{prefix}:{{sync}}:run:2000",
            f"{prefix}:{{sync}}:active",
            f"{prefix}:{{sync}}:runs",
            f"{prefix}:{{sync}}:schedule",
            f"{prefix}:{{sync}}:epoch",
            f"{prefix}:leases",
        ]
    )
    assert await r.type(f"{prefix}:{{sync}}:run:1000") == "hash"
    assert await r.type(f"{prefix}:{{sync}}:epoch") == "string"
    assert await r.type(f"{prefix}:{{sync}}:active") == "zset"
    assert await r.zrange(f"{prefix}:{{sync}}:active", 0, -1) == ["2000"]
    assert await r.zrange(f"{prefix}:{{sync}}:runs", 0, -1, withscores=True) == [("1000", 1000.0), ("2000", 2000.0)]
    fields = await r.hgetall(f"{prefix}:{{sync}}:run:1000")
    assert fields["state"] == "Succeeded" and fields["token"] == "t1" and "error" not in fields
    assert await r.hgetall(f"{prefix}:{{sync}}:schedule") == {"fingerprint": "every:1000", "since": str(NOW)}
    # The one index of leases across jobs: the active run's key, scored by its lease's end.
    assert await r.zrange(f"{prefix}:leases", 0, -1, withscores=True) == [
        (f"{prefix}:{{sync}}:run:2000", float(NOW + LEASE))
    ]
    # Every key of the job is in one cluster hash slot, the one of the bare job name.
    assert {key_slot(str(k).encode()) for k in keys if "{" in k} == {key_slot(b"sync")}


@pytest.mark.parametrize("job", ["a{b", "a}b", "}x", "{y}", "%7B", "", "sp ace:colon"])
async def test_awkward_job_names_keep_one_hash_slot(backend: RedisBackend, job: str) -> None:
    await backend.claim(req(job, 1, token="t1", overlap=Overlap.SKIP))
    assert (await backend.claim(req(job, 2, overlap=Overlap.SKIP))).outcome is ClaimOutcome.SKIPPED
    keys = [backend.run_key(job, 1), backend.run_key(job, 2), backend.active_key(job), backend.runs_key(job)]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    run = await backend.get_run(job, 1)
    assert run is not None and run.job == job
    assert [r.slot for r in await backend.history(job)] == [2, 1]


async def test_names_that_encode_alike_do_not_collide(backend: RedisBackend) -> None:
    """'{' is stored as '%7B', so the literal name '%7B' must not share its keys."""
    assert (await backend.claim(req("{", 1))).won
    assert (await backend.claim(req("%7B", 1))).won
    assert backend.run_key("{", 1) != backend.run_key("%7B", 1)


async def test_prefixes_isolate_stores(redis_url: str, prefix: str) -> None:
    async with RedisBackend(redis_url, prefix=prefix + "-a") as a, RedisBackend(redis_url, prefix=prefix + "-b") as b:
        assert (await a.claim(req("j", 1))).won
        assert (await b.claim(req("j", 1))).won


async def test_a_redis_cluster_is_refused_with_a_clear_error(prefix: str) -> None:
    """On a real (one-node) Redis Cluster, setup() says why the lease store cannot work there.

    Its scripts keep one index of every job's leases (the backups' one query a heartbeat)
    beside the job's own keys: two hash slots, which a Cluster refuses at the first claim
    with CROSSSLOT (or, for scripts without a ``#!lua`` shebang, runs on the wrong node).
    """
    import redis.asyncio as aioredis

    cluster_args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    # The bus port defaults to port + 10000, impossible above 55535: give it a free one.
    server = start_or_fail(extra_args=[*cluster_args, "--cluster-port", str(free_port())])
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        await client.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")  # type: ignore[no-untyped-call]
        backend = RedisBackend(server.url, prefix=prefix)
        with pytest.raises(ConfigError, match="Redis Cluster node: the redis:// lease store needs one primary"):
            await backend.setup()
        await backend.close()
    finally:
        await client.aclose()
        server.stop()


def test_prefix_with_braces_is_refused() -> None:
    with pytest.raises(ConfigError):
        RedisBackend("redis://127.0.0.1:1/0", prefix="a{b}")


def test_from_url_makes_a_redis_backend() -> None:
    backend = from_url("redis://127.0.0.1:1/0", prefix="x")
    assert isinstance(backend, RedisBackend) and backend.prefix == "x"
    assert backend.capabilities.name == "redis" and backend.capabilities.leases


# -- scripts -----------------------------------------------------------------------------


async def test_scripts_are_reloaded_after_script_flush(backend: RedisBackend) -> None:
    assert (await backend.claim(req("j", 1, token="t1"))).won
    await backend.client.script_flush()
    assert await backend.client.script_exists(backend._claim.sha) == [False]
    # Every kind of call still works: redis-py answers NOSCRIPT with SCRIPT LOAD + EVALSHA.
    assert (await backend.claim(req("j", 2, token="t2"))).won
    assert await backend.heartbeat("j", 1, "t1", NOW + 1, LEASE)
    assert await backend.finish("j", 1, "t1", NOW + 2, RunState.SUCCEEDED)
    assert [r.slot for r in await backend.active_runs("j")] == [2]
    assert await backend.client.script_exists(backend._claim.sha) == [True]


async def test_setup_loads_every_script(redis_url: str, prefix: str) -> None:
    async with RedisBackend(redis_url, prefix=prefix) as b:
        assert isinstance(b, RedisBackend)
        await b.client.script_flush()
        await b.setup()
        shas = [s.sha for s in b._scripts]
        assert await b.client.script_exists(*shas) == [True] * len(shas)


async def test_a_script_bug_or_bad_reply_is_a_store_error(backend: RedisBackend) -> None:
    """Wrong data under our key (here: a string where a hash belongs) surfaces as StoreError."""
    await backend.client.set(backend.run_key("j", 1), "not a hash")
    with pytest.raises(StoreError, match="WRONGTYPE"):
        await backend.heartbeat("j", 1, "t", NOW, LEASE)


async def test_claim_is_one_round_trip(backend: RedisBackend) -> None:
    """The claim (with the Skip check) is one command on the server: one EVALSHA."""
    await backend.claim(req("warm", 1))
    before = await backend.client.info("commandstats")
    await backend.claim(req("j", 1, overlap=Overlap.SKIP))
    after = await backend.client.info("commandstats")

    def calls(stats: dict[str, dict[str, int]], name: str) -> int:
        return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))

    assert calls(after, "evalsha") - calls(before, "evalsha") == 1
    assert calls(after, "eval") == calls(before, "eval")
    assert calls(after, "multi") == calls(before, "multi")


async def test_many_instances_claim_one_slot_once(redis_url: str, prefix: str) -> None:
    backends = [RedisBackend(redis_url, prefix=prefix) for _ in range(8)]
    await asyncio.gather(*(b.setup() for b in backends))
    try:
        for slot in range(30):
            overlap = [Overlap.ALLOW, Overlap.SKIP, Overlap.REPLACE][slot % 3]
            results = await asyncio.gather(
                *(b.claim(req("j", slot, f"i{n}", f"t{slot}-{n}", overlap=overlap)) for n, b in enumerate(backends))
            )
            winners = [r for r in results if r.won]
            assert len(winners) == 1
            assert all(r.outcome is ClaimOutcome.TAKEN for r in results if not r.won)
            stored = await backends[0].get_run("j", slot)
            assert stored is not None and winners[0].run is not None and stored.token == winners[0].run.token
            await backends[0].finish("j", slot, stored.token, NOW, RunState.SUCCEEDED)
    finally:
        await asyncio.gather(*(b.close() for b in backends))


# -- outages -----------------------------------------------------------------------------


async def test_store_down_is_a_store_error_then_recovers(own_server: RedisServer, prefix: str) -> None:
    async with RedisBackend(own_server.url, prefix=prefix, socket_timeout_s=1.0) as b:
        assert isinstance(b, RedisBackend)
        assert (await b.claim(req("j", 1, token="t1"))).won
        own_server.kill()
        with pytest.raises(StoreError, match=f"127.0.0.1:{own_server.port}"):
            await b.claim(req("j", 2))
        with pytest.raises(StoreError):
            await b.heartbeat("j", 1, "t1", NOW, LEASE)
        own_server.restart()  # same port, empty store, no scripts loaded
        # The pooled connections died with the old server: the next call reconnects, and
        # learns that the store lost the job's records (the claim is not applied then).
        with pytest.raises(StoreLostState):
            await b.claim(req("j", 2, token="t2"))
        assert await b.get_run("j", 2) is None
        assert (await b.claim(req("j", 2, token="t2"))).won
        assert await b.heartbeat("j", 2, "t2", NOW + 1, LEASE)
        assert await b.get_run("j", 1) is None  # that store is gone (persistence is off)


async def test_frozen_store_times_out_as_store_error(own_server: RedisServer, prefix: str) -> None:
    async with RedisBackend(own_server.url, prefix=prefix, socket_timeout_s=0.3) as b:
        assert isinstance(b, RedisBackend)
        own_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StoreError, match="Timeout"):
                await b.claim(req("j", 1))
            assert time.monotonic() - started < 2.0  # no hidden retry loop
        finally:
            own_server.resume()
        # A claim that timed out may still have been executed by the server after it woke
        # up: the run then exists, with the token of the lost reply.
        result = await b.claim(req("j", 1, token="again"))
        assert result.outcome in (ClaimOutcome.WON, ClaimOutcome.TAKEN)
        if result.outcome is ClaimOutcome.TAKEN:
            assert result.run is not None and result.run.token == "t"
        assert (await b.claim(req("j", 2))).won


async def test_a_cancelled_call_never_leaves_its_reply_for_the_next(own_server: RedisServer, prefix: str) -> None:
    """A claim cancelled mid-flight (say by a timeout around it) must not desynchronise the
    connection: its late reply must never be read as the answer to a later command."""
    async with RedisBackend(own_server.url, prefix=prefix) as b:
        assert isinstance(b, RedisBackend)
        assert (await b.claim(req("j", 1, token="t1"))).won
        own_server.pause()
        try:
            pending = asyncio.create_task(b.claim(req("j", 2, token="t2")))
            await asyncio.sleep(0.2)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        finally:
            own_server.resume()
        for _ in range(5):
            one = await b.get_run("j", 1)
            assert one is not None and one.slot == 1 and one.token == "t1"
            assert await b.last_slot("j") in (1, 2)
        assert (await b.claim(req("j", 3, token="t3"))).won


async def test_takeover_at_exactly_the_end_of_the_lease(backend: RedisBackend) -> None:
    """``lease_until <= now`` is expired, as in Run.lease_expired."""
    await backend.claim(req("j", 1, token="t1"))
    early = await backend.takeover(TakeoverRequest("j", 1, "b", "t2", NOW + LEASE - 1, LEASE, 3))
    assert early.outcome is ClaimOutcome.TAKEN and early.run is not None and early.run.token == "t1"
    exact = await backend.takeover(TakeoverRequest("j", 1, "b", "t2", NOW + LEASE, LEASE, 3))
    assert exact.won and exact.run is not None and exact.run.attempt == 2


async def test_heartbeat_never_shortens_the_lease(backend: RedisBackend) -> None:
    await backend.claim(req("j", 1, token="t1"))
    assert await backend.heartbeat("j", 1, "t1", NOW + 10, LEASE // 4)
    run = await backend.get_run("j", 1)
    assert run is not None and run.lease_until_ms == NOW + LEASE and run.state is RunState.RUNNING
    assert run.updated_ms == NOW + 10


async def test_error_messages_do_not_show_the_password(prefix: str) -> None:
    port = free_port()  # nobody listens here
    b = RedisBackend(f"redis://user:s3cret@127.0.0.1:{port}/0?password=s3cret", prefix=prefix)
    try:
        with pytest.raises(StoreError) as info:
            await b.setup()
        assert "s3cret" not in str(info.value)
        assert f"redis://user@127.0.0.1:{port}/0" in str(info.value)
    finally:
        await b.close()


def test_redact_url() -> None:
    assert redact_url("redis://:pw@h:1/2") == "redis://h:1/2"
    assert redact_url("rediss://u:pw@h/0?password=pw") == "rediss://u@h/0"
    assert redact_url("redis://h") == "redis://h"


async def test_close_leaves_a_shared_client_open(redis_url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url, decode_responses=False)  # bytes replies work too
    try:
        async with RedisBackend(redis_url, prefix=prefix, client=client) as b:
            assert (await b.claim(req("j", 1, token="t1"))).won
            run = await b.get_run("j", 1)  # type: ignore[attr-defined]
            assert run is not None and run.token == "t1"
        assert await client.ping()
    finally:
        await client.aclose()


# -- retention ---------------------------------------------------------------------------


async def test_retention_expires_final_runs_only(redis_url: str, prefix: str) -> None:
    retention = 1_000  # long enough that a stalled test machine still sees the TTLs below
    async with RedisBackend(redis_url, prefix=prefix, retention_ms=retention) as b:
        assert isinstance(b, RedisBackend)
        await b.claim(req("j", 1, token="t1"))
        await b.claim(req("j", 2, token="t2"))
        await b.claim(req("j", 3, token="t3"))
        await b.finish("j", 1, "t1", NOW, RunState.SUCCEEDED)
        await b.takeover(TakeoverRequest("j", 2, "b", "x", NOW + LEASE, LEASE, 1))  # exhausted: Interrupted
        skipped = await b.claim(req("j", 4, overlap=Overlap.SKIP))
        assert skipped.outcome is ClaimOutcome.SKIPPED
        r = b.client
        for slot in (1, 2, 4):
            assert 0 < await r.pttl(b.run_key("j", slot)) <= retention
        assert await r.pttl(b.run_key("j", 3)) == -1  # active: never expires
        assert await r.pttl(b.runs_key("j")) == -1
        assert sorted(await r.zrange(b.expiring_key("j"), 0, -1)) == ["1", "2", "4"]
        await _expired(b, b.run_key("j", 1), b.run_key("j", 2), b.run_key("j", 4))
        assert await b.get_run("j", 1) is None and await b.get_run("j", 2) is None
        assert await b.get_run("j", 3) is not None
        assert [x.slot for x in await b.history("j")] == [3]
        assert [x.slot for x in await b.active_runs("j")] == [3]
        # The newest slot survives its run's expiry, so catch-up keeps its base.
        assert await b.last_slot("j") == 4
        # Claims trim index entries whose run expired (by the callers' clock too), keeping
        # the newest.
        await b.claim(req("j", 5, token="t5", now=NOW + 100))
        assert await r.zrange(b.runs_key("j"), 0, -1) == ["1", "2", "3", "4", "5"]  # not due by now_ms
        await b.claim(req("j", 6, token="t6", now=NOW + LEASE + 1_000))
        assert await r.zrange(b.runs_key("j"), 0, -1) == ["3", "5", "6"]
        assert await r.zrange(b.expiring_key("j"), 0, -1) == []
        assert await b.last_slot("j") == 6


async def _expired(b: RedisBackend, *keys: str) -> None:
    """Redis expires lazily and in the background: poll."""

    async def gone() -> bool:
        return not await b.client.exists(*keys)

    await until_async(f"{keys} to expire", gone, interval=0.05)


async def test_retention_keeps_the_newest_slot_through_catch_up_claims(redis_url: str, prefix: str) -> None:
    """A catch-up claim of an older slot must not trim the newest index entry, whose run
    expired: last_slot, the base of catch-up, would step back and rerun slots."""
    async with RedisBackend(redis_url, prefix=prefix, retention_ms=200) as b:
        assert isinstance(b, RedisBackend)
        await b.claim(req("j", 5, token="t5"))
        await b.finish("j", 5, "t5", NOW, RunState.SUCCEEDED)
        await _expired(b, b.run_key("j", 5))
        assert (await b.claim(req("j", 1, token="t1", now=NOW + 60_000))).won  # an older slot
        assert await b.last_slot("j") == 5
        assert await b.client.zrange(b.runs_key("j"), 0, -1) == ["1", "5"]


async def test_prune_clears_both_indexes_of_expired_runs(redis_url: str, prefix: str) -> None:
    async with RedisBackend(redis_url, prefix=prefix, retention_ms=200) as b:
        assert isinstance(b, RedisBackend)
        for slot in (1, 2):
            await b.claim(req("j", slot, token=f"t{slot}"))
            await b.finish("j", slot, f"t{slot}", NOW, RunState.SUCCEEDED)
        await b.claim(req("j", 3, token="t3"))
        await _expired(b, b.run_key("j", 1), b.run_key("j", 2))
        assert await b.prune("j", 10) == 0  # nothing left to delete: the runs expired
        assert await b.client.zrange(b.runs_key("j"), 0, -1) == ["3"]
        assert await b.client.zrange(b.expiring_key("j"), 0, -1) == []


async def test_takeover_clears_the_error_of_the_released_attempt(backend: RedisBackend) -> None:
    await backend.claim(req("j", 1, token="t1"))
    assert await backend.release("j", 1, "t1", NOW + 1, "pod vanished")
    released = await backend.get_run("j", 1)
    assert released is not None and released.error == "pod vanished"
    taken = await backend.takeover(TakeoverRequest("j", 1, "b", "t2", NOW + 2, LEASE, 3))
    assert taken.won and taken.run is not None and taken.run.error is None
    stored = await backend.get_run("j", 1)
    assert stored == taken.run and stored is not None and stored.error is None
    assert [a.error for a in stored.attempts] == ["pod vanished", None]


async def test_a_released_attempt_can_no_longer_finish(backend: RedisBackend) -> None:
    """A release gives the token up: the released attempt cannot end the run it handed over."""
    await backend.claim(req("j", 1, token="t1"))
    assert await backend.release("j", 1, "t1", NOW + 1, "handing over")
    assert not await backend.finish("j", 1, "t1", NOW + 2, RunState.SUCCEEDED)
    run = await backend.get_run("j", 1)
    assert run is not None and run.state.active and run.error == "handing over"
    assert run.attempts[0].outcome is RunState.INTERRUPTED
    assert (await backend.client.hgetall(backend.run_key("j", 1)))["token"] == ""


async def test_retention_on_replaced_runs(redis_url: str, prefix: str) -> None:
    async with RedisBackend(redis_url, prefix=prefix, retention_ms=60_000) as b:
        assert isinstance(b, RedisBackend)
        await b.claim(req("j", 1, token="t1"))
        result = await b.claim(req("j", 2, token="t2", overlap=Overlap.REPLACE))
        assert [x.slot for x in result.replaced] == [1]
        assert await b.client.pttl(b.run_key("j", 1)) > 0
        assert await b.client.pttl(b.run_key("j", 2)) == -1


def test_retention_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        RedisBackend("redis://127.0.0.1:1/0", retention_ms=0)


async def test_prune_works_through_batches(backend: RedisBackend) -> None:
    n = 1_203
    for slot in range(n):
        await backend.claim(req("j", slot, token=f"t{slot}"))
        if slot != 7:
            await backend.finish("j", slot, f"t{slot}", NOW, RunState.SUCCEEDED)
    assert await backend.prune("j", before_slot=n - 1) == n - 2  # all but the active 7 and the last
    assert [r.slot for r in await backend.history("j")] == [n - 1, 7]
    assert await backend.client.zcard(backend.runs_key("j")) == 2


async def test_history_limit_and_tokens(backend: RedisBackend) -> None:
    for slot in range(5):
        await backend.claim(req("j", slot, token=f"t{slot}"))
    assert [r.slot for r in await backend.history("j", limit=3)] == [4, 3, 2]
    assert await backend.history("j", limit=0) == []
    assert all(r.token == "" for r in await backend.history("j"))
    assert (await backend.get_run("j", 4)) is not None


# -- the same answers as the reference ---------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
async def test_same_answers_as_sqlite_reference(backend: RedisBackend, tmp_path: Path, seed: int) -> None:
    """Random operation sequences give identical results and records on Redis and SQLite.

    The operations aim at the edges: the current token or a stale one, a clock that lags a
    little (instances' clocks differ), shorter leases than the one held, and ``now`` exactly
    at the lease's end (expired: ``lease_until <= now``).
    """
    rng = random.Random(seed)
    reference = SqliteBackend(tmp_path / "ref.db")
    await reference.setup()
    seen: Counter[str] = Counter()
    try:
        clock = NOW
        tokens: dict[tuple[str, int], list[str]] = {}
        for step in range(500):
            clock += rng.choice([0, 1, 300, LEASE // 4, LEASE // 2])
            now = clock - rng.choice([0, 0, 0, 1_500])
            lease = rng.choice([LEASE, LEASE // 4])
            slot = rng.randrange(4)
            job = rng.choice(["j", "j", "k"])
            stored = await reference.get_run(job, slot)
            if stored is not None and stored.lease_until_ms > 0 and rng.random() < 0.15:
                now = stored.lease_until_ms - rng.choice([0, 0, 1])  # just at / before the end
            token = rng.choice([*tokens.get((job, slot), ["stale"])[-2:], "stale"])
            op = rng.choice(["claim", "claim", "heartbeat", "heartbeat", "finish", "release", "takeover", "prune"])
            if op in ("claim", "takeover"):
                fresh = f"tok-{step}"
                tokens.setdefault((job, slot), []).append(fresh)
            if op == "claim":
                request = ClaimRequest(job, slot, f"i{step % 3}", fresh, now, lease, rng.choice(list(Overlap)))
                got, want = await backend.claim(request), await reference.claim(request)
                assert got == want, (step, request)
                seen[f"claim {want.outcome}"] += 1
                seen["replaced"] += len(want.replaced)
            elif op == "heartbeat":
                args = (job, slot, token, now, lease)
                ok = await backend.heartbeat(*args)
                assert ok == await reference.heartbeat(*args), step
                seen[f"heartbeat {ok}"] += 1
            elif op == "finish":
                outcome = rng.choice([RunState.SUCCEEDED, RunState.FAILED, RunState.INTERRUPTED])
                error = rng.choice([None, "exit 1", 'é/"quoted"\n'])
                fargs = (job, slot, token, now, outcome, error)
                ok = await backend.finish(*fargs)
                assert ok == await reference.finish(*fargs), step
                seen[f"finish {ok}"] += 1
            elif op == "release":
                rargs = (job, slot, token, now, "handed over")
                ok = await backend.release(*rargs)
                assert ok == await reference.release(*rargs), step
                seen[f"release {ok}"] += 1
            elif op == "takeover":
                treq = TakeoverRequest(job, slot, f"i{step % 3}", fresh, now, lease, rng.choice([1, 2, 3]))
                got, want = await backend.takeover(treq), await reference.takeover(treq)
                assert got == want, (step, treq)
                final = want.run is not None and not want.run.state.active
                seen[f"takeover {want.outcome}{' final' if final else ''}"] += 1
            else:
                before = rng.randrange(5)
                pruned = await backend.prune(job, before)
                assert pruned == await reference.prune(job, before), step
                seen["pruned"] += pruned
            for j in ("j", "k"):
                assert await backend.active_runs(j) == await reference.active_runs(j), step
                assert await backend.get_run(j, slot) == await reference.get_run(j, slot), step
        for j in ("j", "k"):
            assert await backend.history(j) == await reference.history(j)
            assert await backend.last_slot(j) == await reference.last_slot(j)
    finally:
        await reference.close()
    # The sequence really went through every path, or the comparison proved little.
    for path in (
        "claim won",
        "claim taken",
        "claim skipped",
        "replaced",
        "heartbeat True",
        "heartbeat False",
        "finish True",
        "finish False",
        "release True",
        "takeover won",
        "takeover taken",
        "pruned",
    ):
        assert seen[path] > 0, (path, seen)


@pytest.mark.parametrize("instance", ["host:1", 'quote"back\\slash', "é/ü\n\t", ""])
def test_first_attempt_json_is_to_json(instance: str) -> None:
    from anarchon.engine.backends.redis import _first_attempt_json
    from anarchon.engine.model import Attempt

    attempt = Attempt(1, instance, "0123456789ab", NOW)
    assert json.loads(_first_attempt_json(attempt)) == [attempt.to_json()]


async def test_awkward_instance_names_round_trip(backend: RedisBackend) -> None:
    instance = 'pod "a"/é\n'
    won = await backend.claim(req("j", 1, instance=instance, token="t1"))
    assert won.won
    stored = await backend.get_run("j", 1)
    assert stored == won.run and stored is not None and stored.attempts[0].instance == instance


async def test_a_burst_beyond_the_pool_waits_for_a_connection_instead_of_failing(backend: RedisBackend) -> None:
    """300 calls at once, more than the pool's 100 connections: every one is answered.

    Before, redis-py's default pool raised "Too many connections" past 100: under load
    (1,000 jobs due at once) claims and heartbeats failed, and takeovers and duplicates followed.
    """
    job = f"burst-{uuid.uuid4().hex[:8]}"
    results = await asyncio.gather(*(backend.get_run(job, slot) for slot in range(300)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} calls failed, e.g. {errors[0]!r}"
    assert results == [None] * 300


async def test_runs_of_an_earlier_version_get_into_the_leases_index(backend: RedisBackend) -> None:
    """A rolling upgrade from a version without ``P:leases``: its runs must not be invisible
    to the new instances' sweep, or a run an old instance hands over on its way out would
    never be taken over."""
    r, leases = backend.client, backend.leases_key()

    async def expired(now: int) -> list[tuple[str, int]]:
        return [(x.job, x.slot) for x in await backend.expired_runs(now, 10)]

    # Claimed by an earlier version: no index entry.
    assert (await backend.claim(req("old", 1, token="t1"))).won
    await r.zrem(leases, backend.run_key("old", 1))
    assert await expired(NOW + LEASE) == []
    # A new instance starts: it notes the job's schedule, which indexes the job's active runs.
    await backend.schedule_since("old", "every:1000", NOW)
    assert await expired(NOW + LEASE) == [("old", 1)]
    # A new instance loses a claim to such a run: indexed too.
    assert (await backend.claim(req("old2", 1, token="t2"))).won
    await r.zrem(leases, backend.run_key("old2", 1))
    assert (await backend.claim(req("old2", 1, token="t3"))).outcome is ClaimOutcome.TAKEN
    assert await r.zscore(leases, backend.run_key("old2", 1)) == NOW + LEASE
    # The earlier version's heartbeats push the lease but not the entry: the sweep moves the
    # entry to the lease instead of reporting the run expired.
    await r.hset(backend.run_key("old2", 1), "lease_until", str(NOW + 10 * LEASE))
    assert await expired(NOW + LEASE) == [("old", 1)]
    assert await r.zscore(leases, backend.run_key("old2", 1)) == NOW + 10 * LEASE
    assert await expired(NOW + 10 * LEASE) == [("old2", 1), ("old", 1)]
