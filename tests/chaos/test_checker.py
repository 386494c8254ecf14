"""The soak's referee on made-up watch events: each rule fires on what it must, and not on what it must not."""

from __future__ import annotations

from typing import Any

from .checker import Checker


def _pod(name: str, run: str, job: str, phase: str, *, deleting: bool = False, uid: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": uid or name,
        "labels": {"anarchon.io/run": run, "anarchon.io/job": job, "anarchon.io/slot": run.rsplit("-", 1)[-1]},
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def _run(name: str, job: str, slot: int, phase: str, **status: Any) -> dict[str, Any]:
    final = phase in ("Succeeded", "Failed", "Skipped", "Interrupted")
    body = {"phase": phase, **({"finishTime": "t"} if final else {}), **status}
    return {"metadata": {"name": name}, "spec": {"job": job, "slot": slot}, "status": body}


def test_a_run_ended_while_its_pod_lives_on() -> None:
    c = Checker()
    c.pod("ADDED", _pod("j-1", "j-1", "j", "Running"), at=0)
    c.run("MODIFIED", _run("j-1", "j", 1, "Interrupted", message="gave up after attempt 3 of 3"), at=10)
    c.pod("MODIFIED", _pod("j-1", "j-1", "j", "Succeeded"), at=30)
    c.settled([])
    assert c.violations["ended_while_live"] == 1
    assert c.violations["phase_mismatch"] == 1  # a Pod succeeded, the run says Interrupted


def test_a_replaced_run_whose_pod_was_deleted_first_passes() -> None:
    c = Checker(replace_jobs=frozenset({"r"}))
    c.pod("ADDED", _pod("r-1", "r-1", "r", "Running"), at=0)
    c.pod("MODIFIED", _pod("r-1", "r-1", "r", "Running", deleting=True), at=5.0)
    c.run("MODIFIED", _run("r-1", "r", 1, "Interrupted", message="replaced"), at=5.1)
    c.pod("ADDED", _pod("r-2", "r-2", "r", "Pending"), at=5.2)
    c.run("ADDED", _run("r-2", "r", 2, "Running"), at=5.2)
    c.pod("MODIFIED", _pod("r-2", "r-2", "r", "Succeeded"), at=9)
    c.run("MODIFIED", _run("r-2", "r", 2, "Succeeded"), at=9.1)
    c.settled([("r", 1), ("r", 2)])
    assert not +c.violations, dict(c.examples)


def test_skip_beside_a_live_pod_and_a_timeout_beside_a_running_pod() -> None:
    c = Checker(skip_jobs=frozenset({"s"}))
    c.pod("ADDED", _pod("s-1", "s-1", "s", "Running"), at=0)
    c.run("MODIFIED", _run("s-1", "s", 1, "Failed", message="timed out after 6000 ms"), at=6)
    c.pod("ADDED", _pod("s-2", "s-2", "s", "Running"), at=10)
    c.pod("MODIFIED", _pod("s-1", "s-1", "s", "Succeeded"), at=20)
    c.pod("MODIFIED", _pod("s-2", "s-2", "s", "Succeeded"), at=21)
    c.run("MODIFIED", _run("s-2", "s", 2, "Succeeded"), at=21)
    c.settled([("s", 1), ("s", 2), ("s", 3)])
    assert c.violations == {"ended_while_live": 1, "phase_mismatch": 1, "skip_overlap": 1, "lost_slots": 1}


def test_a_timeout_whose_pod_was_stopped_is_failed_rightly() -> None:
    c = Checker()
    c.pod("ADDED", _pod("t-1", "t-1", "t", "Running"), at=0)
    c.pod("MODIFIED", _pod("t-1", "t-1", "t", "Running", deleting=True), at=6)
    c.run("MODIFIED", _run("t-1", "t", 1, "Failed", reason="DeadlineExceeded"), at=6.5)
    c.settled([("t", 1)])
    assert not +c.violations, dict(c.examples)


def test_a_missed_event_excuses_its_slots() -> None:
    c = Checker()
    one = "slot 1970-01-01T00:00:05Z: late"
    c.event("ADDED", {"reason": "Missed", "involvedObject": {"name": "j"}, "message": one})
    c.event(
        "ADDED",
        {
            "reason": "Missed",
            "involvedObject": {"name": "j"},
            "message": "3 slots, 1970-01-01T00:00:10Z to 1970-01-01T00:00:20Z: stalled",
        },
    )
    c.settled([("j", 5000), ("j", 10000), ("j", 15000), ("j", 20000), ("j", 25000)])
    assert c.missed_recorded == 4
    assert c.violations == {"lost_slots": 1}


def test_a_takeover_under_the_same_attempt_is_a_rewind_but_still_a_takeover() -> None:
    c = Checker()
    c.run("ADDED", _run("j-1", "j", 1, "Running", attempt=2, instance="replica-1"), at=0)
    c.run("MODIFIED", _run("j-1", "j", 1, "Running", attempt=2, instance="replica-0"), at=1)
    assert c.next_attempt_at("j-1", 2, "replica-1") == 1
    assert c.violations == {"attempt_rewound": 1}


def test_a_signal_is_judged_only_on_the_runs_its_own_process_ran() -> None:
    """replica-0 runs j-1 and dies; a new replica-0 (started at 20) starts j-2. A SIGTERM to the
    new one hands over j-2 only: j-1 still names replica-0, but its runner was the dead one."""
    c = Checker()
    c.run("ADDED", _run("j-1", "j", 1, "Running", attempt=1, instance="replica-0"), at=10)
    c.run("ADDED", _run("j-2", "j", 2, "Running", attempt=1, instance="replica-0"), at=25)
    assert c.running_on("replica-0", since=20) == {"j-2": 1}
    assert c.running_on("replica-0") == {"j-1": 1, "j-2": 1}


def test_a_store_not_shared_event_is_a_false_alarm_in_the_soak() -> None:
    c = Checker()
    event = {"reason": "StoreNotShared", "involvedObject": {"name": "short"}, "message": "the replicas do not share"}
    c.event("ADDED", event)
    c.event("MODIFIED", {**event, "reason": "Missed", "message": "slot 2026-12-07T05:00:00Z: missed"})
    assert c.violations == {"store_not_shared": 1}
    assert c.by_job["store_not_shared"] == {"short": 1}
