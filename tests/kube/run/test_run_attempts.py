"""How an AnarchonRun's status records attempts: pure functions over the status, no cluster."""

from __future__ import annotations

import copy

import pytest

from anarchon.kube.run import runstatus


def test_an_attempt_that_found_its_pod_ended_records_itself_and_closes_the_dead_one() -> None:
    """The runner died after the launch and the short Pod ended before its lease ran out.

    The backup's attempt 2 adopts the ended Pod and writes only the run's end; before, the
    run ended Succeeded with attempt 1 still Running in its history and attempt 2 nowhere
    (and the soak's referee could never see a takeover after SIGKILL).
    """
    status = runstatus.start_attempt({}, attempt=1, instance="dead", pod="job-1")
    ended = runstatus.end_attempt(
        copy.deepcopy(status), attempt=2, outcome="Succeeded", message="the Pod succeeded", final=True, instance="b"
    )
    assert (ended["phase"], ended["attempt"], ended["instance"]) == ("Succeeded", 2, "b")
    assert [(a["attempt"], a["instance"], a["outcome"]) for a in ended["attempts"]] == [
        (1, "dead", "Interrupted"),
        (2, "b", "Succeeded"),
    ]
    assert ended["attempts"][1]["podName"] == "job-1" and ended["attempts"][1]["message"] == "the Pod succeeded"
    again = runstatus.end_attempt(
        copy.deepcopy(ended), attempt=2, outcome="Succeeded", message="the Pod succeeded", final=True, instance="b"
    )
    assert [(a["attempt"], a["outcome"]) for a in again["attempts"]] == [(1, "Interrupted"), (2, "Succeeded")]


def test_an_attempt_that_recorded_its_start_is_ended_in_place() -> None:
    status = runstatus.start_attempt({}, attempt=1, instance="a", pod="job-1")
    ended = runstatus.end_attempt(status, attempt=1, outcome="Failed", message="exit 3", final=True, instance="a")
    assert [(a["attempt"], a["outcome"], a["message"]) for a in ended["attempts"]] == [(1, "Failed", "exit 3")]


def test_a_held_up_start_does_not_reopen_a_run_that_ended() -> None:
    """Seen in the soak: a runner's start, held up by API errors, landed after the run was replaced.

    It turned the ended run back to Running (with its finish time), which mending then never
    closed: every status refresh said "closing it" and wrote nothing.
    """
    status = runstatus.start_attempt({}, attempt=1, instance="a", pod="job-1")
    replaced = runstatus.interrupted(status, message="replaced by the run of slot 2")
    assert replaced is not None and runstatus.ended(replaced)
    with pytest.raises(runstatus.RunEnded, match="ended Interrupted: replaced by the run of slot 2"):
        runstatus.start_attempt(copy.deepcopy(replaced), attempt=1, instance="a", pod="job-1")


def test_a_reopened_run_is_closed_again_by_the_store_verdict() -> None:
    """A status an older operator reopened (Running with a finish time) is open, and mending closes it."""
    reopened = {"phase": "Running", "finishTime": "2026-12-03T18:34:30Z", "attempt": 1}
    assert not runstatus.ended(reopened)
    closed = runstatus.interrupted(copy.deepcopy(reopened), message="replaced by the run of slot 2")
    assert closed is not None and (closed["phase"], closed["message"]) == (
        "Interrupted",
        "replaced by the run of slot 2",
    )
    assert runstatus.interrupted(copy.deepcopy(closed), message="again") is None
