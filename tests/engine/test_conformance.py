"""The lease-backend contract, held against every real lease store (sqlite, redis, postgres).

These are the rules of ``anarchon.engine.transitions``; a backend that implements them in
SQL or Lua must give exactly the same answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from anarchon.engine import (
    ClaimOutcome,
    ClaimRequest,
    LeaseBackend,
    Overlap,
    RunState,
    TakeoverRequest,
    new_token,
    token_hash,
)

NOW = 1_800_000_000_000
LEASE = 6_000


def req(
    job: str, slot: int, instance: str = "a", token: str | None = None, now: int = NOW, overlap: Overlap = Overlap.ALLOW
) -> ClaimRequest:
    return ClaimRequest(job, slot, instance, token or new_token(), now, LEASE, overlap)


async def test_first_claim_wins_and_second_is_taken(lease_backend: LeaseBackend, job_name: str) -> None:
    first = await lease_backend.claim(req(job_name, 10, "a", "tok-a"))
    second = await lease_backend.claim(req(job_name, 10, "b", "tok-b"))
    assert first.outcome is ClaimOutcome.WON
    assert first.run is not None and first.run.attempt == 1 and first.run.instance == "a"
    assert first.run.lease_until_ms == NOW + LEASE
    assert second.outcome is ClaimOutcome.TAKEN
    stored = await lease_backend.get_run(job_name, 10)
    assert stored is not None
    assert (stored.state, stored.instance, stored.token, stored.attempt) == (RunState.CLAIMED, "a", "tok-a", 1)
    assert [a.token_hash for a in stored.attempts] == [token_hash("tok-a")]


async def test_concurrent_claims_have_exactly_one_winner(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    backends = [make_backend() for _ in range(5)]
    await asyncio.gather(*(b.setup() for b in backends))
    try:
        for slot in range(20):
            results = await asyncio.gather(*(b.claim(req(job_name, slot, f"i{n}")) for n, b in enumerate(backends)))
            assert sum(r.won for r in results) == 1, (slot, results)
    finally:
        await asyncio.gather(*(b.close() for b in backends))


async def test_jobs_do_not_collide(lease_backend: LeaseBackend, job_name: str) -> None:
    assert (await lease_backend.claim(req(job_name, 1))).won
    assert (await lease_backend.claim(req(job_name + "-other", 1))).won


async def test_heartbeat_extends_lease_and_marks_running(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, token="t1"))
    assert await lease_backend.heartbeat(job_name, 1, "t1", NOW + 2_000, LEASE)
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.RUNNING and run.lease_until_ms == NOW + 2_000 + LEASE


async def test_heartbeat_and_finish_with_wrong_token_are_fenced(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, token="t1"))
    assert not await lease_backend.heartbeat(job_name, 1, "stale", NOW + 1, LEASE)
    assert not await lease_backend.finish(job_name, 1, "stale", NOW + 1, RunState.SUCCEEDED)
    assert not await lease_backend.release(job_name, 1, "stale", NOW + 1, "x")
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.CLAIMED and run.lease_until_ms == NOW + LEASE


async def test_heartbeat_on_missing_run_is_rejected(lease_backend: LeaseBackend, job_name: str) -> None:
    assert not await lease_backend.heartbeat(job_name, 99, "t", NOW, LEASE)


async def test_finish_success_and_failure(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, token="t1"))
    await lease_backend.claim(req(job_name, 2, token="t2"))
    assert await lease_backend.finish(job_name, 1, "t1", NOW + 500, RunState.SUCCEEDED)
    assert await lease_backend.finish(job_name, 2, "t2", NOW + 600, RunState.FAILED, "exit code 3")
    one = await lease_backend.get_run(job_name, 1)
    two = await lease_backend.get_run(job_name, 2)
    assert one is not None and one.state is RunState.SUCCEEDED and one.error is None
    assert one.attempts[0].outcome is RunState.SUCCEEDED and one.attempts[0].ended_ms == NOW + 500
    assert two is not None and two.state is RunState.FAILED and two.error == "exit code 3"
    assert two.attempts[0].error == "exit code 3"
    # A final run accepts nothing more, not even from its own token.
    assert not await lease_backend.heartbeat(job_name, 1, "t1", NOW + 700, LEASE)
    assert not await lease_backend.finish(job_name, 1, "t1", NOW + 700, RunState.FAILED)
    assert (await lease_backend.active_runs(job_name)) == []


async def test_takeover_only_after_expiry(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, "a", "t1"))
    early = await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "t2", NOW + LEASE - 1, LEASE, 3))
    assert early.outcome is ClaimOutcome.TAKEN
    late = await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "t2", NOW + LEASE + 1, LEASE, 3))
    assert late.won and late.run is not None
    assert (late.run.attempt, late.run.instance, late.run.token) == (2, "b", "t2")
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.attempt == 2 and run.instance == "b" and run.state is RunState.CLAIMED
    assert [(a.attempt, a.instance, a.outcome) for a in run.attempts] == [
        (1, "a", RunState.INTERRUPTED),
        (2, "b", RunState.RUNNING),
    ]
    # The old runner is fenced off; the new one is not.
    assert not await lease_backend.heartbeat(job_name, 1, "t1", NOW + LEASE + 2, LEASE)
    assert not await lease_backend.finish(job_name, 1, "t1", NOW + LEASE + 2, RunState.SUCCEEDED)
    assert await lease_backend.heartbeat(job_name, 1, "t2", NOW + LEASE + 2, LEASE)
    assert await lease_backend.finish(job_name, 1, "t2", NOW + LEASE + 3, RunState.SUCCEEDED)


async def test_concurrent_takeovers_have_one_winner(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    backends = [make_backend() for _ in range(4)]
    await asyncio.gather(*(b.setup() for b in backends))
    try:
        await backends[0].claim(req(job_name, 1, "a", "t1"))
        results = await asyncio.gather(
            *(
                b.takeover(TakeoverRequest(job_name, 1, f"b{n}", f"t{n}", NOW + LEASE + 5, LEASE, 3))
                for n, b in enumerate(backends)
            )
        )
        assert sum(r.won for r in results) == 1
    finally:
        await asyncio.gather(*(b.close() for b in backends))


async def test_takeover_exhausted_makes_run_interrupted(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, "a", "t1"))
    t = NOW + LEASE + 1
    assert (await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "t2", t, LEASE, 2))).won
    final = await lease_backend.takeover(TakeoverRequest(job_name, 1, "c", "t3", t + LEASE + 1, LEASE, 2))
    assert final.outcome is ClaimOutcome.TAKEN
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.INTERRUPTED and run.attempt == 2
    assert run.attempts[-1].outcome is RunState.INTERRUPTED
    assert run.error == "gave up after attempt 2 of 2: lease expired"
    assert await lease_backend.active_runs(job_name) == []


async def test_giving_up_says_how_many_attempts_were_hand_overs(lease_backend: LeaseBackend, job_name: str) -> None:
    """maxAttempts 1 and a rolling update: attempt 1 handed over, attempt 2 lost. The engine asks
    for 1 + 1 attempts; the message must not read "2 of 2" as if the user had allowed two."""
    await lease_backend.claim(req(job_name, 1, "a", "t1"))
    assert await lease_backend.release(job_name, 1, "t1", NOW + 10, "handed over: shutdown")
    assert (await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "t2", NOW + 11, LEASE, 2))).won
    final = await lease_backend.takeover(TakeoverRequest(job_name, 1, "c", "t3", NOW + 12 + LEASE, LEASE, 2))
    assert final.outcome is ClaimOutcome.TAKEN
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.INTERRUPTED and run.attempt == 2
    assert run.error == "gave up after attempt 2 of 2 (1 handed over, not counted): lease expired"


async def test_giving_up_keeps_the_last_attempts_reason(lease_backend: LeaseBackend, job_name: str) -> None:
    """A released last attempt (its Pod vanished, say) is why the run ended: the error says so."""
    await lease_backend.claim(req(job_name, 1, "a", "t1"))
    assert await lease_backend.release(job_name, 1, "t1", NOW + 10, "Pod p-a1: deleted")
    final = await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "t2", NOW + 11, LEASE, 1))
    assert final.outcome is ClaimOutcome.TAKEN
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.INTERRUPTED and run.attempt == 1
    assert run.error == "gave up after attempt 1 of 1: Pod p-a1: deleted"
    assert [a.error for a in run.attempts] == ["Pod p-a1: deleted"]


async def test_release_lets_a_backup_take_over_at_once(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, "a", "t1"))
    assert await lease_backend.release(job_name, 1, "t1", NOW + 10, "handed over")
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state.active and run.lease_until_ms <= NOW + 10
    assert run.attempts[0].outcome is RunState.INTERRUPTED and run.attempts[0].error == "handed over"
    taken = await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "t2", NOW + 11, LEASE, 3))
    assert taken.won and taken.run is not None and taken.run.attempt == 2


async def test_a_heartbeat_that_arrives_after_the_release_is_refused(
    lease_backend: LeaseBackend, job_name: str
) -> None:
    """A heartbeat sent before the release but applied after it (another connection) must not
    push the released lease forward: the backups would wait a whole lease for the next attempt
    (seen in CI on Redis, whose lease writes have a pool of their own)."""
    await lease_backend.claim(req(job_name, 1, "a", "t1"))
    assert await lease_backend.release(job_name, 1, "t1", NOW + 10, "pod vanished")
    assert not await lease_backend.heartbeat(job_name, 1, "t1", NOW + 9, LEASE)
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.lease_until_ms <= NOW + 10
    assert [r.slot for r in await lease_backend.expired_runs(NOW + 10, 10) if r.job == job_name] == [1]


async def test_overlap_skip_records_skipped(lease_backend: LeaseBackend, job_name: str) -> None:
    assert (await lease_backend.claim(req(job_name, 1, overlap=Overlap.SKIP))).won
    skipped = await lease_backend.claim(req(job_name, 2, "b", overlap=Overlap.SKIP))
    assert skipped.outcome is ClaimOutcome.SKIPPED
    again = await lease_backend.claim(req(job_name, 2, "c", overlap=Overlap.SKIP))
    assert again.outcome is ClaimOutcome.TAKEN  # the skip is recorded once, for everyone
    run = await lease_backend.get_run(job_name, 2)
    assert run is not None and run.state is RunState.SKIPPED and run.error and "1" in run.error


async def test_overlap_skip_after_previous_finished(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, token="t1", overlap=Overlap.SKIP))
    await lease_backend.finish(job_name, 1, "t1", NOW + 1, RunState.SUCCEEDED)
    assert (await lease_backend.claim(req(job_name, 2, overlap=Overlap.SKIP))).won


async def test_concurrent_overlap_skip_claims_of_two_slots(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """Two slots of one job claimed at once under Skip: never both win."""
    backends = [make_backend() for _ in range(4)]
    await asyncio.gather(*(b.setup() for b in backends))
    try:
        for round_ in range(10):
            base = round_ * 10
            results = await asyncio.gather(
                *(b.claim(req(job_name, base + n % 2, f"i{n}", overlap=Overlap.SKIP)) for n, b in enumerate(backends))
            )
            assert sum(r.won for r in results) == 1, results
            for run in await backends[0].active_runs(job_name):
                await backends[0].finish(job_name, run.slot, run.token, NOW, RunState.SUCCEEDED)
    finally:
        await asyncio.gather(*(b.close() for b in backends))


async def test_overlap_allow_runs_both(lease_backend: LeaseBackend, job_name: str) -> None:
    assert (await lease_backend.claim(req(job_name, 1, overlap=Overlap.ALLOW))).won
    assert (await lease_backend.claim(req(job_name, 2, overlap=Overlap.ALLOW))).won
    assert [r.slot for r in await lease_backend.active_runs(job_name)] == [1, 2]


async def test_overlap_replace_interrupts_older(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1, "a", "t1", overlap=Overlap.REPLACE))
    result = await lease_backend.claim(req(job_name, 2, "b", "t2", overlap=Overlap.REPLACE))
    assert result.won
    assert [r.slot for r in result.replaced] == [1]
    old = await lease_backend.get_run(job_name, 1)
    assert old is not None and old.state is RunState.INTERRUPTED and old.error and "2" in old.error
    assert not await lease_backend.heartbeat(job_name, 1, "t1", NOW + 1, LEASE)
    assert [r.slot for r in await lease_backend.active_runs(job_name)] == [2]


async def test_last_slot_history_and_prune(lease_backend: LeaseBackend, job_name: str) -> None:
    assert await lease_backend.last_slot(job_name) is None
    for slot in (10, 30, 20):
        await lease_backend.claim(req(job_name, slot, token=f"t{slot}"))
    await lease_backend.finish(job_name, 10, "t10", NOW, RunState.SUCCEEDED)
    await lease_backend.finish(job_name, 20, "t20", NOW, RunState.FAILED, "boom")
    assert await lease_backend.last_slot(job_name) == 30
    history = await lease_backend.history(job_name, limit=2)
    assert [r.slot for r in history] == [30, 20]
    assert all(r.token == "" for r in history)
    assert history[1].state is RunState.FAILED and history[1].attempts[0].instance == "a"
    pruned = await lease_backend.prune(job_name, before_slot=30)
    assert pruned == 2  # 10 and 20 are final; 30 is active and older-than is exclusive
    assert [r.slot for r in await lease_backend.history(job_name)] == [30]


async def test_prune_keeps_active_runs(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.claim(req(job_name, 1))
    assert await lease_backend.prune(job_name, before_slot=100) == 0
    assert await lease_backend.get_run(job_name, 1) is not None


async def test_prune_past_everything_keeps_active_runs_and_the_newest(
    lease_backend: LeaseBackend, job_name: str
) -> None:
    """The operator prunes by age, past the old Failed run a history limit may keep for ever;
    the newest run must stay whatever the bound: it is last_slot, the base of catch-up."""
    for slot in range(1, 8):
        await lease_backend.claim(req(job_name, slot * 10, token=f"t{slot}"))
        outcome = RunState.FAILED if slot == 1 else RunState.SUCCEEDED
        await lease_backend.finish(job_name, slot * 10, f"t{slot}", NOW, outcome)
    await lease_backend.claim(req(job_name, 35, token="active"))  # an active run in the middle stays
    assert await lease_backend.prune(job_name, before_slot=10**15) == 6
    assert [r.slot for r in await lease_backend.history(job_name)] == [70, 35]
    assert await lease_backend.last_slot(job_name) == 70
    assert await lease_backend.prune(job_name, before_slot=10**15) == 0


async def test_jobs_not_noted_served_for_a_while_are_forgotten_and_the_rest_kept(
    private_lease_backend: LeaseBackend, job_name: str
) -> None:
    """A job deleted while no instance watched is found by its notes of service getting old:
    its runs and fingerprint go; a job noted since, or never noted, stays."""
    lease_backend = private_lease_backend  # forget_unserved looks at the whole store
    old, fresh, never = f"{job_name}-old", f"{job_name}-fresh", f"{job_name}-never"
    for job in (old, fresh, never):
        await lease_backend.claim(req(job, 10, token=f"{job}10"))
        await lease_backend.finish(job, 10, f"{job}10", NOW, RunState.SUCCEEDED)
        await lease_backend.claim(req(job, 20, token=f"{job}20"))  # one still active, lease long gone
        await lease_backend.schedule_since(job, "every:10000", NOW)
    await lease_backend.note_served([old, fresh], NOW)
    await lease_backend.note_served([fresh], NOW + 5_000)
    await lease_backend.note_served([old], NOW - 1)  # a late note never makes a job older
    assert await lease_backend.forget_unserved(NOW + 1_000) == [old]
    assert await lease_backend.history(old) == [] and await lease_backend.active_runs(old) == []
    assert await lease_backend.schedule_since(old, "every:10000", NOW + 99) == NOW + 99, "fingerprint gone"
    for kept in (fresh, never):
        assert [r.slot for r in await lease_backend.history(kept)] == [20, 10]
    assert await lease_backend.forget_unserved(NOW + 1_000) == [], "forgotten once"
    assert await lease_backend.forget_unserved(NOW + 6_000) == [fresh]
    await lease_backend.forget_job(never)


async def test_forget_job_deletes_everything_of_that_job_only(
    make_backend: Callable[[], LeaseBackend], job_name: str
) -> None:
    """A deleted job leaves nothing in the store: runs (final and active) and fingerprint; twice
    and from several instances at once is fine; another job is untouched."""
    backends = [make_backend() for _ in range(3)]
    await asyncio.gather(*(b.setup() for b in backends))
    first, other = backends[0], job_name + "-other"
    try:
        for job in (job_name, other):
            for slot in range(1, 4):
                await first.claim(req(job, slot, token=f"{job}{slot}"))
            await first.finish(job, 1, f"{job}1", NOW, RunState.FAILED, "boom")
            await first.schedule_since(job, "every:10000", NOW)
        await asyncio.gather(*(b.forget_job(job_name) for b in backends))
        await first.forget_job(job_name)
        assert await first.history(job_name) == []
        assert await first.active_runs(job_name) == []
        assert await first.last_slot(job_name) is None
        assert await first.get_run(job_name, 2) is None
        # The fingerprint went too: a job of that name starts afresh.
        assert await first.schedule_since(job_name, "every:10000", NOW + 99) == NOW + 99
        assert (await first.claim(req(job_name, 2))).won
        assert [r.slot for r in await first.history(other)] == [3, 2, 1]
        assert await first.schedule_since(other, "every:10000", NOW + 99) == NOW
    finally:
        await asyncio.gather(*(b.close() for b in backends))


async def test_schedule_since(lease_backend: LeaseBackend, job_name: str) -> None:
    assert await lease_backend.schedule_since(job_name, "every:10000", NOW) == NOW
    assert await lease_backend.schedule_since(job_name, "every:10000", NOW + 50) == NOW
    assert await lease_backend.schedule_since(job_name, "every:5000", NOW + 60) == NOW + 60
    assert await lease_backend.schedule_since(job_name, "every:5000", NOW + 70) == NOW + 60


async def test_setup_is_idempotent(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    backend = make_backend()
    await backend.setup()
    await backend.setup()
    try:
        assert (await backend.claim(req(job_name, 1))).won
    finally:
        await backend.close()


@pytest.mark.parametrize("outcome", [RunState.CLAIMED, RunState.RUNNING])
async def test_finish_refuses_non_outcomes(lease_backend: LeaseBackend, job_name: str, outcome: RunState) -> None:
    await lease_backend.claim(req(job_name, 1, token="t"))
    with pytest.raises(ValueError):
        await lease_backend.finish(job_name, 1, "t", NOW, outcome)


async def test_a_claimed_run_may_end_skipped_and_leaves_the_active_runs(
    lease_backend: LeaseBackend, job_name: str
) -> None:
    """A handler that finds an earlier run's work still alive (RunSkipped) ends its won run Skipped:
    final, out of the active runs, so the next slot is claimed as if it never ran."""
    await lease_backend.claim(req(job_name, 1, token="t"))
    assert await lease_backend.finish(job_name, 1, "t", NOW + 1, RunState.SKIPPED, "skipped: Pod p still live")
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.SKIPPED and run.error == "skipped: Pod p still live"
    assert await lease_backend.active_runs(job_name) == []
    assert (await lease_backend.claim(req(job_name, 2, token="u", overlap=Overlap.SKIP))).won


async def test_a_running_run_may_end_cancelled_for_good(lease_backend: LeaseBackend, job_name: str) -> None:
    """A handler whose run was cancelled (RunCancelled) ends it Cancelled: final, out of the active
    runs and of the backups' sweep, so no later attempt takes it over and launches it again."""
    await lease_backend.claim(req(job_name, 1, token="t"))
    assert await lease_backend.heartbeat(job_name, 1, "t", NOW + 1, LEASE)
    why = "cancelled by alice: wrong input"
    assert await lease_backend.finish(job_name, 1, "t", NOW + 2, RunState.CANCELLED, why)
    run = await lease_backend.get_run(job_name, 1)
    assert run is not None and run.state is RunState.CANCELLED and run.error == why
    assert [(a.outcome, a.error) for a in run.attempts] == [(RunState.CANCELLED, why)]
    assert await lease_backend.active_runs(job_name) == []
    assert job_name not in {r.job for r in await lease_backend.expired_runs(NOW + 10 * LEASE, 1000)}
    taken = await lease_backend.takeover(TakeoverRequest(job_name, 1, "b", "u", NOW + 10 * LEASE, LEASE, 3))
    assert not taken.won
    assert not await lease_backend.heartbeat(job_name, 1, "t", NOW + 3, LEASE), "a cancelled run holds no lease"


