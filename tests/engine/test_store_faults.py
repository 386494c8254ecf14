"""A store call that fails, or succeeds with its reply lost, never misrecords, loses or repeats a run.

Each test aims one fault at one call (tests/faults/storefaults.py, in front of each real
lease store) and checks what the store recorded against what the handler really did.
Every one of these failed on the engine before the one retry policy (engine/retry.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from anarchon.engine import (
    ClaimOutcome,
    LeaseBackend,
    RunContext,
    RunInterrupted,
    RunState,
    ScaledClock,
    Scheduler,
    new_token,
)
from anarchon.engine.backend import ClaimRequest
from tests.faults.storefaults import FaultyStore
from tests.harness.engine import Calls, Recorder, fast_clock, ran_once_then_down
from tests.harness.until import until_async

SLOT = 1_800_000_000_000


async def one_attempt(sched: Scheduler, job: str, listener: Recorder) -> None:
    """Start ``sched``, trigger ``job`` at SLOT and wait for its attempt's end (finished or fenced)."""
    await sched.start()
    await sched.trigger(job, SLOT)
    await until_async("the attempt's end", lambda: bool(listener.of("finished") or listener.of("fenced")))


async def test_a_store_blip_at_confirm_is_retried_not_taken_for_fenced(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """One failed heartbeat inside confirm(): the handler must hear "yours", do its work, succeed.

    Before: confirm() answered False on any store error, the handler (like the Pod runner)
    stopped before its side effect and returned, and the engine recorded Success for work
    that never happened.
    """
    clock = fast_clock(10.0)
    store = FaultyStore(make_backend())
    listener = Recorder()
    calls = Calls(clock)
    did: list[int] = []

    async def careful(ctx: RunContext) -> None:
        store.fail("heartbeat", times=1)
        if not await ctx.confirm():
            return  # what a handler does when fenced: no side effect
        did.append(ctx.slot)

    sched = Scheduler(store, instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(careful), jitter=0, heartbeat="1s", lease="3s")
    try:
        await one_attempt(sched, job_name, listener)
        run = await store.inner.get_run(job_name, SLOT)
        assert run is not None
        assert store.rules[0].fired == 1, "the fault must have hit confirm()'s heartbeat"
        assert did == [SLOT], "confirm() must retry a store error within the lease and say yes"
        assert run.state is RunState.SUCCEEDED
    finally:
        await sched.stop(handover=False)
        await store.close()


async def test_a_store_outage_past_the_lease_at_confirm_records_no_success(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """confirm() cannot reach the store for longer than the lease: nothing is written as Success."""
    clock = fast_clock(10.0)
    store = FaultyStore(make_backend())
    listener = Recorder()
    calls = Calls(clock)

    async def careful(ctx: RunContext) -> None:
        store.fail("heartbeat", times=10_000)
        ok = await ctx.confirm()
        store.rules.clear()
        if not ok:
            return

    sched = Scheduler(store, instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(careful), jitter=0, heartbeat="1s", lease="3s", max_attempts=1)
    await sched.start()
    try:
        await sched.trigger(job_name, SLOT)
        await until_async("confirm() to give up", lambda: calls.calls and calls.calls[0].stop_reason is not None)
        await asyncio.sleep(0.5)  # 5 fake seconds: a wrongly written Success would be there by now
        run = await store.inner.get_run(job_name, SLOT)
        assert run is not None
        assert run.state is not RunState.SUCCEEDED, "an attempt that did nothing was recorded Success"
        assert calls.calls[0].stop_reason == "lease lost"
        assert not listener.of("finished"), listener.events
    finally:
        await sched.stop(handover=False)
        await store.close()


async def test_a_finish_whose_reply_was_lost_is_reported_finished(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """The store recorded Success, the reply was lost: the retry is refused, a read tells it was ours."""
    clock = fast_clock(10.0)
    store = FaultyStore(make_backend())
    store.fail("finish", reply_lost=True)
    listener = Recorder()
    calls = Calls(clock)
    sched = Scheduler(store, instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await sched.trigger(job_name, SLOT)
        await until_async("the attempt's end", lambda: bool(listener.of("finished") or listener.of("fenced")))
        assert store.rules[0].fired == 1
        assert [e[4] for e in listener.of("finished")] == ["Succeeded"], listener.events
        assert not listener.of("fenced"), listener.events
        run = await store.inner.get_run(job_name, SLOT)
        assert run is not None and run.state is RunState.SUCCEEDED
    finally:
        await sched.stop(handover=False)
        await store.close()


async def test_a_takeover_whose_reply_was_lost_keeps_its_attempt(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """The store gave us attempt 2 but the reply was lost: we run attempt 2; no attempt 3 is burnt."""
    clock = fast_clock(10.0)
    store = FaultyStore(make_backend())
    await store.setup()
    dead = ClaimRequest(job_name, SLOT, "dead", new_token(), clock.now_ms(), 2_000)
    assert (await store.inner.claim(dead)).won  # a runner that died at once: its lease runs out
    store.fail("takeover", reply_lost=True)
    listener = Recorder()
    calls = Calls(clock)
    sched = Scheduler(store, instance_id="backup", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(), jitter=0, heartbeat="1s", lease="2s", max_attempts=3)
    await sched.start()
    try:
        await until_async("the run to finish", lambda: bool(listener.of("finished")), timeout=30)
        assert store.rules[0].fired == 1
        run = await store.inner.get_run(job_name, SLOT)
        assert run is not None
        assert run.state is RunState.SUCCEEDED
        assert run.attempt == 2, [(a.attempt, a.instance, a.outcome, a.error) for a in run.attempts]
        assert [c.attempt for c in calls.calls] == [2]
    finally:
        await sched.stop(handover=False)
        await store.close()


async def test_a_claim_whose_reply_was_lost_is_won(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    """The claim went through, its reply did not: the retry sees "taken", the token says it is ours."""
    clock = fast_clock(10.0)
    store = FaultyStore(make_backend())
    store.fail("claim", reply_lost=True)
    calls = Calls(clock)
    sched = Scheduler(store, instance_id="solo", clock=clock)
    sched.every(job_name, "1h", calls.handler(), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        result = await sched.trigger(job_name, SLOT)
        assert store.rules[0].fired == 1
        assert result.won
        await until_async("the run", lambda: len(calls.calls) == 1)
    finally:
        await sched.stop(handover=False)
        await store.close()


async def test_a_skip_whose_reply_was_lost_is_still_reported(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """Overlap Skip: the claim recorded the slot Skipped, its reply was lost, the retry sees "taken".

    Before, nobody reported the skip (the record is written once, for everyone, and the one who
    wrote it took it for someone else's): the operator wrote no run object for the slot, and
    the chaos soak counted it lost.
    """
    clock = fast_clock(10.0)
    store = FaultyStore(make_backend())
    listener = Recorder()
    release = asyncio.Event()

    async def busy(ctx: RunContext) -> None:
        await release.wait()

    sched = Scheduler(store, instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", busy, jitter=0, heartbeat="1s", lease="3s", overlap="Skip")
    await sched.start()
    try:
        assert (await sched.trigger(job_name, SLOT)).won
        lost = store.fail("claim", reply_lost=True)
        result = await sched.trigger(job_name, SLOT + 1_000)
        assert lost.fired == 1
        assert result.outcome is ClaimOutcome.SKIPPED, result
        assert [e[2] for e in listener.of("skipped")] == [str(SLOT + 1_000)]
        run = await store.inner.get_run(job_name, SLOT + 1_000)
        assert run is not None and run.state is RunState.SKIPPED
    finally:
        release.set()
        await sched.stop(handover=False)
        await store.close()


async def test_a_hand_over_does_not_use_up_an_attempt(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    """maxAttempts 1: the runner's instance stops (a rolling update); the backup still runs the run.

    Before, the hand-over counted as the one attempt, and the run was given up as Interrupted.
    """
    clock = fast_clock(10.0)
    calls = Calls(clock)
    released = asyncio.Event()

    async def long_then_quick(ctx: RunContext) -> None:
        if ctx.attempt == 1:
            await ctx.stop.wait()
            raise asyncio.CancelledError  # the instance is going: hand the run over
        released.set()

    listener = Recorder()
    one = Scheduler(make_backend(), instance_id="one", clock=clock)
    two = Scheduler(make_backend(), instance_id="two", clock=clock, listener=listener)
    for sched in (one, two):
        sched.every(
            job_name, "1h", calls.handler(long_then_quick), jitter=0, heartbeat="1s", lease="3s", max_attempts=1
        )
        await sched.start()
    try:
        await one.trigger(job_name, SLOT)
        await until_async("attempt 1 on one", lambda: len(calls.calls) == 1)
        await one.stop(handover=True)
        await until_async("the run to end on two", lambda: bool(listener.of("finished")), timeout=30)
        run = await two.backend.get_run(job_name, SLOT)  # type: ignore[attr-defined]
        assert run is not None
        assert run.state is RunState.SUCCEEDED, run.error
        assert [(c.attempt, c.instance) for c in calls.calls] == [(1, "one"), (2, "two")]
        assert (run.attempts[0].error or "").startswith("handed over"), run.attempts[0]
    finally:
        await one.backend.close()
        await two.stop(handover=False)
        await two.backend.close()


async def test_slots_slept_through_follow_the_catch_up_policy_not_a_burst(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """The event loop stalls for ~10 slots (catchUp None): one slot runs after it, the rest are missed."""
    clock = fast_clock(10.0)
    listener = Recorder()
    calls = Calls(clock)
    sched = Scheduler(make_backend(), instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1s", calls.handler(), jitter=0, heartbeat="1s", overlap="Allow")
    await sched.start()
    try:
        await until_async("runs before the stall", lambda: len(calls.calls) >= 2)
        before = clock.now_ms()
        time.sleep(1.2)  # noqa: ASYNC251 - the stall under test: blocks the loop: 12 fake seconds, ~12 slots slept through
        after = clock.now_ms()
        await asyncio.sleep(0.15)  # 1.5 fake seconds: everything the wake-up fires has fired
        stalled = [c for c in calls.calls if before < c.slot <= after]
        missed = [e for e in listener.of("missed") if before < int(e[2]) <= after]
        assert len(stalled) <= 1, f"{len(stalled)} slots slept through ran at once"
        assert len(missed) >= 9, listener.of("missed")
        assert all("slept through" in e[3] for e in missed)
    finally:
        await sched.stop(handover=False)
        await sched.backend.close()


async def test_catch_up_all_with_skip_runs_every_missed_slot_across_instances(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """Three instances catch up 4 missed slots under overlap Skip: every one runs, none is Skipped.

    Before, the instances that lost the first slot's claim went straight on to the next ones
    and found the first run still active: Skipped.
    """
    factor = 5.0  # a heartbeat of 200 real ms: at 20x (50 ms) a loaded machine's stall cost a lease
    t0 = 1_800_000_000_000
    # History: one run at t0 + 1 min, then nobody up until t0 + 5.5 min.
    await ran_once_then_down(make_backend(), job_name, t0, factor)
    clock = ScaledClock(factor, start_ms=t0 + 330_000)
    calls = Calls(clock)
    listener = Recorder()

    async def takes_a_while(ctx: RunContext) -> None:
        await clock.sleep(3_000)

    scheds = [Scheduler(make_backend(), instance_id=f"i{n}", clock=clock, listener=listener) for n in range(3)]
    for sched in scheds:
        sched.every(
            job_name, "1m", calls.handler(takes_a_while), jitter=0, heartbeat="1s", catch_up="All", overlap="Skip"
        )
    await asyncio.gather(*(s.start() for s in scheds))
    try:
        missed = [t0 + 120_000, t0 + 180_000, t0 + 240_000, t0 + 300_000]
        await until_async("the catch-up", lambda: sum(1 for e in listener.of("finished")) >= len(missed), timeout=30)
        assert sorted(c.slot for c in calls.calls) == missed, "\n".join(map(str, listener.events))
        assert not listener.of("skipped"), listener.of("skipped")
    finally:
        for sched in scheds:
            await sched.stop(handover=False)
            await sched.backend.close()


async def test_a_sweep_that_fails_or_loses_its_reply_still_takes_a_hand_over(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """The backup sweep's one query fails twice, then its reply is lost once: the handed-over
    run is still taken over (attempt 2), and it ends as its handler did, Succeeded."""
    clock = fast_clock(4.0)  # a lease of 1.5 s real time: a busy machine does not let it run out
    calls = Calls(clock)
    started = asyncio.Event()

    async def work(ctx: RunContext) -> None:
        if ctx.attempt == 1:
            started.set()
            await ctx.stop.wait()
            raise RunInterrupted("stopping")
        await clock.sleep(500)

    holder = Scheduler(make_backend(), instance_id="holder", clock=clock)
    store = FaultyStore(make_backend())
    listener = Recorder()
    backup = Scheduler(store, instance_id="backup", clock=clock, listener=listener)
    for sched in (holder, backup):
        sched.every(job_name, "1h", calls.handler(work), jitter=0, heartbeat="1s", lease="6s")
        await sched.start()
    try:
        await holder.trigger(job_name, SLOT)
        await asyncio.wait_for(started.wait(), 20)
        store.fail("expired_runs", times=2)
        lost = store.fail("expired_runs", times=1, reply_lost=True)
        await holder.stop()  # hands the run over
        await until_async("attempt 2's end", lambda: bool(listener.of("finished")))
        assert lost.fired == 1, "every fault must have hit a sweep"
        run = await store.inner.get_run(job_name, SLOT)
        assert run is not None and run.state is RunState.SUCCEEDED and run.attempt == 2, run
        assert [c.attempt for c in calls.calls] == [1, 2]
    finally:
        await backup.stop(handover=False)
        await holder.stop(handover=False)
        await store.close()


@pytest.mark.parametrize("reply_lost", [False, True], ids=["failed", "reply-lost"])
async def test_a_batch_of_claims_that_failed_runs_each_job_once(
    make_backend: Callable[[], LeaseBackend], job_name: str, reply_lost: bool
) -> None:
    """Jobs due together are claimed in one batch (the store's own claim_many); that batch fails,
    before it reached the store or with its reply lost: every job still runs its slot once, in
    attempt 1 (each retry recognises its own token), and no slot is lost or recorded twice."""
    clock = fast_clock(20.0)
    store = FaultyStore(make_backend())
    rule = store.fail("claim_many", reply_lost=reply_lost)
    calls = Calls(clock)
    sched = Scheduler(store, instance_id="solo", clock=clock)
    jobs = [f"{job_name}-{i}" for i in range(8)]
    for name in jobs:
        sched.every(name, "10s", calls.handler(), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await until_async("one run of every job", lambda: len(calls.calls) >= len(jobs))
        slot = min(c.slot for c in calls.calls)
        assert rule.fired == 1, "the fault must have hit the first batch"
        assert sorted((c.slot, c.attempt) for c in calls.calls if c.slot == slot) == [(slot, 1)] * len(jobs)
        for name in jobs:
            run = await store.inner.get_run(name, slot)
            assert run is not None and run.attempt == 1 and run.instance == "solo", run
    finally:
        await sched.stop(handover=False)
        await store.close()


class Beats(FaultyStore):
    """The fault layer, with the clock time of every heartbeat and of every one that failed."""

    def __init__(self, inner: LeaseBackend, clock: ScaledClock) -> None:
        super().__init__(inner)
        self.clock = clock
        self.sent: list[int] = []
        self.stalled: list[int] = []  # indexes in ``sent``

    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        if any(r.stall and r.fired < r.times for r in self.rules):
            self.stalled.append(len(self.sent))
        self.sent.append(self.clock.now_ms())
        return await super().heartbeat(job, slot, token, now_ms, lease_ms)


class BeatErrors(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.heartbeat_errors: list[str] = []

    def heartbeat_failed(self, job: str, slot: int, error: str) -> None:
        self.heartbeat_errors.append(error)


async def test_a_heartbeat_that_never_answers_holds_the_next_back_no_longer_than_a_heartbeat(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """One heartbeat stalls (no answer, ever: a frozen connection): the next goes a heartbeat
    after it, the lease (four heartbeats) is never lost, the run ends Succeeded in its first
    attempt. Before: the attempt waited for the stalled call (a store client's own timeout:
    Redis's socket timeout, PostgreSQL's command timeout; here for ever) and lost its lease."""
    clock = fast_clock(4.0)
    store = Beats(make_backend(), clock)
    listener = BeatErrors()
    calls = Calls(clock)
    stalled = store.stall("heartbeat", times=0)  # armed by the handler after the first beats

    async def work(ctx: RunContext) -> None:
        await until_async("two heartbeats", lambda: len(store.sent) >= 2)
        stalled.times = 1
        await until_async("three heartbeats more", lambda: len(store.sent) >= 5, timeout=20)

    sched = Scheduler(store, instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(work), jitter=0, heartbeat="1s", lease="4s")
    try:
        await one_attempt(sched, job_name, listener)
        assert stalled.fired == 1
        assert not listener.of("fenced"), listener.events
        assert [(c.attempt, c.stop_reason) for c in calls.calls] == [(1, None)]
        assert listener.heartbeat_errors == ["no answer within a heartbeat (1s)"], listener.heartbeat_errors
        (at,) = store.stalled
        # The next a heartbeat later (and a loaded machine's slack), not a lease later, or never.
        assert store.sent[at + 1] - store.sent[at] < 2_000, store.sent
        run = await store.inner.get_run(job_name, SLOT)
        assert run is not None and (run.state, run.attempt) == (RunState.SUCCEEDED, 1)
    finally:
        await sched.stop(handover=False)
        await store.close()
