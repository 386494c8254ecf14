"""PostgreSQL-specific tests of :class:`PostgresBackend`, on a real server.

The generic lease contract is in ``test_conformance.py``; here are the things only this
backend has: its schema and concurrent setup, exact agreement with the reference
transitions over long random histories (the logic runs in PL/pgSQL, not in Python), heavy
contention from many connections, timeouts, and outages of the server.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import sql

from anarchon.engine import RunContext, Scheduler, SystemClock, transitions
from anarchon.engine.backend import ClaimRequest, TakeoverRequest
from anarchon.engine.backends import from_url
from anarchon.engine.backends.postgres import PostgresBackend
from anarchon.engine.errors import ConfigError, StoreError
from anarchon.engine.model import ClaimOutcome, ClaimResult, Overlap, Run, RunState
from tests.harness.engine import Calls, Recorder
from tests.harness.until import until_async
from tests.servers.postgres import PostgresServer

NOW = 1_800_000_000_000
LEASE = 6_000


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def backend(postgres_url: str) -> AsyncIterator[PostgresBackend]:
    """A backend on a table of its own, so that schema tests see only what they made."""
    b = PostgresBackend(postgres_url, table=unique("t"))
    await b.setup()
    yield b
    await b.close()


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A server the outage tests may kill and restart without disturbing the session's.

    Each test leaves it running (restarted), so that the next one starts from a server up.
    """
    with PostgresServer(max_connections=50) as server:
        yield server


# -- configuration ------------------------------------------------------------------------


def test_from_url_builds_postgres_backend(postgres_url: str) -> None:
    backend = from_url(postgres_url)
    assert isinstance(backend, PostgresBackend)
    assert backend.capabilities.leases and backend.capabilities.name == "postgres"
    assert (backend.table, backend.schedules_table) == ("anarchon_runs", "anarchon_schedules")


@pytest.mark.parametrize("table", ["", "runs; DROP TABLE x", "1runs", "a" * 49, 'we"ird'])
def test_table_names_are_validated(table: str) -> None:
    with pytest.raises(ConfigError):
        PostgresBackend("postgresql://u@localhost/db", table=table)


def test_unparsable_url_does_not_echo_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        PostgresBackend("postgresql://u:hunter2@localhost/db?no_such_option=1")
    assert "hunter2" not in str(err.value)


# -- schema -------------------------------------------------------------------------------


async def test_schema_layout(backend: PostgresBackend, postgres_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        cur = await conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (backend.table,),
        )
        columns: dict[str, str] = dict(await cur.fetchall())
        cur = await conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (backend.table,),
        )
        primary_key = [r[0] for r in await cur.fetchall()]
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (backend.schedules_table,))
        schedules = await cur.fetchone()
    assert primary_key == ["job", "slot"]
    assert columns["attempts"] == "jsonb"
    assert columns["slot"] == "bigint"
    assert schedules == (True,)


async def test_setup_twice_keeps_the_data(backend: PostgresBackend) -> None:
    won = await backend.claim(ClaimRequest("job", 1, "a", "t1", NOW, LEASE))
    assert won.won
    await backend.setup()
    again = PostgresBackend(backend._url, table=backend.table)
    await again.setup()
    try:
        run = await again.get_run("job", 1)
        assert run is not None and run.token == "t1"
    finally:
        await again.close()


async def test_setup_of_an_existing_schema_does_not_wait_for_writers(
    backend: PostgresBackend, postgres_url: str
) -> None:
    """An instance restarting must not stall behind (or stall) the cluster's claims.

    A writer holds ROW EXCLUSIVE on the table until it commits; ``CREATE INDEX IF NOT
    EXISTS`` would queue for SHARE behind it, and every later claim behind that.
    """
    await backend.claim(ClaimRequest("job", 1, "a", "t1", NOW, LEASE))
    async with await psycopg.AsyncConnection.connect(postgres_url) as writer:
        query = sql.SQL("UPDATE {} SET updated = updated WHERE job = 'job'").format(sql.Identifier(backend.table))
        await writer.execute(query)  # transaction left open
        restarted = PostgresBackend(postgres_url, table=backend.table)
        try:
            await asyncio.wait_for(restarted.setup(), timeout=5)
        finally:
            await restarted.close()
        await writer.rollback()