async def test_expired_runs_are_the_active_runs_whose_lease_ended_newest_first(
    lease_backend: LeaseBackend, job_name: str
) -> None:
    """The backups' sweep: one question for every job, "whose lease ran out by now?".

    Later than every other test's runs (the store is shared), so that the test's runs come
    first whatever other tests left behind.
    """
    t = NOW + 10**9
    a, b = job_name, job_name + "-b"
    for slot in (1, 2, 3, 4):
        assert (await lease_backend.claim(req(a, slot, token=f"a{slot}", now=t + slot))).won
    assert await lease_backend.heartbeat(a, 2, "a2", t + LEASE, LEASE)  # lease until t + 2 LEASE
    assert await lease_backend.finish(a, 3, "a3", t + 10, RunState.SUCCEEDED)  # final: never expired
    assert await lease_backend.release(a, 4, "a4", t + 20, "handed over")  # expired at t + 20
    assert (await lease_backend.claim(req(b, 1, token="b1", now=t + 30))).won

    async def expired(now: int, limit: int = 100) -> list[tuple[str, int]]:
        runs = await lease_backend.expired_runs(now, limit)
        assert all(r.state.active for r in runs)
        return [(r.job, r.slot) for r in runs if r.job in (a, b)]

    assert await expired(t + 19) == []
    assert await expired(t + 20) == [(a, 4)]
    assert await expired(t + LEASE + 1) == [(a, 1), (a, 4)]
    assert await expired(t + LEASE + 30) == [(b, 1), (a, 1), (a, 4)]
    assert await expired(t + LEASE + 30, limit=1) == [(b, 1)]
    # Taken over: the new attempt's lease counts. Given up: final, gone from the sweep.
    taken = await lease_backend.takeover(TakeoverRequest(b, 1, "c", "b1-2", t + LEASE + 40, LEASE, 3))
    assert taken.won
    gave_up = await lease_backend.takeover(TakeoverRequest(a, 4, "c", "a4-2", t + LEASE + 40, LEASE, 1))
    assert not gave_up.won and gave_up.run is not None and gave_up.run.state is RunState.INTERRUPTED
    assert await expired(t + LEASE + 40) == [(a, 1)]
    assert await expired(t + 2 * LEASE + 40) == [(b, 1), (a, 2), (a, 1)]
    await lease_backend.forget_job(a)
    assert await expired(t + 2 * LEASE + 40) == [(b, 1)]


