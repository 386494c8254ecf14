"""Scheduler behaviour on every real lease store, with time running fast (ScaledClock).

Several Scheduler objects with their own store connections stand in for instances; the
multi-process tests (test_multiprocess.py) do the same with real OS processes and signals.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from anarchon.engine import (
    ClaimRequest,
    ClaimResult,
    ConfigError,
    Job,
    LeaseBackend,
    Run,
    RunCancelled,
    RunContext,
    RunFailed,
    RunGivenUp,
    RunInterrupted,
    RunState,
    ScaledClock,
    Scheduler,
    every,
)
from anarchon.engine.lag import LoopLag
from anarchon.engine.observed import observed
from anarchon.engine.scheduler import job_options
from tests.harness.engine import Calls, Recorder, fast_clock, ran_once_then_down
from tests.harness.until import until_async

FACTOR = 20.0  # one fake second is 50 ms of real time


@pytest.fixture
def factor() -> float:
    """The clock's speed; a test whose bounds are tight at FACTOR on a loaded machine parametrizes it."""
    return FACTOR


@pytest.fixture
def clock(factor: float) -> ScaledClock:
    return fast_clock(factor)


@pytest.fixture
async def cluster(
    make_backend: Callable[[], LeaseBackend], clock: ScaledClock
) -> AsyncIterator[Callable[[int], list[tuple[Scheduler, Recorder]]]]:
    """Make ``n`` instances on one store; all are stopped (no hand-over) at the end."""
    made: list[Scheduler] = []

    def make(n: int) -> list[tuple[Scheduler, Recorder]]:
        out = []
        for i in range(len(made), len(made) + n):
            rec = Recorder()
            sched = Scheduler(make_backend(), instance_id=f"inst-{i}", clock=clock, listener=rec)
            made.append(sched)
            out.append((sched, rec))
        return out

    yield make
    for sched in made:
        stopping = asyncio.create_task(sched.stop(handover=False))
        done, _ = await asyncio.wait({stopping}, timeout=30)
        if not done:  # show where it hangs before anything gets cancelled
            for task in asyncio.all_tasks():
                task.print_stack(limit=12)
            raise AssertionError("stopping a scheduler hung")
        await sched.backend.close()


# 5x: a slot every 200 real ms, not 50: a loaded machine stalled the loop past a slot, which
# (catch-up None, the default) is then missed, not run late.
@pytest.mark.parametrize("factor", [5.0])
async def test_one_winner_per_slot_and_no_slot_lost(cluster, clock: ScaledClock, job_name: str) -> None:
    instances = cluster(3)
    calls = Calls(clock)
    for sched, _ in instances:
        sched.every(job_name, "1s", calls.handler(), jitter="300ms", heartbeat="1s")
    for sched, _ in instances:
        await sched.start()
    start = clock.now_ms()
    await until_async("30 fake seconds", lambda: clock.now_ms() > start + 30_000)
    for sched, _ in instances:
        await sched.stop()
    slots = calls.slots()
    counts = Counter(slots)
    assert max(counts.values()) == 1, [s for s, c in counts.items() if c > 1]
    assert len(slots) >= 20
    assert len({c.instance for c in calls.calls}) >= 2, "jitter should spread wins over instances"
    # Every slot is accounted for in the store: run once, or skipped because the run before
    # it had not finished yet (overlap Skip, the default) - never lost.
    history = await instances[0][0].history(job_name, limit=100)
    by_slot = {r.slot: r for r in history}
    first, last = min(by_slot), max(by_slot)
    assert sorted(by_slot) == list(range(first, last + 1000, 1000)), "a slot was lost"
    ran = {s for s, r in by_slot.items() if r.state is RunState.SUCCEEDED}
    assert ran == set(slots)
    assert all(r.state in (RunState.SUCCEEDED, RunState.SKIPPED) and r.attempt <= 1 for r in history)


