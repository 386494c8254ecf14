"""StoreSharing's judgement, check by check, on real stores: who is a stranger, and who never is.

The replicas' acts (what the run cache saw: anarchon.kube.run.cache) are given by hand and the
checks' clock is a counter, so each rule is shown at the check where it applies; the presence
records are real, in real stores (SQLite files, Redis databases). The operator tests
(tests/operator/test_store_not_shared.py) show the whole of it with replicas at work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from controlplane import ControlPlane

from anarchon.engine import Backend, Scheduler, StoreError
from anarchon.engine.backends import from_url
from anarchon.kube.constants import GROUP, JOB_KIND, JOBS, VERSION
from anarchon.kube.job.sharing import STORE_NOT_SHARED, SUSPECT_PERIODS, WINDOW_PERIODS, StoreSharing
from anarchon.kube.job.spec import parse_job
from anarchon.kube.job.status import JobStatus
from anarchon.kube.report.kube_events import EventPoster

EVERY_S = 10.0


class Replica:
    """One replica's StoreSharing, its checks one period apart on a clock the test moves."""

    def __init__(
        self, store: Backend, name: str, acted: dict[str, float], clock: list[float], *, stored_clock: bool = False
    ) -> None:
        """``stored_clock``: the presence records age with the test's clock too, not the real one."""
        self.changes = 0
        start_ms = int(time.time() * 1000)
        self.sharing = StoreSharing(
            store,
            name,
            lambda: acted,
            (lambda: start_ms + int(clock[0] * 1000)) if stored_clock else (lambda: int(time.time() * 1000)),
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
    # Then it is: at work while absent from the store, at every check for SUSPECT_PERIODS periods.
    for _ in range(SUSPECT_PERIODS):
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


async def test_a_stranger_at_work_once_an_hour_stays_one_between_its_acts(
    stores: tuple[Backend, Backend],
) -> None:
    """A replica on another store whose jobs run hourly is at work once an hour: called a
    stranger at its first acts, it stays one between them (on main it was one for the window's
    200 s of each hour, and Ready flipped twice an hour), and once it stops acting it goes after
    twice its gap."""
    a, b = stores
    clock, acted = [0.0], {}
    me, other = Replica(a, "me", acted, clock), Replica(b, "other", {}, clock)
    hour = 36 * EVERY_S  # longer than the window (WINDOW_PERIODS periods), shortened for the test
    acts = [k * hour for k in range(1, 6)]
    judged = []
    while clock[0] <= acts[-1]:
        if clock[0] in acts:
            acted["other"] = clock[0]
            await other.check()
        judged.append(await me.check())
        clock[0] += EVERY_S
    first = judged.index(frozenset({"other"}))
    assert first <= acts[1] / EVERY_S + SUSPECT_PERIODS, "called a stranger a few periods after its second act"
    assert all(j == {"other"} for j in judged[first:]), "and one ever since, between its acts too"
    assert me.changes == 1
    # It stops: gone after twice the longest gap between its acts, not before.
    last = acts[-1]
    while clock[0] <= last + 2 * hour:
        assert await me.check() == {"other"}, clock[0]
        clock[0] += EVERY_S
    clock[0] += EVERY_S
    assert await me.check() == frozenset()
    assert me.changes == 2


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


async def test_a_sharing_replica_frozen_past_its_record_and_slow_to_note_is_no_stranger(
    stores: tuple[Backend, Backend],
) -> None:
    """A peer on the same store is frozen (SIGSTOP, a starved node) for five periods, longer than
    its record lives; when it wakes its queued writes show it at work at once, and its backlog
    holds its next note up for two periods. It was called a stranger after one (the harsh
    chaos soak's false StoreNotShared under load), and must not be."""
    a, _ = stores
    clock, acted = [0.0], {}
    me, peer = (Replica(a, n, acted, clock, stored_clock=True) for n in ("me", "peer"))
    clock[0] = EVERY_S * WINDOW_PERIODS + EVERY_S  # past the first window: judging
    for _ in range(3):
        acted["peer"] = clock[0]
        await peer.check()
        assert await me.check() == frozenset()
        clock[0] += EVERY_S
    for _ in range(5):  # frozen: no note, no act
        assert await me.check() == frozenset(), clock[0]
        clock[0] += EVERY_S
    for late in range(SUSPECT_PERIODS):  # awake and at work; its note comes SUSPECT_PERIODS - 1 periods late
        acted["peer"] = clock[0]
        if late == SUSPECT_PERIODS - 1:
            await peer.check()
        assert await me.check() == frozenset(), clock[0]
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


async def test_replicas_that_disagree_do_not_fight_over_ready(
    crds: ControlPlane, kube: Any, namespace: str, tmp_path: Path
) -> None:
    """One replica sees the store not shared, another does not (yet): each would put its own Ready
    back at every change of the job. The one that does not see it leaves the other's word while it
    is fresh; the one that said it takes it back itself once it no longer sees it."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": JOB_KIND,
        "metadata": {"name": "split"},
        "spec": {"every": "1h", "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, body)
    said: list[str | None] = ["the replicas do not share one store: r2 start runs..."]
    scheduler = Scheduler(from_url(f"sqlite://{tmp_path / 's.db'}"))
    sees = JobStatus(kube, scheduler, EventPoster(kube), not_shared=lambda: said[0], not_shared_kept_s=3600)
    sees_not = JobStatus(kube, scheduler, EventPoster(kube), not_shared=lambda: None, not_shared_kept_s=3600)

    async def handle(status: JobStatus) -> tuple[str, str]:
        """The job's change as a replica's watch hands it over; the job's Ready reason and version after."""
        job = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, "split")
        await status.valid(parse_job(job), job.get("status") or {}, job["metadata"]["resourceVersion"])
        job = await kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, "split")
        ready = next(c for c in job["status"]["conditions"] if c["type"] == "Ready")
        return ready["reason"], job["metadata"]["resourceVersion"]

    reason, version = await handle(sees)
    assert reason == STORE_NOT_SHARED
    assert await handle(sees_not) == (STORE_NOT_SHARED, version), "another's fresh word stands: no write"
    assert await handle(sees) == (STORE_NOT_SHARED, version), "said already: no write"
    sees_not.not_shared_kept_s = 0.0  # now it is old: the one that does not see it says Scheduled
    reason, version = await handle(sees_not)
    assert reason == "Scheduled"
    assert (await handle(sees))[0] == STORE_NOT_SHARED, "the one that sees it says it again, once"
    said[0] = None  # and once it sees the store shared, it takes its own word back at once
    assert (await handle(sees))[0] == "Scheduled"


