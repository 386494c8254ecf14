"""SQLite-specific: the connection lives in one worker thread, whatever the callers do."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from anarchon.engine import ClaimRequest, Overlap, StoreError
from anarchon.engine.backends.sqlite import SqliteBackend


async def test_cancelled_calls_and_close_never_share_the_connection(tmp_path: Path) -> None:
    """Callers cancelled mid-statement, then close(): the statement finishes first, nothing crashes.

    Before the single-thread executor this crashed the interpreter (SIGSEGV in sqlite3) when
    close() ran while a cancelled caller's statement was still running in another thread.
    """
    rng = random.Random(7)
    for round_ in range(20):
        backend = SqliteBackend(tmp_path / f"r{round_}.db")
        await backend.setup()
        tasks = [
            asyncio.create_task(backend.claim(ClaimRequest("job", slot, "a", f"t{slot}", 0, 1000, Overlap.SKIP)))
            for slot in range(50)
        ]
        await asyncio.sleep(rng.random() / 200)
        for task in tasks:
            if rng.random() < 0.5:
                task.cancel()
        await backend.close()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, (asyncio.CancelledError, StoreError)) or r.outcome for r in results)


async def test_use_before_setup_and_after_close_is_a_store_error(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    with pytest.raises(StoreError, match="setup"):
        await backend.last_slot("job")
    with pytest.raises(StoreError, match="setup"):
        await backend.ping()  # a readiness probe before the store is open says not ready
    await backend.setup()
    await backend.ping()
    await backend.close()
    with pytest.raises(StoreError, match="close"):
        await backend.last_slot("job")
    with pytest.raises(StoreError, match="close"):
        await backend.ping()
    await backend.setup()  # and it can be opened again
    assert await backend.last_slot("job") is None
    await backend.close()


async def test_a_record_written_before_the_rename_reads_as_succeeded(tmp_path: Path) -> None:
    """Earlier versions stored "Success"; the engine's word (and the AnarchonRun's) is now "Succeeded"."""
    import sqlite3

    from anarchon.engine import RunState

    backend = SqliteBackend(tmp_path / "store.db")
    await backend.setup()
    try:
        await backend.claim(ClaimRequest("j", 1, "i", "t1", 10, 1_000, Overlap.ALLOW))
        assert await backend.finish("j", 1, "t1", 20, RunState.SUCCEEDED)
        with sqlite3.connect(tmp_path / "store.db") as conn:  # as an earlier version left it
            conn.execute(
                "UPDATE anarchon_runs SET state = 'Success', attempts = replace(attempts, 'Succeeded', 'Success')"
            )
        run = await backend.get_run("j", 1)
        assert run is not None and run.state is RunState.SUCCEEDED
        assert [a.outcome for a in run.attempts] == [RunState.SUCCEEDED]
    finally:
        await backend.close()
