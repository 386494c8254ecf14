"""Redis claim-only ``stream`` strategy against one plain ``XADD <key> <id>`` per key."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from anarchon.engine.backends.redis_claim import RedisStreamBackend
from bench.cases import BenchCase, local_redis

DESCRIPTION = "redis+stream:// (claim-only: XADD with an explicit ID in MULTI/EXEC) on a local redis-server"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    with local_redis() as server:
        url = "redis+stream" + server.url.removeprefix("redis")
        backend = RedisStreamBackend(url, ttl_ms=600_000)
        await backend.setup()
        client = backend.redis
        raw_prefix = f"bench-raw-{uuid.uuid4().hex[:8]}:"

        async def raw(i: int) -> object:
            # The bare insert-unless-present of a stream: XADD with an explicit ID on a fresh key
            # (the claim adds PEXPIRE and a read of the first entry in the same MULTI/EXEC).
            return await client.xadd(f"{raw_prefix}{i}", {"token": "t"}, id=f"{i + 1}-1")

        try:
            yield BenchCase(
                backend=backend,
                raw=raw,
                raw_label="XADD <id>",
                make_backend=lambda: RedisStreamBackend(url, ttl_ms=600_000),
            )
        finally:
            await backend.close()
