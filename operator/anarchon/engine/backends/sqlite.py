"""SQLite: the embedded default, one file shared by every process on one machine.

WAL mode lets readers run beside the one writer; every write runs in ``BEGIN IMMEDIATE``
so the read-decide-write of a claim is atomic across processes. The sqlite3 module is
blocking, so each call runs in a worker thread and never holds up the event loop; one
connection per backend, used by one thread at a time under a lock.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from .. import transitions
from ..backend import Capabilities, ClaimRequest, LeaseBackend, TakeoverRequest
from ..batch import Beat, Coalescer
from ..errors import StoreError
from ..model import Attempt, ClaimResult, Run, RunState
from ..shared import SharedSide, note_side

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS anarchon_runs (
    job TEXT NOT NULL,
    slot INTEGER NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    instance TEXT NOT NULL,
    token TEXT NOT NULL,
    lease_until INTEGER NOT NULL,
    created INTEGER NOT NULL,
    updated INTEGER NOT NULL,
    error TEXT,
    attempts TEXT NOT NULL,
    PRIMARY KEY (job, slot)
);
DROP INDEX IF EXISTS anarchon_runs_state;
CREATE INDEX IF NOT EXISTS anarchon_runs_active ON anarchon_runs (job, slot) WHERE state IN ('Claimed', 'Running');
CREATE INDEX IF NOT EXISTS anarchon_runs_lease ON anarchon_runs (lease_until) WHERE state IN ('Claimed', 'Running');
CREATE TABLE IF NOT EXISTS anarchon_schedules (
    job TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    since INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS anarchon_served (
    job TEXT PRIMARY KEY,
    at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS anarchon_served_at ON anarchon_served (at);
CREATE TABLE IF NOT EXISTS anarchon_shared (
    job TEXT NOT NULL,
    cluster TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    since INTEGER NOT NULL,
    seen INTEGER NOT NULL,
    PRIMARY KEY (job, cluster)
);
CREATE TABLE IF NOT EXISTS anarchon_presence (
    instance TEXT PRIMARY KEY,
    until INTEGER NOT NULL
);
"""

_COLUMNS = "job, slot, state, attempt, instance, token, lease_until, created, updated, error, attempts"
_ACTIVE = (str(RunState.CLAIMED), str(RunState.RUNNING))


def _forget(conn: sqlite3.Connection, job: str) -> None:
    """Everything the store keeps for ``job`` (inside the caller's transaction)."""
    conn.execute("DELETE FROM anarchon_runs WHERE job=?", (job,))
    conn.execute("DELETE FROM anarchon_schedules WHERE job=?", (job,))
    conn.execute("DELETE FROM anarchon_served WHERE job=?", (job,))
    conn.execute("DELETE FROM anarchon_shared WHERE job=?", (job,))


def _row_to_run(row: tuple[object, ...]) -> Run:
    job, slot, state, attempt, instance, token, lease_until, created, updated, error, attempts = row
    return Run(
        job=str(job),
        slot=int(str(slot)),
        state=RunState(str(state)),
        attempt=int(str(attempt)),
        instance=str(instance),
        token=str(token),
        lease_until_ms=int(str(lease_until)),
        created_ms=int(str(created)),
        updated_ms=int(str(updated)),
        error=None if error is None else str(error),
        attempts=[Attempt.from_json(a) for a in json.loads(str(attempts))],
    )


def _run_to_row(run: Run) -> tuple[object, ...]:
    return (
        run.job,
        run.slot,
        str(run.state),
        run.attempt,
        run.instance,
        run.token,
        run.lease_until_ms,
        run.created_ms,
        run.updated_ms,
        run.error,
        json.dumps([a.to_json() for a in run.attempts]),
    )


