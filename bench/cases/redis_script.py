"""Redis claim-only ``script`` strategy against ``SET key 1 NX PX`` through the same client."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from anarchon.engine.backends.redis_claim import RedisScriptBackend
from bench.cases import BenchCase, local_redis

DESCRIPTION = "redis+script:// (claim-only: Lua SET NX PX, EVALSHA) on a local redis-server"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    with local_redis() as server:
        url = "redis+script" + server.url.removeprefix("redis")
        backend = RedisScriptBackend(url, ttl_ms=600_000)
        await backend.setup()
        client = backend.redis
        raw_prefix = f"bench-raw-{uuid.uuid4().hex[:8]}:"

        async def raw(i: int) -> object:
            # What the script does minus the script: one SET NX PX, one round trip.
            return await client.set(f"{raw_prefix}{i}", "1", nx=True, px=600_000)

        try:
            yield BenchCase(
                backend=backend,
                raw=raw,
                raw_label="SET NX PX",
                make_backend=lambda: RedisScriptBackend(url, ttl_ms=600_000),
            )
        finally:
            await backend.close()