async def test_setup_recreates_what_is_missing(backend: PostgresBackend, postgres_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname LIKE %s", (f"{backend.table}_claim_v%",)
        )
        rows = await cur.fetchall()
        assert len(rows) == 1
        await conn.execute(sql.SQL("DROP FUNCTION {}").format(sql.SQL(rows[0][0])))
    with pytest.raises(StoreError):
        await backend.claim(ClaimRequest("job", 1, "a", "t1", NOW, LEASE))
    await backend.setup()
    assert (await backend.claim(ClaimRequest("job", 1, "a", "t1", NOW, LEASE))).won


async def test_concurrent_setup_of_a_new_table(postgres_url: str) -> None:
    """Many instances starting at once against an empty database all succeed.

    Without the advisory lock in setup(), concurrent CREATE ... IF NOT EXISTS and CREATE OR
    REPLACE FUNCTION fail with unique violations on the catalogs or "tuple concurrently
    updated"; this test saw those failures when the lock was taken out.
    """
    for _ in range(3):
        table = unique("setup")
        backends = [PostgresBackend(postgres_url, table=table, pool_size=1) for _ in range(12)]
        try:
            results = await asyncio.gather(*(b.setup() for b in backends), return_exceptions=True)
            assert [r for r in results if r is not None] == []
            claims = await asyncio.gather(
                *(b.claim(ClaimRequest("job", 1, f"i{n}", f"t{n}", NOW, LEASE)) for n, b in enumerate(backends))
            )
            assert sum(c.won for c in claims) == 1
        finally:
            await asyncio.gather(*(b.close() for b in backends))


async def test_query_before_setup_is_a_store_error(postgres_url: str) -> None:
    backend = PostgresBackend(postgres_url, table=unique("nosetup"))
    try:
        with pytest.raises(StoreError, match="does not exist"):
            await backend.get_run("job", 1)
        await backend.setup()  # the same connection is still usable after a query error
        assert await backend.get_run("job", 1) is None
    finally:
        await backend.close()


# -- exact agreement with the reference transitions ---------------------------------------


