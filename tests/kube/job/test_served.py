"""ServedJobs: the store data of a job deleted while no replica watched goes a week later; a
job some replica still serves stays, however long ago another replica stopped noting it.

Real SQLite store, fast-forwarded clock (the week is simulated in ten-minute passes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from anarchon.engine import LeaseBackend, RunState
from anarchon.engine.backend import ClaimRequest
from anarchon.engine.backends import from_url
from anarchon.engine.errors import StoreError
from anarchon.kube.job.served import FORGET_AFTER_MS, FORGET_EVERY_MS, NOTE_EVERY_MS, ServedJobs
from tests.faults.storefaults import FaultyStore

T0 = 1_800_000_000_000


class Clock:
    """Set by hand: the test's passes are ten minutes apart."""

    def __init__(self) -> None:
        self.ms = T0

    def now_ms(self) -> int:
        return self.ms

    async def sleep_until(self, t_ms: int) -> None:
        self.ms = max(self.ms, t_ms)

    async def sleep(self, ms: int) -> None:
        self.ms += ms


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LeaseBackend]:
    backend = from_url(f"sqlite://{tmp_path / 's.db'}")
    assert isinstance(backend, LeaseBackend)
    await backend.setup()
    yield backend
    await backend.close()


async def _ran(store: LeaseBackend, job: str) -> None:
    request = ClaimRequest(job=job, slot=T0, instance="r", token=f"{job}-t", now_ms=T0, lease_ms=10_000)
    assert (await store.claim(request)).won
    await store.finish(job, T0, f"{job}-t", T0, RunState.SUCCEEDED)


async def test_a_job_nobody_serves_any_more_is_forgotten_after_a_week_and_only_it(store: LeaseBackend) -> None:
    clock = Clock()
    for job in ("kept", "deleted-while-down"):
        await _ran(store, job)
    other_cluster = ServedJobs(store, clock)  # serves "kept" only, as its replicas do
    stopped = ServedJobs(store, clock)  # served "deleted-while-down", then went down for good
    await stopped.tick(["deleted-while-down"])
    notes = 0
    forgotten_at: int | None = None
    while clock.ms < T0 + FORGET_AFTER_MS + 2 * FORGET_EVERY_MS:
        await other_cluster.tick(["kept"])
        notes += 1
        if forgotten_at is None and not await store.history("deleted-while-down"):
            forgotten_at = clock.ms
        clock.ms += NOTE_EVERY_MS
    assert forgotten_at is not None, "the job nobody served kept its data"
    assert T0 + FORGET_AFTER_MS <= forgotten_at <= T0 + FORGET_AFTER_MS + FORGET_EVERY_MS + NOTE_EVERY_MS
    assert [r.slot for r in await store.history("kept")] == [T0], "a served job keeps its data"
    assert notes > 1000  # a week of ten-minute passes: each one store call, not one per job


async def test_a_new_replica_forgets_nothing_before_it_noted_its_jobs_for_a_while(store: LeaseBackend) -> None:
    """A replica that starts after a long outage must first note its own jobs (the job watch's
    listing may still be handled at its first pass): it forgets only a period after its first note."""
    clock = Clock()
    await _ran(store, "mine")
    await ServedJobs(store, clock).tick(["mine"])
    clock.ms += FORGET_AFTER_MS + FORGET_EVERY_MS  # every replica down for more than a week
    restarted = ServedJobs(store, clock)
    await restarted.tick([])  # its first pass: the listing not handled yet
    assert [r.slot for r in await store.history("mine")] == [T0], "forgot before noting"
    clock.ms += NOTE_EVERY_MS
    await restarted.tick(["mine"])
    clock.ms += FORGET_EVERY_MS
    await restarted.tick(["mine"])
    assert [r.slot for r in await store.history("mine")] == [T0]


async def test_a_note_or_forget_that_fails_or_loses_its_reply_is_made_again_and_forgets_once(
    store: LeaseBackend,
) -> None:
    """The store fails the note, then the forget, then loses the forget's reply (it did forget):
    each is made again at the next pass, the served job is never forgotten, the other once."""
    clock = Clock()
    for job in ("kept", "deleted-while-down"):
        await _ran(store, job)
    await ServedJobs(store, clock).tick(["deleted-while-down"])  # its last note, a week and more ago
    clock.ms += FORGET_AFTER_MS
    faulty = FaultyStore(store)
    served = ServedJobs(faulty, clock)
    faulty.fail("note_served")
    with pytest.raises(StoreError):
        await served.tick(["kept"])  # the controller's resync logs it and passes again
    await served.tick(["kept"])
    assert faulty.calls["note_served"] == 2, "the failed note is made again at the next pass"
    clock.ms += FORGET_EVERY_MS
    failed = faulty.fail("forget_unserved")
    lost = faulty.fail("forget_unserved", reply_lost=True)
    for _ in range(2):
        with pytest.raises(StoreError):
            await served.tick(["kept"])
    assert (failed.fired, lost.fired) == (1, 1)
    assert not await store.history("deleted-while-down"), "forgotten by the call whose reply was lost"
    await served.tick(["kept"])  # made again: nothing left to forget, no error
    assert faulty.calls["forget_unserved"] == 3
    assert [r.slot for r in await store.history("kept")] == [T0]
