"""PostgreSQL lease backend against ``INSERT ... ON CONFLICT DO NOTHING`` through psycopg.

Both sides go through the same client (psycopg 3, async, autocommit, statements prepared
after a few executions) to the same local server, and the raw table has the same key as the
runs table, ``(job text, slot bigint)``. So the ratio shows what the claim's logic costs on
top of one insert: the PL/pgSQL call, the per-job advisory lock, the overlap check (Skip),
the jsonb attempts, and the Python around it (pool, parsing the row into a Run).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from anarchon.engine.backends.postgres import PostgresBackend
from bench.cases import BenchCase, CaseUnavailable

DESCRIPTION = "PostgresBackend (PL/pgSQL claim, one round trip) on a local PostgreSQL server"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    import psycopg
    from tests.servers.postgres import PostgresServer, ServerUnavailable

    try:
        server = PostgresServer()
        server.start()
    except ServerUnavailable as exc:
        raise CaseUnavailable(str(exc)) from exc
    try:
        backend = PostgresBackend(server.url, table=f"bench_{uuid.uuid4().hex[:8]}_runs")
        await backend.setup()
        conn = await psycopg.AsyncConnection.connect(server.url, autocommit=True)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_raw (job text NOT NULL, slot bigint NOT NULL, token text NOT NULL,"
            " PRIMARY KEY (job, slot))"
        )
        job = f"raw-{uuid.uuid4().hex[:8]}"

        async def raw(i: int) -> object:
            # The cheapest "insert unless present" PostgreSQL has: one statement, one round trip.
            cur = await conn.execute(
                "INSERT INTO bench_raw (job, slot, token) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (job, i, "t"),
            )
            return cur.rowcount

        try:
            yield BenchCase(backend=backend, raw=raw, raw_label="INSERT ON CONFLICT")
        finally:
            await backend.close()
            await conn.close()
    finally:
        server.stop()