async def test_backup_takes_over_when_runner_dies(cluster, clock: ScaledClock, job_name: str) -> None:
    (a, _), (b, rec_b) = cluster(2)
    calls = Calls(clock)

    async def long(ctx: RunContext) -> None:
        await clock.sleep(60_000)

    handler = calls.handler(long)
    a.schedule(job_name, every("1h"), handler, jitter=0, heartbeat="1s", lease="3s")
    b.schedule(job_name, every("1h"), handler, jitter=0, heartbeat="1s", lease="3s")
    await a.start()
    await b.start()
    result = await a.trigger(job_name)
    assert result.won
    await until_async("attempt 1", lambda: len(calls.calls) == 1)
    died_at = clock.now_ms()
    await a.stop(handover=False)  # dies: no release, no more heartbeats
    await until_async("attempt 2 by the backup", lambda: len(calls.calls) == 2)
    second = calls.calls[1]
    assert (second.attempt, second.instance, second.previous_instance) == (2, "inst-1", "inst-0")
    # lease (3 s) + 2 heartbeats (2 s) + scheduling slack, in fake time
    assert second.started_ms - died_at <= 3_000 + 2_000 + 1_500
    assert rec_b.of("took_over")


async def test_handover_on_stop_is_immediate(cluster, clock: ScaledClock, job_name: str) -> None:
    (a, _), (b, _) = cluster(2)
    calls = Calls(clock)

    async def long(ctx: RunContext) -> None:
        await ctx.stop.wait()
        raise RunInterrupted("instance stopping")

    for s in (a, b):
        s.schedule(job_name, every("1h"), calls.handler(long), jitter=0, heartbeat="2s", lease="30s")
        await s.start()
    await a.trigger(job_name)
    await until_async("attempt 1", lambda: len(calls.calls) == 1)
    stopped_at = clock.now_ms()
    await a.stop()
    await until_async("attempt 2 after hand-over", lambda: len(calls.calls) == 2)
    assert calls.calls[0].stop_reason == "shutdown"
    # far sooner than the 30 s lease: within 2 heartbeats plus slack
    assert calls.calls[1].started_ms - stopped_at < 6_000


