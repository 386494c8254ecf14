"""Presence records on Redis, for both Redis stores (lease and claim-only): one sorted set.

Members are instances, scores the moment their record runs out (the callers' clock, as every
time in the engine). One key, so it works on a Redis Cluster too (the claim-only strategies
run there). Records that ran out are trimmed at every note.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis


async def note(client: Redis, key: str, instance: str, now_ms: int, ttl_ms: int) -> None:
    async with client.pipeline(transaction=True) as pipe:
        pipe.zremrangebyscore(key, "-inf", f"({now_ms}")
        pipe.zadd(key, {instance: now_ms + ttl_ms})
        await pipe.execute()


async def present(client: Redis, key: str, instances: Sequence[str], now_ms: int) -> set[str]:
    if not instances:
        return set()
    scores = await client.zmscore(key, list(instances))
    return {instance for instance, score in zip(instances, scores, strict=True) if score is not None and score > now_ms}
