"""Redis claim-only ``script`` strategy against ``SET key 1 NX PX`` through the same client."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from anarchon.engine.backends.redis_claim import RedisScriptBackend
from bench.cases import BenchCase, local_redis, redis_set_nx

DESCRIPTION = "redis+script:// (claim-only: Lua SET NX PX, EVALSHA) on a local redis-server"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    with local_redis() as server:
        url = "redis+script" + server.url.removeprefix("redis")
        backend = RedisScriptBackend(url, ttl_ms=600_000)
        await backend.setup()
        try:
            yield BenchCase(
                backend=backend,
                raw=redis_set_nx(backend.redis),  # what the script does minus the script
                raw_label="SET NX PX",
                make_backend=lambda: RedisScriptBackend(url, ttl_ms=600_000),
            )
        finally:
            await backend.close()