async def test_handover_is_taken_within_a_heartbeat(
    cluster, clock: ScaledClock, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's bound: a lease released on shutdown is taken over within one heartbeat.

    One run is handed over five times in a row, each time to an instance that already knows
    the run and has just looked at the store: its next look is a whole interval away. Backups
    that looked every 1 to 2 heartbeats took 4 to 8 s here, for a 4 s heartbeat.
    """
    calls = Calls(clock)
    looks: Counter[str] = Counter()

    async def long(ctx: RunContext) -> None:
        await ctx.stop.wait()
        raise RunInterrupted("instance stopping")

    def start(sched: Scheduler) -> Awaitable[None]:
        real = sched.backend.expired_runs

        async def counted(now_ms: int, limit: int) -> list[Run]:
            looks[sched.instance_id] += 1
            return await real(now_ms, limit)

        monkeypatch.setattr(sched.backend, "expired_runs", counted)
        sched.schedule(job_name, every("1h"), calls.handler(long), jitter=0, heartbeat="4s", lease="60s")
        return sched.start()

    (holder, _), (backup, _) = cluster(2)
    await start(holder)
    await start(backup)
    await holder.trigger(job_name)
    delays = []
    for n in range(1, 6):
        await until_async(f"attempt {n}", lambda n=n: len(calls.calls) == n)
        await clock.sleep(10_000)  # the backup has looked at least once: it knows the run
        watcher, seen = backup.instance_id, looks[backup.instance_id]
        await until_async("the backup's next look", lambda w=watcher, seen=seen: looks[w] > seen)
        stopped_at = clock.now_ms()
        await holder.stop()
        await until_async(f"attempt {n + 1} after hand-over", lambda n=n: len(calls.calls) == n + 1)
        delays.append(calls.calls[-1].started_ms - stopped_at)
        holder, ((backup, _),) = backup, cluster(1)
        await start(backup)
    assert [c.attempt for c in calls.calls] == [1, 2, 3, 4, 5, 6]
    # one heartbeat (4 s) plus the takeover itself (0.75 s of fake time is 38 ms of real time)
    assert max(delays) <= 4_000 + 750, delays


async def test_overlap_skip(cluster, clock: ScaledClock, job_name: str) -> None:
    (a, rec_a), (b, rec_b) = cluster(2)
    calls = Calls(clock)

    async def three_seconds(ctx: RunContext) -> None:
        await clock.sleep(3_500)

    for s in (a, b):
        s.every(job_name, "1s", calls.handler(three_seconds), jitter="100ms", heartbeat="1s")
        await s.start()
    start = clock.now_ms()
    await until_async("12 fake seconds", lambda: clock.now_ms() > start + 12_000)
    history = await a.history(job_name, limit=100)
    ran = sorted(r.slot for r in history if r.state is not RunState.SKIPPED)
    skipped = [r for r in history if r.state is RunState.SKIPPED]
    assert len(skipped) >= 4
    # runs never overlap: each starts at least 3.5 s after the previous one started
    assert all(b_ - a_ >= 3_000 for a_, b_ in itertools.pairwise(ran)), ran
    # each Skipped run is heard once, from the instance that recorded it, with the active run as reason
    skipped_slots = {r.slot for r in skipped}

    def heard() -> list[tuple[str, ...]]:
        return [e for e in rec_a.of("skipped") + rec_b.of("skipped") if int(e[2]) in skipped_slots]

    await until_async("a skipped event per Skipped run", lambda: {int(e[2]) for e in heard()} == skipped_slots)
    assert len(heard()) == len(skipped_slots), heard()
    assert all("still active" in e[3] for e in heard()), heard()


async def test_overlap_allow_runs_concurrently(cluster, clock: ScaledClock, job_name: str) -> None:
    ((a, _),) = cluster(1)
    calls = Calls(clock)
    active = 0
    peak = 0

    async def slow(ctx: RunContext) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await clock.sleep(2_500)
        active -= 1

    a.every(job_name, "1s", calls.handler(slow), jitter=0, heartbeat="1s", overlap="Allow")
    await a.start()
    await until_async("6 runs", lambda: len(calls.calls) >= 6)
    assert peak >= 2


# 5x: a heartbeat of 100 real ms, not 25: at 20x a loaded machine's stall skipped a slot.
@pytest.mark.parametrize("factor", [5.0])
async def test_overlap_replace_fences_older(cluster, clock: ScaledClock, job_name: str) -> None:
    ((a, rec),) = cluster(1)
    calls = Calls(clock)

    async def forever(ctx: RunContext) -> None:
        await asyncio.Event().wait()

    a.every(job_name, "2s", calls.handler(forever), jitter=0, heartbeat="500ms", overlap="Replace")
    await a.start()
    await until_async("3 runs", lambda: len(calls.calls) >= 3)
    await until_async("older runs fenced", lambda: len(rec.of("fenced")) >= 2)
    history = await a.history(job_name)
    interrupted = [r for r in history if r.state is RunState.INTERRUPTED]
    assert interrupted and all("replaced" in (r.error or "") for r in interrupted)
    assert len([r for r in history if r.state.active]) == 1
    assert calls.calls[0].stop_reason == "replaced"  # fenced, and told why: its run was replaced
    # The listener hears of each replaced run once, from the claim that replaced it (metrics
    # count it as Replaced): the first run by the second, and so on.
    replaced = [(int(slot), int(by)) for _, _, slot, by in rec.of("replaced")]
    assert {r.slot for r in interrupted} <= {slot for slot, _ in replaced}, (interrupted, replaced)
    assert all(by - slot == 2_000 for slot, by in replaced), replaced


async def test_timeout_fails_the_run(cluster, clock: ScaledClock, job_name: str) -> None:
    ((a, rec),) = cluster(1)
    calls = Calls(clock)

    async def hang(ctx: RunContext) -> None:
        await asyncio.Event().wait()

    a.schedule(job_name, every("1h"), calls.handler(hang), jitter=0, heartbeat="1s", timeout="3s")
    await a.start()
    result = await a.trigger(job_name)
    assert result.run is not None
    await until_async("the run to end", lambda: bool(rec.of("finished")))
    run = (await a.history(job_name))[0]
    assert run.state is RunState.FAILED and "timed out" in (run.error or "")
    assert calls.calls[0].stop_reason == "timeout"


async def test_handler_errors(cluster, clock: ScaledClock, job_name: str) -> None:
    ((a, rec),) = cluster(1)

    async def fail(ctx: RunContext) -> None:
        raise RunFailed("exit code 3")

    async def crash(ctx: RunContext) -> None:
        raise KeyError("oops")

    async def cancelled(ctx: RunContext) -> None:
        raise RunCancelled("cancelled by alice: wrong input")

    a.schedule(job_name, every("1h"), Calls(clock).handler(fail), jitter=0)
    a.schedule(job_name + "-b", every("1h"), Calls(clock).handler(crash), jitter=0)
    a.schedule(job_name + "-c", every("1h"), Calls(clock).handler(cancelled), jitter=0)
    await a.start()
    for job in (job_name, job_name + "-b", job_name + "-c"):
        await a.trigger(job)
    await until_async("the three runs to end", lambda: len(rec.of("finished")) == 3)
    failed = (await a.history(job_name))[0]
    crashed = (await a.history(job_name + "-b"))[0]
    stopped = (await a.history(job_name + "-c"))[0]
    assert (failed.state, failed.error) == (RunState.FAILED, "exit code 3")
    assert crashed.state is RunState.FAILED and "KeyError" in (crashed.error or "")
    assert (stopped.state, stopped.error) == (RunState.CANCELLED, "cancelled by alice: wrong input")
    assert ("Cancelled", "cancelled by alice: wrong input") in [e[4:] for e in rec.of("finished")]


async def test_interrupted_attempt_is_retried_up_to_max_attempts(cluster, clock: ScaledClock, job_name: str) -> None:
    (a, _), (b, _) = cluster(2)
    calls = Calls(clock)

    async def lose(ctx: RunContext) -> None:
        raise RunInterrupted("pod vanished")

    for s in (a, b):
        s.schedule(job_name, every("1h"), calls.handler(lose), jitter=0, heartbeat="500ms", max_attempts=3)
        await s.start()
    await a.trigger(job_name, slot=1_000)
    await until_async("3 attempts", lambda: len(calls.calls) == 3)

    # after the third interruption nobody may start a fourth attempt; the run ends Interrupted
    async def final() -> bool:
        r = await a.backend.get_run(job_name, 1_000)  # type: ignore[attr-defined]
        return r is not None and r.state is RunState.INTERRUPTED

    await until_async("the run to end Interrupted", final)
    await clock.sleep(3_000)  # two more leases (1.5 s each): time enough for a backup to try a fourth
    run = await a.backend.get_run(job_name, 1_000)  # type: ignore[attr-defined]
    assert run is not None and run.state is RunState.INTERRUPTED and run.attempt == 3
    assert [c.attempt for c in calls.calls] == [1, 2, 3]
    assert [a_.outcome for a_ in run.attempts] == [RunState.INTERRUPTED] * 3


async def test_a_resumable_jobs_takeovers_go_past_max_attempts_until_its_handler_gives_up(
    cluster, clock: ScaledClock, job_name: str
) -> None:
    """A handler that resumes live work (the operator adopts a Pod) counts its own relaunches:
    the store lets its run be taken over past max_attempts, and RunGivenUp ends it Interrupted."""
    (a, _), (b, _) = cluster(2)
    calls = Calls(clock)

    async def lose_then_give_up(ctx: RunContext) -> None:
        if ctx.attempt < 5:
            raise RunInterrupted("the runner lost its Pod's news")
        raise RunGivenUp("gave up: launched too often")

    for s in (a, b):
        s.schedule(
            job_name,
            every("1h"),
            calls.handler(lose_then_give_up),
            jitter=0,
            heartbeat="500ms",
            max_attempts=1,
            resumable=True,
        )
        await s.start()
    await a.trigger(job_name, slot=1_000)
    await until_async("5 attempts, past max_attempts 1", lambda: len(calls.calls) == 5)

    async def final() -> bool:
        r = await a.backend.get_run(job_name, 1_000)  # type: ignore[attr-defined]
        return r is not None and not r.state.active

    await until_async("the run to end", final)
    await clock.sleep(3_000)  # two more leases: a sixth attempt would have started
    run = await a.backend.get_run(job_name, 1_000)  # type: ignore[attr-defined]
    assert run is not None and run.state is RunState.INTERRUPTED and run.attempt == 5
    assert run.error == "gave up: launched too often"
    assert [c.attempt for c in calls.calls] == [1, 2, 3, 4, 5]


async def test_resume_claims_a_forgotten_open_run_only_once_it_was_missing_for_a_lease(
    cluster, clock: ScaledClock, job_name: str
) -> None:
    """JobLoop.resume: the caller's record says the run is open, the store has none of it."""
    ((a, _),) = cluster(1)
    calls = Calls(clock)
    loop = a.schedule(job_name, every("1h"), calls.handler(), jitter=0, heartbeat="500ms")
    await a.start()
    assert not await loop.resume(7_000), "the first look only notes the run as missing"
    assert not await loop.resume(7_000), "a live runner may still claim it back within a lease"
    await clock.sleep(loop.options.lease_ms)
    assert await loop.resume(7_000)
    await until_async("the resumed run's attempt", lambda: len(calls.calls) == 1)
    assert calls.calls[0].attempt == 1 and calls.calls[0].slot == 7_000


async def test_suspend(cluster, clock: ScaledClock, job_name: str) -> None:
    ((a, _),) = cluster(1)
    calls = Calls(clock)
    a.every(job_name, "1s", calls.handler(), jitter=0, suspend=True)
    await a.start()
    start = clock.now_ms()
    await until_async("5 fake seconds", lambda: clock.now_ms() > start + 5_000)
    assert calls.calls == []
    a.every(job_name, "1s", calls.handler(), jitter=0, suspend=False)  # resume in place
    await until_async("runs after resume", lambda: len(calls.calls) >= 2)


async def test_schedule_change_takes_effect_at_next_slot(cluster, clock: ScaledClock, job_name: str) -> None:
    ((a, _),) = cluster(1)
    calls = Calls(clock)
    a.every(job_name, "1h", calls.handler(), jitter=0)
    await a.start()
    await asyncio.sleep(0.05)
    assert calls.calls == []
    changed_at = clock.now_ms()
    a.every(job_name, "1s", calls.handler(), jitter=0)
    await until_async("runs on the new schedule", lambda: len(calls.calls) >= 3)
    assert all(c.slot % 1000 == 0 and c.slot > changed_at for c in calls.calls)


@pytest.mark.parametrize(("policy", "expected"), [("None", 0), ("Latest", 1), ("All", 5)])
async def test_catch_up_after_downtime(
    make_backend: Callable[[], LeaseBackend], job_name: str, policy: str, expected: int
) -> None:
    period = 60_000
    t0 = 1_800_000_000_000
    # Instance 1 ran the job until t0 + 1 period, then every instance was down for 5 periods.
    await ran_once_then_down(make_backend(), job_name, t0, FACTOR, catch_up=policy)

    later = ScaledClock(FACTOR, start_ms=t0 + 6 * period + 500)
    calls_2 = Calls(later)
    heard = Recorder()
    two = Scheduler(make_backend(), instance_id="two", clock=later, listener=heard)
    two.every(job_name, "1m", calls_2.handler(), jitter=0, catch_up=policy, catch_up_window="1h")
    await two.start()
    await asyncio.sleep(0.5)  # 10 fake seconds: catch-up claims happen at once
    await two.stop()
    await two.backend.close()
    missed = [t0 + k * period for k in range(2, 7)]
    assert sorted(calls_2.slots()) == missed[len(missed) - expected :] if expected else calls_2.slots() == []
    # The slots not run are reported missed, whatever the policy (None too: ``why`` reads them).
    reported = [int(e[2]) for e in heard.events if e[0] == "missed" and e[1] == job_name]
    assert sorted(reported) == missed[: len(missed) - expected]
    assert all("while no instance ran" in e[3] for e in heard.events if e[0] == "missed")


async def test_catch_up_starts_from_the_handlers_record_when_the_store_forgot_the_job(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """Every instance down, and the store lost the job's state meanwhile (Redis restarted
    without its data): the handler's durable record (the operator's newest AnarchonRun) is the
    base of catch-up. Before, the store's missing history read as "nothing ran": the missed
    slots were neither run nor reported."""
    period = 60_000
    t0 = 1_800_000_000_000
    await ran_once_then_down(make_backend(), job_name, t0, FACTOR, catch_up="All")
    forgetful = make_backend()
    await forgetful.setup()
    await forgetful.forget_job(job_name)
    await forgetful.close()

    later = ScaledClock(FACTOR, start_ms=t0 + 6 * period + 500)
    calls_2 = Calls(later)
    heard = Recorder()
    two = Scheduler(make_backend(), instance_id="two", clock=later, listener=heard)

    async def newest_run() -> int:
        return t0 + 2 * period  # its record knows one more run than the store ever had

    options = job_options(jitter=0, catch_up="Latest", catch_up_window="1h")
    two.add(Job(job_name, every("1m"), calls_2.handler(), options, recorded=newest_run))
    await two.start()
    await until_async("the catch-up run", lambda: len(calls_2.calls) == 1)
    await asyncio.sleep(0.2)  # 4 fake seconds: nothing else is due
    await two.stop()
    await two.backend.close()
    assert calls_2.slots() == [t0 + 6 * period]
    reported = sorted(int(e[2]) for e in heard.events if e[0] == "missed" and e[1] == job_name)
    assert reported == [t0 + k * period for k in range(3, 6)], "the slots after the record's newest run"


async def test_no_retroactive_runs_when_schedule_is_edited(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    t0 = 1_800_000_000_000
    c1 = ScaledClock(FACTOR, start_ms=t0 - 3_000)
    calls = Calls(c1)
    one = Scheduler(make_backend(), instance_id="one", clock=c1)
    one.every(job_name, "1h", calls.handler(), jitter=0, catch_up="All")
    await one.start()
    await until_async("first run", lambda: len(calls.calls) == 1)
    await one.stop()
    await one.backend.close()
    # Ten minutes later the schedule is edited to every minute: the minutes in between were
    # never due under any schedule in force, so none of them is run.
    c2 = ScaledClock(FACTOR, start_ms=t0 + 10 * 60_000 + 100)
    calls_2 = Calls(c2)
    two = Scheduler(make_backend(), instance_id="two", clock=c2)
    two.every(job_name, "1m", calls_2.handler(), jitter=0, catch_up="All", catch_up_window="1h")
    await two.start()
    await asyncio.sleep(0.3)
    await two.stop()
    await two.backend.close()
    assert calls_2.calls == []


async def test_starting_deadline_misses_late_slots(cluster, clock: ScaledClock, job_name: str) -> None:
    """Slots slept through in a stall are caught up, but only those still within the deadline."""
    ((a, rec),) = cluster(1)
    calls = Calls(clock)
    stalled = False

    async def stall_once(ctx: RunContext) -> None:
        nonlocal stalled
        if not stalled:
            stalled = True
            time.sleep(0.3)  # blocks the event loop: 6 fake seconds at 20x  # noqa: ASYNC251

    a.every(job_name, "1s", calls.handler(stall_once), jitter="0s", starting_deadline="1s", catch_up="All")
    await a.start()
    start = clock.now_ms()
    await until_async("15 fake seconds", lambda: clock.now_ms() > start + 15_000)
    late = [e for e in rec.of("missed") if "past the starting deadline" in e[3]]
    assert late, f"the slots slept through more than 1 s ago are missed: {rec.of('missed')}"
    assert all(c.started_ms - c.slot <= 1_000 + 300 for c in calls.calls)


async def test_a_starting_deadline_within_the_jitter_is_refused(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """With 2 s of jitter and a 100 ms deadline, most slots were missed: a mistake to name, not to run."""
    sched = Scheduler(make_backend(), instance_id="x")
    with pytest.raises(ConfigError, match=r"startingDeadline must be at least the jitter plus 1s \(3s\), got 100ms"):
        sched.every(job_name, "1s", Calls(ScaledClock()).handler(), jitter="2s", starting_deadline="100ms")
    sched.every(job_name, "1s", Calls(ScaledClock()).handler(), jitter="2s", starting_deadline="3s")


async def test_bad_options_are_refused(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    sched = Scheduler(make_backend(), instance_id="x")
    with pytest.raises(ConfigError, match="lease"):
        sched.every(job_name, "1s", Calls(ScaledClock()).handler(), heartbeat="2s", lease="1s")
    with pytest.raises(ConfigError, match="unknown job option"):
        job_options(jiter="1s")
    with pytest.raises(ValueError):
        job_options(overlap="Sometimes")


async def test_idle_store_traffic_does_not_grow_with_the_number_of_jobs(
    make_backend: Callable[[], LeaseBackend], clock: ScaledClock, job_name: str
) -> None:
    """With nothing due, an instance asks the store one question a heartbeat, however many jobs.

    Before, every job had a backup loop asking for its active runs every one or two
    heartbeats: 60 idle jobs cost 60 times what one did (10,000 about 7,000 queries a second).
    """

    async def nothing(ctx: RunContext) -> None:
        raise AssertionError("no slot is due")

    async def idle_calls(n: int) -> Counter[str]:
        calls: Counter[str] = Counter()
        backend = observed(make_backend(), lambda operation, _s, _e: calls.update([operation]))
        sched = Scheduler(backend, instance_id=f"idle-{n}", clock=clock)
        for i in range(n):
            sched.cron(f"{job_name}-{n}-{i}", "0 0 1 1 *", nothing, heartbeat="1s")
        await sched.start()
        try:
            # Starting, each job reads its schedule (and history) once. On a busy machine 60 jobs
            # take a while to get there: wait for all of them, not for a fixed time.
            await until_async(f"{n} jobs started", lambda: calls["schedule_since"] >= n, timeout=60)
            await clock.sleep(3_000)
            calls.clear()
            await clock.sleep(30_000)
            return calls
        finally:
            await sched.stop()
            await backend.close()

    one, many = await idle_calls(1), await idle_calls(60)
    assert set(many) == {"expired_runs"}, many
    # One look every half to whole heartbeat: 30 to 60 in 30 s, for 1 job or 60.
    assert 25 <= many["expired_runs"] <= 70, many
    assert many["expired_runs"] <= 2 * one["expired_runs"], (one, many)


async def test_stop_ends_even_when_the_store_client_swallows_the_cancellation(
    cluster, clock: ScaledClock, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py and psycopg have each swallowed the cancellation of a call in flight (the call
    returns, or raises something else). The backup sweep cancelled in such a call must still
    end, and stop() with it; before, it went on looking and stop() waited for ever."""
    ((sched, _),) = cluster(1)
    looking = asyncio.Event()

    async def swallowing(now_ms: int, limit: int) -> list[Run]:  # stands in for the store's client
        looking.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        return []

    monkeypatch.setattr(sched.backend, "expired_runs", swallowing)
    sched.schedule(job_name, every("1h"), Calls(clock).handler(), heartbeat="1s")
    await sched.start()
    await asyncio.wait_for(looking.wait(), 10)
    await asyncio.wait_for(sched.stop(), 5)


async def test_claims_of_jobs_due_together_go_to_the_store_together(
    make_backend: Callable[[], LeaseBackend], clock: ScaledClock, job_name: str
) -> None:
    """Thirty jobs due at the same moment: a handful of batches (claim_many), not thirty claims."""
    backend = make_backend()
    batches: list[int] = []
    real = backend.claim_many

    async def counted(requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        batches.append(len(requests))
        return await real(requests)

    backend.claim_many = counted  # type: ignore[method-assign]
    sched = Scheduler(backend, instance_id="batching", clock=clock)
    calls = Calls(clock)
    jobs = [f"{job_name}-{i}" for i in range(30)]
    for name in jobs:
        sched.every(name, "10s", calls.handler(), jitter=0, heartbeat="1s")
    await sched.start()
    try:
        await until_async("one run of every job", lambda: len(calls.calls) >= 30)
        first_slot = min(c.slot for c in calls.calls)
        assert sum(1 for c in calls.calls if c.slot == first_slot) == len(jobs)  # one run of each job
        assert sum(batches) >= len(jobs) and len(batches) <= 5, batches
    finally:
        await sched.stop()
        await backend.close()


async def test_an_instance_whose_loop_runs_late_leaves_new_slots_to_the_others(
    cluster, clock: ScaledClock, job_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overload makes runs late, never lost: a late instance claims new slots after the instances on time.

    Instance ``late`` says its event loop runs 4 s late; ``on_time`` does not. Every slot goes
    to ``on_time``, and ``late`` still claims each (and finds it taken). Before, each won
    about half, and a late instance kept piling new runs onto its own backlog.
    """
    (late, late_rec), (on_time, _) = cluster(2)
    monkeypatch.setattr(late.lag, "penalty_ms", lambda: 4_000)
    calls = Calls(clock)
    for s in (late, on_time):
        s.every(job_name, "10s", calls.handler(), jitter=0, heartbeat="1s", overlap="Allow")
        await s.start()
    await until_async("12 runs", lambda: len(calls.calls) >= 12, timeout=60)
    await until_async("the late instance's own claims", lambda: len(late_rec.of("claimed")) >= 12)
    winners = Counter(c.instance for c in calls.calls[:12])
    assert winners[late.instance_id] <= 1, winners
    assert len({c.slot for c in calls.calls[:12]}) == 12  # one run per slot, none lost


async def test_the_loop_lag_is_seen_and_then_forgotten() -> None:
    """The real thing: a loop blocked for 0.8 s is late beyond the threshold; idle again, it is not."""
    lag = LoopLag()
    lag.start()
    try:
        await asyncio.sleep(0.3)
        time.sleep(0.8)  # noqa: ASYNC251 - the point: block the event loop
        await asyncio.sleep(0.01)  # the sampler, due during the block, runs now
        assert lag.penalty_ms() >= 500, lag.lag_ms
        await asyncio.sleep(2.5)
        assert lag.penalty_ms() == 0, lag.lag_ms
    finally:
        lag.stop()


def test_a_backlog_of_the_engines_user_counts_as_lag() -> None:
    """The operator's API requests waiting for a turn make it late as surely as its loop does."""
    lag = LoopLag()
    backlog = [100.0]
    lag.add_backlog(lambda: backlog[0])
    assert lag.penalty_ms() == 0  # below the threshold
    backlog[0] = 1_200.0
    assert lag.penalty_ms() == 1_200
    backlog[0] = 16_000.0
    assert lag.penalty_ms() == 2_000  # at most MAX_PENALTY_MS


# 5x: the run ends a fake second (200 real ms, not 50) before the next beat would be due; at 20x
# a loaded machine woke it late enough for one more beat.
@pytest.mark.parametrize("factor", [5.0])
@pytest.mark.parametrize("beats", [0, 3])
async def test_a_run_heartbeats_from_a_heartbeat_after_its_claim(
    make_backend: Callable[[], LeaseBackend], clock: ScaledClock, job_name: str, beats: int
) -> None:
    """The claim sets the lease: the first heartbeat is due a heartbeat later. A beat at once
    (as before) cost every run one more store call, and a run shorter than a heartbeat needs none."""
    calls: Counter[str] = Counter()
    backend = observed(make_backend(), lambda operation, _s, _e: calls.update([operation]))
    sched = Scheduler(backend, instance_id="beating", clock=clock)
    runs = Calls(clock)

    async def work(ctx: RunContext) -> None:
        await clock.sleep(2_000 * beats + 1_000)  # half a heartbeat past ``beats`` of them

    sched.schedule(job_name, every("1h"), runs.handler(work), jitter=0, heartbeat="2s", lease="10s")
    await sched.start()
    try:
        await sched.trigger(job_name)
        await until_async("the run's end", lambda: calls["finish"] >= 1, timeout=60)
    finally:
        await sched.stop()
        await backend.close()
    # Each beat comes a store call's time after the one before: the last may fall after the end.
    assert max(0, beats - 1) <= calls["heartbeat"] + calls["get_run"] <= beats, calls
