"""Redis lease backend against ``SET key 1 NX PX`` through the same redis-py client."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from anarchon.engine.backends.redis import RedisBackend
from bench.cases import BenchCase, local_redis, redis_set_nx

DESCRIPTION = "RedisBackend (Lua scripts, EVALSHA) on a local redis-server"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    with local_redis() as server:
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        backend = RedisBackend(server.url, prefix=prefix)
        await backend.setup()
        try:
            yield BenchCase(
                backend=backend,
                raw=redis_set_nx(backend.client),
                raw_label="SET NX PX",
                target_p99_ms=5.0,
                make_backend=lambda: RedisBackend(server.url, prefix=prefix),
            )
        finally:
            await backend.close()
