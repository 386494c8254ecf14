"""Presence records, held against every real store: lease stores and claim-only ones alike.

What the operator asks of a store to tell replicas that share it from replicas on stores of
their own (see anarchon.kube.job.sharing): an instance noted is present until its record runs out,
whoever asks, and an instance never noted (or noted in another store) is not.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from anarchon.engine import Backend
from anarchon.engine.backends import from_url

STORES = ["sqlite", "redis", "postgres", "redis+script", "redis+stream", "nats", "rabbitmq"]


def _url_for(request: pytest.FixtureRequest, store: str, tmp_path: Path) -> str:
    if store == "sqlite":
        return f"sqlite://{tmp_path / 'anarchon.db'}"
    if store.startswith("redis"):
        return store + str(request.getfixturevalue("redis_url")).removeprefix("redis")
    fixture = {"postgres": "postgres_url", "nats": "nats_url", "rabbitmq": "amqp_url"}[store]
    return str(request.getfixturevalue(fixture))


def _now() -> int:
    return int(time.time() * 1000)


def _instance(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=STORES)
async def two(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Backend, Backend]]:
    """Two connections to one store, as two instances have."""
    url = _url_for(request, str(request.param), tmp_path)
    backends = (from_url(url), from_url(url))
    await asyncio.gather(*(b.setup() for b in backends))
    yield backends
    await asyncio.gather(*(b.close() for b in backends))


async def test_an_instance_noted_is_present_for_every_connection(two: tuple[Backend, Backend]) -> None:
    a, b = two
    me, other, never = _instance("me"), _instance("other"), _instance("never")
    now = _now()
    await a.note_presence(me, now, 60_000)
    await b.note_presence(other, now, 60_000)
    assert await b.present([me, other, never], now) == {me, other}
    assert await a.present([never], now) == set()
    assert await a.present([], now) == set()
    await a.note_presence(me, _now(), 60_000)  # noted again: still one record, still present
    assert await b.present([me], _now()) == {me}


async def test_presence_is_per_store(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Two SQLite files and two Redis databases: what one notes, the other does not know."""
    redis = str(request.getfixturevalue("redis_url")).rsplit("/", 1)[0]
    for first, second in (
        (f"sqlite://{tmp_path / 'a.db'}", f"sqlite://{tmp_path / 'b.db'}"),
        (f"{redis}/0", f"{redis}/1"),
    ):
        a, b = from_url(first), from_url(second)
        await asyncio.gather(a.setup(), b.setup())
        try:
            me = _instance("me")
            await a.note_presence(me, _now(), 60_000)
            assert await a.present([me], _now()) == {me}
            assert await b.present([me], _now()) == set(), second
        finally:
            await asyncio.gather(a.close(), b.close())


async def test_a_record_runs_out_in_every_store(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Noted for a second: present, then gone once the second is over (one wait for all the
    stores: RabbitMQ's queues run out by the broker's clock), then present again once noted."""
    stores: dict[str, Backend] = {s: from_url(_url_for(request, s, tmp_path)) for s in STORES}
    await asyncio.gather(*(b.setup() for b in stores.values()))
    try:
        brief = {s: _instance("brief") for s in STORES}
        stay = {s: _instance("stay") for s in STORES}

        async def each(check: Callable[[str, Backend], Awaitable[None]]) -> None:
            await asyncio.gather(*(check(s, b) for s, b in stores.items()))

        async def note(store: str, backend: Backend) -> None:
            await backend.note_presence(brief[store], _now(), 1_000)
            await backend.note_presence(stay[store], _now(), 60_000)

        async def both_present(store: str, backend: Backend) -> None:
            assert await backend.present([brief[store], stay[store]], _now()) == {brief[store], stay[store]}, store

        async def brief_gone(store: str, backend: Backend) -> None:
            assert await backend.present([brief[store], stay[store]], _now()) == {stay[store]}, store

        await each(note)
        await each(both_present)
        await asyncio.sleep(2.0)
        await each(brief_gone)
        await each(note)
        await each(both_present)
    finally:
        await asyncio.gather(*(b.close() for b in stores.values()))