async def test_claim_many_answers_as_claims_one_after_the_other(lease_backend: LeaseBackend, job_name: str) -> None:
    """A batch of claims (one pipeline, one transaction) decides each claim as if sent alone, in order."""
    other = job_name + "-other"
    assert (await lease_backend.claim(req(job_name, 1, token="held", overlap=Overlap.SKIP))).won
    batch = [
        req(job_name, 1, token="again"),  # the run exists: taken
        req(job_name, 2, token="skip", overlap=Overlap.SKIP),  # slot 1 still active: skipped
        req(other, 5, token="o5"),  # another job: won
        req(other, 5, token="o5-bis"),  # the same run, later in the batch: taken by the one before
        req(other, 6, token="o6", overlap=Overlap.REPLACE),  # replaces slot 5, claimed just before
    ]
    answers = await lease_backend.claim_many(batch)
    assert not [a for a in answers if isinstance(a, BaseException)], answers
    outcomes = [a.outcome for a in answers if not isinstance(a, BaseException)]
    assert outcomes == [
        ClaimOutcome.TAKEN,
        ClaimOutcome.SKIPPED,
        ClaimOutcome.WON,
        ClaimOutcome.TAKEN,
        ClaimOutcome.WON,
    ]
    replacing = answers[4]
    assert not isinstance(replacing, BaseException) and [r.slot for r in replacing.replaced] == [5]
    taken = answers[3]
    assert not isinstance(taken, BaseException) and taken.run is not None and taken.run.token == "o5"
    assert [r.slot for r in await lease_backend.active_runs(other)] == [6]
    assert [(r.slot, r.state) for r in await lease_backend.history(job_name)] == [
        (2, RunState.SKIPPED),
        (1, RunState.CLAIMED),
    ]
    assert await lease_backend.claim_many([]) == []
