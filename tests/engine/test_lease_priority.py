"""Lease writes do not queue behind other calls: a heartbeat is answered while every other
connection of the store client is busy.

Under overload (a thousand jobs due at once) the claims and reads fill the client's pool. A
heartbeat waiting behind them for a connection comes late, the lease runs out under a live
runner, a backup takes over, and the run runs twice or is given up. Here the pool's
connections are held by slow calls (Redis BLPOP, PostgreSQL pg_sleep) and a heartbeat must
still be answered at once, through the lease writes' own connections.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest

from anarchon.engine import ClaimRequest, LeaseBackend, Overlap, RunState
from anarchon.engine.backends.postgres import PostgresBackend
from anarchon.engine.backends.redis import RedisBackend

NOW = 1_800_000_000_000
LEASE = 6_000
BUSY_S = 4.0


async def _heartbeat_beside_busy_pool(backend: LeaseBackend, occupy: Callable[[], Awaitable[object]]) -> None:
    job = f"prio-{uuid.uuid4().hex[:8]}"
    await backend.setup()
    try:
        claimed = await backend.claim(ClaimRequest(job, 1, "a", "t1", NOW, LEASE, Overlap.ALLOW))
        assert claimed.won
        busy = [asyncio.create_task(occupy()) for _ in range(2)]  # the pool has 2 connections
        try:
            await asyncio.sleep(0.3)  # both slow calls are on their connections now
            # Sanity: the pool really is full, an ordinary read waits.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(backend.get_run(job, 1), 0.5)
            assert await asyncio.wait_for(backend.heartbeat(job, 1, "t1", NOW + 1_000, LEASE), 1.5)
            assert await asyncio.wait_for(backend.finish(job, 1, "t1", NOW + 2_000, RunState.SUCCEEDED), 1.5)
        finally:
            await asyncio.gather(*busy, return_exceptions=True)
    finally:
        await backend.close()


async def test_redis_heartbeat_is_answered_while_the_pool_is_busy(redis_url: str) -> None:
    backend = RedisBackend(redis_url, prefix=f"prio-{uuid.uuid4().hex[:6]}", max_connections=2)
    await _heartbeat_beside_busy_pool(
        backend, lambda: backend.client.blpop([f"nothing-{uuid.uuid4().hex}"], timeout=BUSY_S)
    )


async def test_postgres_heartbeat_is_answered_while_the_pool_is_busy(postgres_url: str) -> None:
    backend = PostgresBackend(postgres_url, pool_size=2)

    async def sleep_on_a_connection() -> None:
        await backend._run(lambda conn: conn.execute(f"SELECT pg_sleep({BUSY_S})"))

    await _heartbeat_beside_busy_pool(backend, sleep_on_a_connection)
