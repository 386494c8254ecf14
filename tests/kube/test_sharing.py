"""StoreSharing's judgement, check by check, on real stores: who is a stranger, and who never is.

The replicas' acts (what the run cache saw: anarchon.kube.runcache) are given by hand and the
checks' clock is a counter, so each rule is shown at the check where it applies; the presence
records are real, in real stores (SQLite files, Redis databases). The operator tests
(tests/operator/test_sharing.py) show the whole of it with replicas at work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from anarchon.engine import Backend
from anarchon.engine.backends import from_url
from anarchon.kube.sharing import STRIKES, WINDOW_PERIODS, StoreSharing

EVERY_S = 10.0


class Replica:
    """One replica's StoreSharing, its checks one period apart on a clock the test moves."""

    def __init__(self, store: Backend, name: str, acted: dict[str, float], clock: list[float]) -> None:
        self.changes = 0
        self.sharing = StoreSharing(
            store,
            name,
            lambda: acted,
            lambda: int(time.time() * 1000),
            every_s=EVERY_S,
            on_change=self._changed,
            monotonic=lambda: clock[0],
        )

    def _changed(self) -> None:
        self.changes += 1

    async def check(self) -> frozenset[str]:
        await self.sharing.check()
        return self.sharing.strangers


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[Backend, Backend]]:
    """Two SQLite files: two stores that know nothing of each other."""
    a, b = from_url(f"sqlite://{tmp_path / 'a.db'}"), from_url(f"sqlite://{tmp_path / 'b.db'}")
    await a.setup()
    await b.setup()
    yield a, b
    await a.close()
    await b.close()


async def test_a_replica_at_work_on_another_store_becomes_a_stranger_then_goes(
    stores: tuple[Backend, Backend],
) -> None:
    a, b = stores
    clock, acted = [0.0], {}
    me, other = Replica(a, "me", acted, clock), Replica(b, "other", {}, clock)
    window = EVERY_S * WINDOW_PERIODS
    # The first window: "other" is at work at every check, but nobody is judged yet (an older
    # version during an upgrade notes itself nowhere, and is gone by the window's end).
    while clock[0] <= window:
        acted["other"] = clock[0]
        await other.check()
        assert await me.check() == frozenset(), clock[0]
        clock[0] += EVERY_S
    # Then it is: absent from the store at STRIKES checks in a row while it goes on.
    for _ in range(STRIKES - 1):
        acted["other"] = clock[0]
        assert await me.check() == frozenset()
        clock[0] += EVERY_S
    acted["other"] = clock[0]
    assert await me.check() == {"other"}
    assert me.changes == 1
    assert me.sharing.message() is not None and "other" in (me.sharing.message() or "")
    # Not seen at work for a window: gone (scaled down), or quiet: no more a stranger.
    clock[0] += window + EVERY_S
    assert await me.check() == frozenset()
    assert me.changes == 2 and me.sharing.message() is None


async def test_a_replica_sharing_the_store_is_never_a_stranger(stores: tuple[Backend, Backend]) -> None:
    a, _ = stores
    clock, acted = [0.0], {}
    me, peer = Replica(a, "me", acted, clock), Replica(a, "peer", {}, clock)
    for _ in range(3 * WINDOW_PERIODS):
        acted["peer"] = clock[0]
        await peer.check()
        assert await me.check() == frozenset()
        clock[0] += EVERY_S
    assert me.changes == 0


async def test_a_store_that_lost_every_record_makes_no_stranger(redis_url: str) -> None:
    """A Redis restarted without its data forgets every presence record: a replica at work notes
    itself again within a period, and one that stopped before (its last act before the loss)
    stays unjudged; neither is called a stranger."""
    url = redis_url.rsplit("/", 1)[0] + "/2"
    store = from_url(url)
    await store.setup()
    raw = aioredis.Redis.from_url(url)
    try:
        await raw.flushdb()
        clock, acted = [0.0], {}
        me, live, dead = (Replica(store, n, acted, clock) for n in ("me", "live", "dead"))
        window = EVERY_S * WINDOW_PERIODS
        clock[0] = window + EVERY_S  # past the first window: judging
        for replica in (me, live, dead):
            await replica.check()
        acted["dead"] = clock[0]  # its last act, then it stops
        await raw.flushdb()  # the restart: every record gone
        for _ in range(WINDOW_PERIODS):
            acted["live"] = clock[0]
            assert await me.check() == frozenset(), clock[0]
            clock[0] += EVERY_S / 2
            await live.check()  # it notes itself again within a period
            clock[0] += EVERY_S / 2
        assert me.changes == 0
    finally:
        await raw.aclose()
        await store.close()
