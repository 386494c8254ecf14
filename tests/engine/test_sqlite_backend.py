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


async def test_heartbeats_out_together_are_one_transaction_each_fenced_on_its_own(tmp_path: Path) -> None:
    """Forty runs beat at once: two write transactions (one beat sent alone while nothing was out,
    then the thirty-nine that came meanwhile), as SQLite's own trace of the connection shows; it
    was forty. A stale token and a run never claimed are refused in the batch, each on its own."""
    backend = SqliteBackend(tmp_path / "beats.db")
    await backend.setup()
    try:
        runs = [ClaimRequest(f"j{i:02d}", 1, "a", f"tok-{i}", 0, 1_000, Overlap.ALLOW) for i in range(40)]
        assert all(not isinstance(r, BaseException) and r.won for r in await backend.claim_many(runs))
        statements: list[str] = []
        conn = backend._conn
        assert conn is not None
        conn.set_trace_callback(statements.append)
        beats = [(r.job, r.token) for r in runs]
        beats[7] = ("j07", "stale")
        beats.append(("never-claimed", "tok"))
        answers = await asyncio.gather(*(backend.heartbeat(j, 1, t, 500, 1_000) for j, t in beats))
        conn.set_trace_callback(None)
        assert statements.count("BEGIN IMMEDIATE") == 2, statements[:5]
        assert answers == [i not in (7, 40) for i in range(len(beats))], answers
        leases = {r.job: run.lease_until_ms for r in runs if (run := await backend.get_run(r.job, 1))}
        assert leases == {r.job: 1_000 if r.job == "j07" else 1_500 for r in runs}
    finally:
        await backend.close()