async def test_failed_presence_calls_change_nothing_and_a_few_missed_notes_make_no_stranger(tmp_path: Path) -> None:
    """Store faults on the two presence calls, on one shared store (SQLite, its records' expiry on
    the test's clock): a check whose call fails, before it was sent or with its reply lost, leaves
    the judgement as it was; a replica at work whose notes fail for fewer periods than its record
    lives is never called a stranger."""
    from anarchon.kube.job.sharing import TTL_PERIODS
    from tests.faults.storefaults import FaultyStore

    shared = from_url(f"sqlite://{tmp_path / 'shared.db'}")
    await shared.setup()
    mine, theirs = FaultyStore(shared), FaultyStore(shared)  # type: ignore[arg-type]
    clock, acted = [0.0], {}

    def sharing(store: Backend, name: str, seen: dict[str, float]) -> StoreSharing:
        now_ms = lambda: 1_800_000_000_000 + int(clock[0] * 1000)  # noqa: E731
        return StoreSharing(store, name, lambda: seen, now_ms, every_s=EVERY_S, monotonic=lambda: clock[0])

    me, peer = sharing(mine, "me", acted), sharing(theirs, "peer", {})
    try:
        for period in range(2 * WINDOW_PERIODS):
            acted["peer"] = clock[0]
            if period % TTL_PERIODS == 0:
                await peer.check()  # a note each TTL_PERIODS periods: as long as one lives
            else:
                theirs.fail("note_presence")
                with pytest.raises(StoreError):
                    await peer.check()  # its note fails; it goes on at work
            if period % 5 == 3:
                mine.fail("present", reply_lost=period % 10 == 3)
                with pytest.raises(StoreError):
                    await me.check()
            else:
                await me.check()
            assert me.strangers == frozenset(), period
            clock[0] += EVERY_S
        assert theirs.calls["note_presence"] == 2 * WINDOW_PERIODS
        assert mine.calls["present"] >= 2 * WINDOW_PERIODS - 2  # the first checks ask about nobody
    finally:
        await shared.close()