class SqliteBackend(LeaseBackend):
    """Lease store in one SQLite file; safe across processes on one machine (not over NFS)."""

    capabilities = Capabilities(name="sqlite", leases=True)

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0) -> None:
        self.path = str(path)
        self._busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        # One thread owns the connection: every call, close() included, runs there in order.
        # A caller that is cancelled cannot stop a statement already running in that thread,
        # and with a single worker nothing else can touch the connection meanwhile.
        self._executor: ThreadPoolExecutor | None = None
        #: Heartbeats made while one transaction of them is out go together in the next.
        self._beats = Coalescer(self._heartbeat_many, in_flight=1)

    def _connect(self) -> sqlite3.Connection:
        if self.path not in ("", ":memory:"):
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False)
        # Several processes may open a new file at once: switching to WAL and creating the
        # schema can meet "database is locked" without the busy handler being consulted, so
        # both are retried, and the schema is created inside one immediate transaction.
        for attempt in range(100):
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for statement in filter(str.strip, _SCHEMA.split(";")):
                        conn.execute(statement)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return conn
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 99:
                    conn.close()
                    raise
                time.sleep(0.01 * (1 + attempt % 10))
        raise AssertionError("unreachable")  # pragma: no cover

    async def setup(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anarchon-sqlite")
        if self._conn is None:

            def connect() -> None:
                if self._conn is None:
                    self._conn = self._connect()

            await self._call(connect, connect=True)

    async def ping(self) -> None:
        """A statement through the connection's thread: answers unless the file or thread is stuck."""

        def select() -> None:
            conn = self._conn
            if conn is None:
                raise sqlite3.ProgrammingError("the connection was closed")
            conn.execute("SELECT 1").fetchone()

        await self._call(select)

    async def close(self) -> None:
        executor = self._executor
        if executor is None:
            return

        def shut() -> None:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

        try:
            await self._call(shut, connect=True)  # after every call already queued
        finally:
            self._executor = None
            executor.shutdown(wait=False)

    async def _call(self, fn: Callable[[], T], *, connect: bool = False) -> T:
        executor = self._executor
        if executor is None or (self._conn is None and not connect):
            raise StoreError(f"sqlite {self.path}: backend used before setup() or after close()")
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {self.path}: {exc}") from exc

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> Callable[[], T]:
        """Wrap ``fn`` in BEGIN IMMEDIATE ... COMMIT, rolling back on any error."""

        def run() -> T:
            conn = self._conn
            if conn is None:
                raise sqlite3.ProgrammingError("the connection was closed")
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return run

    @staticmethod
    def _get(conn: sqlite3.Connection, job: str, slot: int) -> Run | None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM anarchon_runs WHERE job=? AND slot=?", (job, slot)).fetchone()
        return None if row is None else _row_to_run(row)

    @staticmethod
    def _active(conn: sqlite3.Connection, job: str) -> list[Run]:
        # Literal states, so that the planner can use the partial index of active runs: every
        # claim runs this, and it must not read the job's whole history.
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM anarchon_runs WHERE job=? AND state IN ('Claimed', 'Running') ORDER BY slot",
            (job,),
        ).fetchall()
        return [_row_to_run(r) for r in rows]

    @staticmethod
    def _put(conn: sqlite3.Connection, runs: list[Run]) -> None:
        conn.executemany(
            f"INSERT OR REPLACE INTO anarchon_runs ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            [_run_to_row(r) for r in runs],
        )

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        def work(conn: sqlite3.Connection) -> ClaimResult:
            existing = self._get(conn, request.job, request.slot)
            active = [] if existing is not None else self._active(conn, request.job)
            result, writes = transitions.claim(existing, active, request)
            self._put(conn, writes)
            return result

        return await self._call(self._tx(work))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        """One transaction for all: each claim reads what the ones before it wrote."""

        def work(conn: sqlite3.Connection) -> list[ClaimResult | BaseException]:
            results: list[ClaimResult | BaseException] = []
            for request in requests:
                existing = self._get(conn, request.job, request.slot)
                active = [] if existing is not None else self._active(conn, request.job)
                result, writes = transitions.claim(existing, active, request)
                self._put(conn, writes)
                results.append(result)
            return results

        return await self._call(self._tx(work))

    async def _update(self, job: str, slot: int, change: Callable[[Run | None], Run | None]) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            updated = change(self._get(conn, job, slot))
            if updated is None:
                return False
            self._put(conn, [updated])
            return True

        return await self._call(self._tx(work))

    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        return await self._beats((job, slot, token, now_ms, now_ms + lease_ms))

    async def _heartbeat_many(self, beats: list[Beat]) -> list[bool | BaseException]:
        """The heartbeats out together (:class:`~anarchon.engine.batch.Coalescer`): one
        transaction, each beat exactly one heartbeat (its own fence, its own answer)."""

        def work(conn: sqlite3.Connection) -> list[bool | BaseException]:
            answers: list[bool | BaseException] = []
            for job, slot, token, now_ms, until_ms in beats:
                run = transitions.heartbeat(self._get(conn, job, slot), token, now_ms, until_ms - now_ms)
                if run is not None:
                    self._put(conn, [run])
                answers.append(run is not None)
            return answers

        return await self._call(self._tx(work))

    async def finish(
        self, job: str, slot: int, token: str, now_ms: int, outcome: RunState, error: str | None = None
    ) -> bool:
        return await self._update(job, slot, lambda run: transitions.finish(run, token, now_ms, outcome, error))

    async def release(self, job: str, slot: int, token: str, now_ms: int, reason: str) -> bool:
        return await self._update(job, slot, lambda run: transitions.release(run, token, now_ms, reason))

    async def takeover(self, request: TakeoverRequest) -> ClaimResult:
        def work(conn: sqlite3.Connection) -> ClaimResult:
            result, write = transitions.takeover(self._get(conn, request.job, request.slot), request)
            if write is not None:
                self._put(conn, [write])
            return result

        return await self._call(self._tx(work))

    async def get_run(self, job: str, slot: int) -> Run | None:
        return await self._call(lambda: self._get(self._conn_or_fail(), job, slot))

    def _conn_or_fail(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError("the connection was closed")
        return self._conn

    async def active_runs(self, job: str) -> list[Run]:
        return await self._call(lambda: self._active(self._conn_or_fail(), job))

    async def expired_runs(self, now_ms: int, limit: int) -> list[Run]:
        def work() -> list[Run]:
            rows = (
                self._conn_or_fail()
                .execute(
                    f"SELECT {_COLUMNS} FROM anarchon_runs WHERE state IN ('Claimed', 'Running') AND lease_until <= ?"
                    " ORDER BY lease_until DESC LIMIT ?",
                    (now_ms, limit),
                )
                .fetchall()
            )
            return [_row_to_run(r) for r in rows]

        return await self._call(work)

    async def last_slot(self, job: str) -> int | None:
        def work() -> int | None:
            row = self._conn_or_fail().execute("SELECT MAX(slot) FROM anarchon_runs WHERE job=?", (job,)).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self._call(work)

    async def history(self, job: str, limit: int = 50) -> list[Run]:
        def work() -> list[Run]:
            rows = (
                self._conn_or_fail()
                .execute(f"SELECT {_COLUMNS} FROM anarchon_runs WHERE job=? ORDER BY slot DESC LIMIT ?", (job, limit))
                .fetchall()
            )
            runs = [_row_to_run(r) for r in rows]
            for run in runs:
                run.token = ""
            return runs

        return await self._call(work)

    async def schedule_since(self, job: str, fingerprint: str, now_ms: int) -> int:
        def work(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT fingerprint, since FROM anarchon_schedules WHERE job=?", (job,)).fetchone()
            if row is not None and row[0] == fingerprint:
                return int(row[1])
            conn.execute(
                "INSERT OR REPLACE INTO anarchon_schedules (job, fingerprint, since) VALUES (?, ?, ?)",
                (job, fingerprint, now_ms),
            )
            return now_ms

        return await self._call(self._tx(work))

    async def prune(self, job: str, before_slot: int) -> int:
        def work(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM anarchon_runs WHERE job=? AND slot<? AND state NOT IN (?, ?)"
                " AND slot < (SELECT MAX(slot) FROM anarchon_runs WHERE job=?)",
                (job, before_slot, *_ACTIVE, job),
            )
            return cur.rowcount

        return await self._call(self._tx(work))

    async def forget_job(self, job: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            _forget(conn, job)

        await self._call(self._tx(work))

    async def note_served(self, jobs: Sequence[str], now_ms: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO anarchon_served (job, at) VALUES (?, ?)"
                " ON CONFLICT (job) DO UPDATE SET at = MAX(at, excluded.at)",
                [(job, now_ms) for job in jobs],
            )

        await self._call(self._tx(work))

    async def forget_unserved(self, before_ms: int) -> list[str]:
        def work(conn: sqlite3.Connection) -> list[str]:
            gone = [str(row[0]) for row in conn.execute("SELECT job FROM anarchon_served WHERE at < ?", (before_ms,))]
            for job in gone:
                _forget(conn, job)
            return gone

        return await self._call(self._tx(work))

    async def note_shared_spec(
        self, job: str, cluster: str, fingerprint: str, now_ms: int, ttl_ms: int
    ) -> list[SharedSide]:
        def work(conn: sqlite3.Connection) -> list[SharedSide]:
            gone = (job, now_ms - ttl_ms, cluster)
            conn.execute("DELETE FROM anarchon_shared WHERE job=? AND seen<? AND cluster<>?", gone)
            rows = conn.execute("SELECT cluster, fingerprint, since, seen FROM anarchon_shared WHERE job=?", (job,))
            sides = [SharedSide(str(c), str(f), int(si), int(se)) for c, f, si, se in rows.fetchall()]
            ours = note_side(sides, cluster, fingerprint, now_ms)
            conn.execute(
                "INSERT OR REPLACE INTO anarchon_shared (job, cluster, fingerprint, since, seen)"
                " VALUES (?, ?, ?, ?, ?)",
                (job, cluster, fingerprint, ours.since, ours.seen_ms),
            )
            return [*(s for s in sides if s.cluster != cluster), ours]

        return await self._call(self._tx(work))

    async def drop_shared_spec(self, job: str, cluster: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM anarchon_shared WHERE job=? AND cluster=?", (job, cluster))

        await self._call(self._tx(work))

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM anarchon_presence WHERE until < ?", (now_ms,))
            conn.execute(
                "INSERT OR REPLACE INTO anarchon_presence (instance, until) VALUES (?, ?)", (instance, now_ms + ttl_ms)
            )

        await self._call(self._tx(work))

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        def work() -> set[str]:
            marks = ",".join("?" * len(instances))
            query = f"SELECT instance FROM anarchon_presence WHERE until > ? AND instance IN ({marks})"
            rows = self._conn_or_fail().execute(query, (now_ms, *instances)).fetchall()
            return {str(row[0]) for row in rows}

        return await self._call(work) if instances else set()
