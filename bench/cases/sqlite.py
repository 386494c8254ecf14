"""SQLite lease backend against ``INSERT OR IGNORE`` in the same file, offloaded the same way.

The backend runs each call in a worker thread (``asyncio.to_thread``) on one connection in
WAL mode; the raw round trip does exactly that too, on a second connection to the same file
with the same pragmas, so the ratio shows the cost of the claim's transaction and logic
rather than of the thread hop, which both pay.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from anarchon.engine.backends.sqlite import SqliteBackend
from bench.cases import BenchCase

DESCRIPTION = "SqliteBackend (WAL, BEGIN IMMEDIATE, worker thread) on a temporary file"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    with tempfile.TemporaryDirectory(prefix="anarchon-bench-") as tmp:
        path = Path(tmp) / "bench.db"
        backend = SqliteBackend(path)
        await backend.setup()
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        lock = asyncio.Lock()

        def insert(i: int) -> object:
            return conn.execute("INSERT OR IGNORE INTO bench_raw (k, v) VALUES (?, '1')", (i,)).rowcount

        async def raw(i: int) -> object:
            async with lock:  # the backend serialises its connection the same way
                return await asyncio.to_thread(insert, i)

        try:
            yield BenchCase(
                backend=backend, raw=raw, raw_label="INSERT OR IGNORE", make_backend=lambda: SqliteBackend(path)
            )
        finally:
            await backend.close()
            conn.close()