class Reference:
    """The reference semantics: ``transitions`` over a dict, as the SQLite backend uses them."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, int], Run] = {}
        self.schedules: dict[str, tuple[str, int]] = {}

    def get(self, job: str, slot: int) -> Run | None:
        run = self.runs.get((job, slot))
        return copy.deepcopy(run)  # transitions mutate the last Attempt of their input in place

    def active(self, job: str) -> list[Run]:
        return sorted(
            (copy.deepcopy(r) for r in self.runs.values() if r.job == job and r.state.active), key=lambda r: r.slot
        )

    def put(self, run: Run | None) -> None:
        if run is not None:
            self.runs[(run.job, run.slot)] = copy.deepcopy(run)

    def claim(self, req: ClaimRequest) -> ClaimResult:
        existing = self.get(req.job, req.slot)
        result, writes = transitions.claim(existing, [] if existing else self.active(req.job), req)
        for w in writes:
            self.put(w)
        return copy.deepcopy(result)

    def takeover(self, req: TakeoverRequest) -> ClaimResult:
        result, write = transitions.takeover(self.get(req.job, req.slot), req)
        self.put(write)
        return copy.deepcopy(result)

    def history(self, job: str, limit: int) -> list[Run]:
        runs = sorted((copy.deepcopy(r) for r in self.runs.values() if r.job == job), key=lambda r: -r.slot)[:limit]
        for r in runs:
            r.token = ""
        return runs

    def prune(self, job: str, before: int) -> int:
        newest = max((r.slot for r in self.runs.values() if r.job == job), default=None)
        doomed = [
            k
            for k, r in self.runs.items()
            if r.job == job and r.slot < before and not r.state.active and r.slot != newest
        ]
        for k in doomed:
            del self.runs[k]
        return len(doomed)

    def schedule_since(self, job: str, fingerprint: str, now: int) -> int:
        current = self.schedules.get(job)
        if current is not None and current[0] == fingerprint:
            return current[1]
        self.schedules[job] = (fingerprint, now)
        return now


@pytest.mark.parametrize("seed", range(4))
async def test_random_histories_match_the_reference(backend: PostgresBackend, seed: int) -> None:
    rng = random.Random(seed)
    ref = Reference()
    jobs = ["alpha", "beta"]
    tokens = ["never-issued"]
    now = NOW
    for step in range(400):
        now += rng.choice([0, 1, 500, 2_000, LEASE // 2, LEASE + 1])
        job = rng.choice(jobs)
        slot = (step // 15 + rng.randint(0, 4)) * 1000  # a window that moves on, as time does
        current = ref.get(job, slot)
        # Mostly the current attempt's token (so that runs do finish), else a stale one.
        token = current.token if current is not None and rng.random() < 0.6 else rng.choice(tokens)
        op = rng.choices(
            ["claim", "heartbeat", "finish", "release", "takeover", "read", "prune", "schedule"],
            weights=[8, 5, 3, 2, 4, 2, 1, 1],
        )[0]
        where = f"seed {seed} step {step} {op} {job} {slot}"
        if op == "claim":
            token = f"tok{step}"
            tokens.append(token)
            req = ClaimRequest(job, slot, rng.choice("abc"), token, now, LEASE, rng.choice(list(Overlap)))
            assert await backend.claim(req) == ref.claim(req), where
        elif op == "takeover":
            token = f"tok{step}"
            tokens.append(token)
            treq = TakeoverRequest(job, slot, rng.choice("abc"), token, now, LEASE, rng.randint(1, 3))
            assert await backend.takeover(treq) == ref.takeover(treq), where
        elif op == "heartbeat":
            expected = transitions.heartbeat(ref.get(job, slot), token, now, LEASE)
            ref.put(expected)
            assert await backend.heartbeat(job, slot, token, now, LEASE) == (expected is not None), where
        elif op == "finish":
            outcome = rng.choice([RunState.SUCCEEDED, RunState.FAILED, RunState.INTERRUPTED])
            error = rng.choice([None, "exit code 1", "it's 'quoted' \\ and ünïcode"])
            expected = transitions.finish(ref.get(job, slot), token, now, outcome, error)
            ref.put(expected)
            assert await backend.finish(job, slot, token, now, outcome, error) == (expected is not None), where
        elif op == "release":
            expected = transitions.release(ref.get(job, slot), token, now, "handing over")
            ref.put(expected)
            assert await backend.release(job, slot, token, now, "handing over") == (expected is not None), where
        elif op == "prune":
            before = (step // 15 + rng.randint(-3, 3)) * 1000
            assert await backend.prune(job, before) == ref.prune(job, before), where
        elif op == "schedule":
            fingerprint = rng.choice(["every:10s", "cron:0 * * * *"])
            assert await backend.schedule_since(job, fingerprint, now) == ref.schedule_since(job, fingerprint, now)
        assert await backend.get_run(job, slot) == ref.get(job, slot), where
        assert await backend.active_runs(job) == ref.active(job), where
    for job in jobs:
        assert await backend.history(job, 100) == ref.history(job, 100)
        assert await backend.history(job, 2) == ref.history(job, 2)
        expected_last = max((r.slot for r in ref.runs.values() if r.job == job), default=None)
        assert await backend.last_slot(job) == expected_last


# -- contention ---------------------------------------------------------------------------


@pytest.fixture
async def crowd(postgres_url: str) -> AsyncIterator[list[PostgresBackend]]:
    """Sixteen instances, each with its own connection, on one shared table."""
    table = unique("crowd")
    backends = [PostgresBackend(postgres_url, table=table, pool_size=1) for _ in range(16)]
    await asyncio.gather(*(b.setup() for b in backends))
    yield backends
    await asyncio.gather(*(b.close() for b in backends))


async def test_many_connections_claiming_the_same_slots(crowd: list[PostgresBackend]) -> None:
    for slot in range(40):
        results = await asyncio.gather(
            *(
                b.claim(ClaimRequest("job", slot, f"i{n}", f"t{slot}-{n}", NOW, LEASE, Overlap.ALLOW))
                for n, b in enumerate(crowd)
            )
        )
        winners = [r for r in results if r.won]
        assert len(winners) == 1, slot
        assert winners[0].run is not None
        token = winners[0].run.token
        # Every loser was told about the winner's run, and the store agrees.
        assert all(r.outcome is ClaimOutcome.TAKEN and r.run and r.run.token == token for r in results if not r.won)
        stored = await crowd[0].get_run("job", slot)
        assert stored is not None and stored.token == token and len(stored.attempts) == 1


async def test_overlap_skip_across_slots_under_contention(crowd: list[PostgresBackend]) -> None:
    """Sixteen instances claim four different slots of one job at once: one run only."""
    for round_ in range(15):
        base = round_ * 100
        results = await asyncio.gather(
            *(
                b.claim(ClaimRequest("job", base + n % 4, f"i{n}", f"t{round_}-{n}", NOW, LEASE, Overlap.SKIP))
                for n, b in enumerate(crowd)
            )
        )
        assert sum(r.won for r in results) == 1, round_
        active = await crowd[0].active_runs("job")
        assert len(active) == 1
        slots = {(await crowd[0].get_run("job", base + k)) is not None for k in range(4)}
        assert slots == {True}  # the other slots were recorded (Skipped), once each
        await crowd[0].finish("job", active[0].slot, active[0].token, NOW, RunState.SUCCEEDED)


async def test_takeover_races_with_the_old_runner(crowd: list[PostgresBackend]) -> None:
    """A stale runner's finish and many backups' takeovers race: exactly one of them counts."""
    for slot in range(20):
        await crowd[0].claim(ClaimRequest("job", slot, "old", "old-token", NOW, LEASE, Overlap.ALLOW))
        later = NOW + LEASE + 1
        finishing = asyncio.ensure_future(crowd[0].finish("job", slot, "old-token", later, RunState.SUCCEEDED))
        takeovers = await asyncio.gather(
            *(
                b.takeover(TakeoverRequest("job", slot, f"b{n}", f"new-{n}", later, LEASE, 3))
                for n, b in enumerate(crowd[1:])
            )
        )
        finished = await finishing
        won = [t for t in takeovers if t.won]
        run = await crowd[0].get_run("job", slot)
        assert run is not None
        if finished:
            assert won == [] and run.state is RunState.SUCCEEDED and run.attempt == 1
        else:
            assert len(won) == 1 and won[0].run is not None
            assert (run.state, run.attempt, run.token) == (RunState.CLAIMED, 2, won[0].run.token)


async def test_instances_agree_on_when_a_schedule_changed(crowd: list[PostgresBackend]) -> None:
    """Instances that see a new fingerprint at once (each with its own clock) agree on one ``since``."""
    for round_, fingerprint in enumerate(["every:10s", "every:5s", "cron:0 * * * *"]):
        answers = await asyncio.gather(
            *(b.schedule_since("job", fingerprint, NOW + round_ * 1000 + n) for n, b in enumerate(crowd))
        )
        assert len(set(answers)) == 1, answers
        assert NOW + round_ * 1000 <= answers[0] < NOW + round_ * 1000 + len(crowd)


# -- timeouts and outages -----------------------------------------------------------------


async def test_command_timeout_cancels_the_claim_on_the_server(backend: PostgresBackend, postgres_url: str) -> None:
    """A claim stuck behind the job's lock times out as StoreError and leaves no ghost.

    If the timed-out statement kept running on the server, it would insert the run once
    the lock is free: a claim its caller believes failed.
    """
    impatient = PostgresBackend(postgres_url, table=backend.table, command_timeout_s=1.0)
    try:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as blocker:
            await blocker.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"{backend.table}:job",))
            with pytest.raises(StoreError, match="no answer within"):
                await impatient.claim(ClaimRequest("job", 1, "a", "t1", NOW, LEASE))
            await blocker.execute("SELECT pg_advisory_unlock_all()")
        await asyncio.sleep(0.5)
        assert await backend.get_run("job", 1) is None
        # The impatient backend recovers once the lock is gone.
        assert (await impatient.claim(ClaimRequest("job", 1, "a", "t2", NOW, LEASE))).won
    finally:
        await impatient.close()


async def test_outage_raises_store_error_then_recovers(own_server: PostgresServer) -> None:
    # Trust authentication ignores the password, which lets us check that it never leaks.
    url = own_server.url.replace("postgres@", "postgres:s3cr3t-pw@")
    backend = PostgresBackend(url, table=unique("outage"), pool_size=4)
    await backend.setup()
    try:
        # Fill the pool, so that the outage breaks several idle connections at once.
        await asyncio.gather(*(backend.get_run("job", n) for n in range(8)))
        assert (await backend.claim(ClaimRequest("job", 1, "a", "t1", NOW, LEASE))).won

        own_server.kill()
        for _ in range(3):  # a broken connection, then refused connects: all StoreError
            with pytest.raises(StoreError) as err:
                await backend.heartbeat("job", 1, "t1", NOW + 1, LEASE)
            assert "s3cr3t-pw" not in str(err.value)
            assert str(own_server.port) in str(err.value)

        own_server.restart()
        # The broken connections were dropped when the first call failed: the very first
        # call after the restart reconnects.
        assert await backend.get_run("job", 2) is None
        # What was committed before the crash is still there (synchronous commit).
        survivor = await backend.get_run("job", 1)
        assert survivor is not None and survivor.token == "t1"
        assert (await backend.claim(ClaimRequest("job", 2, "a", "t2", NOW, LEASE, Overlap.ALLOW))).won
        results = await asyncio.gather(*(backend.get_run("job", 2) for _ in range(8)))
        assert all(r is not None and r.token == "t2" for r in results)
    finally:
        await backend.close()


async def test_restart_while_idle_costs_at_most_one_failed_call(own_server: PostgresServer) -> None:
    backend = PostgresBackend(own_server.url, table=unique("idle"), pool_size=4)
    await backend.setup()
    try:
        await asyncio.gather(*(backend.get_run("job", n) for n in range(8)))
        own_server.restart()
        failures = 0
        for n in range(6):
            try:
                await backend.claim(ClaimRequest("job", n, "a", f"t{n}", NOW, LEASE, Overlap.ALLOW))
            except StoreError:
                failures += 1
        assert failures <= 1
        assert len(await backend.active_runs("job")) >= 5
    finally:
        await backend.close()


async def test_closed_backend_refuses_calls(postgres_url: str) -> None:
    backend = PostgresBackend(postgres_url, table=unique("closed"))
    await backend.setup()
    await backend.close()
    with pytest.raises(StoreError, match="after close"):
        await backend.get_run("job", 1)


async def test_a_batch_of_claims_is_one_round_trip_and_two_batches_never_deadlock(
    backend: PostgresBackend, postgres_url: str
) -> None:
    """Fifty jobs due together: one statement per instance's batch (it was fifty). Two instances
    claim the same fifty slots at once, in opposite orders: each slot has one winner, and the
    job locks, held until a batch ends, are taken in one order (no deadlock error)."""
    other = PostgresBackend(postgres_url, table=backend.table)
    await other.setup()
    statements = 0
    rows = backend._rows

    async def counted(query: bytes, params: object) -> list[tuple[object, ...]]:
        nonlocal statements
        statements += 1
        return await rows(query, params)  # type: ignore[arg-type]

    backend._rows = counted  # type: ignore[method-assign]
    jobs = [f"j{i:02d}" for i in range(50)]
    try:
        for _ in range(5):
            slot = random.randrange(1, 10**9)
            mine = [ClaimRequest(j, slot, "a", f"a-{j}", NOW, LEASE, Overlap.ALLOW) for j in jobs]
            theirs = [ClaimRequest(j, slot, "b", f"b-{j}", NOW, LEASE, Overlap.ALLOW) for j in reversed(jobs)]
            before = statements
            a, b = await asyncio.gather(backend.claim_many(mine), other.claim_many(theirs))
            assert statements - before == 1
            assert not [x for x in (*a, *b) if isinstance(x, BaseException)], (a, b)
            won = Counter(r.run.instance for r in (*a, *b) if isinstance(r, ClaimResult) and r.won and r.run)
            assert sum(won.values()) == len(jobs), won
            for j, answer in zip(jobs, a, strict=True):
                assert isinstance(answer, ClaimResult) and answer.run is not None and answer.run.job == j
    finally:
        await other.close()


async def test_heartbeats_out_together_are_one_statement_each_fenced_on_its_own(
    backend: PostgresBackend, postgres_url: str
) -> None:
    """Forty runs beat at once: the server runs three UPDATEs on the runs table (two beats sent
    alone while nothing was out, then the thirty-eight that came meanwhile in one), counted by a
    statement trigger of the server's own; it was forty. In the batch, a beat with a stale token,
    one of a run already over and one of a run never claimed are each refused (False), the
    others each pushed their own lease."""
    runs = [ClaimRequest(f"j{i:02d}", 1, "a", f"tok-{i}", NOW, LEASE, Overlap.ALLOW) for i in range(40)]
    assert all(isinstance(r, ClaimResult) and r.won for r in await backend.claim_many(runs))
    assert await backend.finish("j39", 1, "tok-39", NOW, RunState.SUCCEEDED)
    table = backend.table
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as admin:
        await admin.execute(
            sql.SQL(
                "CREATE SEQUENCE {seq}; CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN PERFORM nextval({seq_name}); RETURN NULL; END $$;"
                " CREATE TRIGGER {trg} AFTER UPDATE ON {runs} FOR EACH STATEMENT EXECUTE FUNCTION {fn}()"
            ).format(
                seq=sql.Identifier(f"{table}_updates"),
                seq_name=sql.Literal(f"{table}_updates"),
                fn=sql.Identifier(f"{table}_count"),
                trg=sql.Identifier(f"{table}_count"),
                runs=sql.Identifier(table),
            )
        )
        beat_at = NOW + 1_000
        beats = [(r.job, r.slot, r.token) for r in runs]
        beats[5] = ("j05", 1, "stale")
        beats.append(("never-claimed", 1, "tok"))
        answers = await asyncio.gather(*(backend.heartbeat(j, s, t, beat_at, LEASE) for j, s, t in beats))
        cur = await admin.execute(sql.SQL("SELECT last_value FROM {}").format(sql.Identifier(f"{table}_updates")))
        row = await cur.fetchone()
    assert row is not None and row[0] == 3, f"{row} UPDATE statements for {len(beats)} heartbeats"
    refused = {5, 39, 40}
    assert answers == [i not in refused for i in range(len(beats))], answers
    for i, r in enumerate(runs):
        run = await backend.get_run(r.job, 1)
        assert run is not None
        if i in refused:
            assert run.lease_until_ms in (NOW + LEASE, 0), run
        else:
            assert (run.state, run.lease_until_ms) == (RunState.RUNNING, beat_at + LEASE), run


async def test_a_heartbeat_on_a_frozen_connection_holds_the_next_back_no_longer_than_a_heartbeat(
    postgres_url: str,
) -> None:
    """The server process of the lease connection freezes (SIGSTOP) as a heartbeat goes out on
    it: no reply, ever, while the server serves every other connection. The attempt gives that
    beat up when the next is due, the next goes out on a new connection and pushes the lease,
    and the run ends Succeeded in its first attempt. Before, the attempt waited for the command
    timeout (here 10 s, the default 30 s) and lost its lease (3 s)."""
    job = unique("frozen")
    backend = PostgresBackend(postgres_url, table=unique("t"), command_timeout_s=10.0)
    frozen: list[int] = []
    sent: list[tuple[float, object]] = []
    heartbeat = backend.heartbeat

    async def timed(job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        if len(sent) == 2:  # the third beat: freeze the connection it is about to use
            (conn,) = backend._lease_idle
            frozen.append(conn.info.backend_pid)
            os.kill(frozen[0], signal.SIGSTOP)
        sent.append((time.monotonic(), None))
        try:
            ok = await heartbeat(job, slot, token, now_ms, lease_ms)
        except BaseException as exc:
            sent[-1] = (sent[-1][0], exc)
            raise
        sent[-1] = (sent[-1][0], ok)
        return ok

    backend.heartbeat = timed  # type: ignore[method-assign]
    clock = SystemClock()
    calls = Calls(clock)
    listener = Recorder()

    async def work(ctx: RunContext) -> None:
        await until_async("five heartbeats", lambda: len(sent) >= 5, timeout=30)

    sched = Scheduler(backend, instance_id="solo", clock=clock, listener=listener)
    sched.every(job, "1h", calls.handler(work), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await sched.trigger(job)
        await until_async("the attempt's end", lambda: bool(listener.of("finished") or listener.of("fenced")))
    finally:
        if frozen:
            os.kill(frozen[0], signal.SIGCONT)
        await sched.stop()
        await backend.close()
    assert frozen, "the third heartbeat met the frozen connection"
    assert not listener.of("fenced"), listener.events
    (stalled_at, stalled), (next_at, _) = sent[2], sent[3]
    assert isinstance(stalled, asyncio.CancelledError), f"the frozen beat was given up: {stalled!r}"
    assert next_at - stalled_at < 1.7, sent  # a heartbeat later (and a loaded machine's slack)
    # (The fifth may be cut short by the attempt's end.)
    assert [ok for _, ok in sent[:2] + sent[3:4]] == [True] * 3, sent
    assert [(c.attempt, c.stop_reason) for c in calls.calls] == [(1, None)]
    assert [e[4] for e in listener.of("finished")] == ["Succeeded"]
