"""The store stopwatch (engine/observed.py): every call the engine makes is timed, errors too.

What the operator's ``anarchon_store_latency_seconds`` rests on: if a call went around the
wrapper, or the wrapper changed the kind of store, the histogram would lie or the engine would
lose its leases (it tells lease stores apart with ``isinstance``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from anarchon.engine import Backend, LeaseBackend, RunContext, RunState, Scheduler, StoreError, StoreObserver, observed
from anarchon.engine.backends import from_url
from tests.faults.storefaults import FaultyStore
from tests.harness.engine import Recorder, fast_clock
from tests.harness.until import until_async

SLOT = 1_800_000_000_000

Seen = list[tuple[str, float, BaseException | None]]


def _recorder() -> tuple[Seen, StoreObserver]:
    seen: Seen = []

    def observe(operation: str, seconds: float, error: BaseException | None) -> None:
        seen.append((operation, seconds, error))

    return seen, observe


async def test_a_run_through_an_observed_lease_store_times_every_call(tmp_path: Path) -> None:
    seen, observe = _recorder()
    inner = from_url(f"sqlite://{tmp_path / 's.db'}")
    store = observed(inner, observe)
    assert isinstance(store, LeaseBackend) and store.capabilities == inner.capabilities
    listener = Recorder()
    ran: list[int] = []

    clock = fast_clock(10.0)

    async def work(ctx: RunContext) -> None:
        ran.append(ctx.slot)
        await clock.sleep(1_500)  # past a heartbeat: one that ends at once has none

    sched = Scheduler(store, instance_id="solo", clock=clock, listener=listener)
    sched.every("timed", "1h", work, jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await sched.trigger("timed", SLOT)
        await until_async("the run's end", lambda: bool(listener.of("finished")))
    finally:
        await sched.stop()
    assert ran == [SLOT] and listener.of("finished")[0][4] == RunState.SUCCEEDED
    operations = {op for op, _, _ in seen}
    # The calls of one run's life, each timed; none failed, none took negative or absurd time.
    assert {"setup", "claim", "heartbeat", "finish"} <= operations, operations
    assert all(err is None and 0 <= secs < 30 for _, secs, err in seen), seen
    assert [op for op, _, _ in seen].count("claim") == 1


async def test_a_failed_store_call_is_timed_with_its_error(tmp_path: Path) -> None:
    """A failed claim is seen with its error, then the engine's retry is seen as a success."""
    seen, observe = _recorder()
    faulty = FaultyStore(from_url(f"sqlite://{tmp_path / 's.db'}"))  # type: ignore[arg-type]
    faulty.fail("claim", times=1)
    store = observed(faulty, observe)
    listener = Recorder()
    sched = Scheduler(store, instance_id="solo", clock=fast_clock(10.0), listener=listener)
    sched.every("timed", "1h", lambda ctx: asyncio.sleep(0), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await sched.trigger("timed", SLOT)
        await until_async("the run's end", lambda: bool(listener.of("finished")))
    finally:
        await sched.stop()
    claims = [(secs, err) for op, secs, err in seen if op == "claim"]
    assert len(claims) == 2, seen
    assert isinstance(claims[0][1], StoreError) and claims[1][1] is None


async def test_a_claim_only_store_stays_claim_only(redis_url: str) -> None:
    """The engine must not take a claim-only store for a lease store because it is wrapped."""
    seen, observe = _recorder()
    inner = from_url(redis_url.replace("redis://", "redis+script://", 1))
    store: Backend = observed(inner, observe)
    assert not isinstance(inner, LeaseBackend) and not isinstance(store, LeaseBackend)
    await store.setup()
    try:
        await store.ping()
    finally:
        await store.close()
    assert [op for op, _, _ in seen] == ["setup", "ping"]
