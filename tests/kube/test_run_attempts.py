"""How an AnarchonRun's status records attempts: pure functions over the status, no cluster."""

from __future__ import annotations

import copy

from anarchon.kube import runs


def test_an_attempt_that_found_its_pod_ended_records_itself_and_closes_the_dead_one() -> None:
    """The runner died after the launch and the short Pod ended before its lease ran out.

    The backup's attempt 2 adopts the ended Pod and writes only the run's end; before, the
    run ended Succeeded with attempt 1 still Running in its history and attempt 2 nowhere
    (and the soak's referee could never see a takeover after SIGKILL).
    """
    status = runs.start_attempt({}, attempt=1, instance="dead", pod="job-1")
    ended = runs.end_attempt(
        copy.deepcopy(status), attempt=2, outcome="Succeeded", message="the Pod succeeded", final=True, instance="b"
    )
    assert (ended["phase"], ended["attempt"], ended["instance"]) == ("Succeeded", 2, "b")
    assert [(a["attempt"], a["instance"], a["outcome"]) for a in ended["attempts"]] == [
        (1, "dead", "Interrupted"),
        (2, "b", "Succeeded"),
    ]
    assert ended["attempts"][1]["podName"] == "job-1" and ended["attempts"][1]["message"] == "the Pod succeeded"
    again = runs.end_attempt(
        copy.deepcopy(ended), attempt=2, outcome="Succeeded", message="the Pod succeeded", final=True, instance="b"
    )
    assert [(a["attempt"], a["outcome"]) for a in again["attempts"]] == [(1, "Interrupted"), (2, "Succeeded")]


def test_an_attempt_that_recorded_its_start_is_ended_in_place() -> None:
    status = runs.start_attempt({}, attempt=1, instance="a", pod="job-1")
    ended = runs.end_attempt(status, attempt=1, outcome="Failed", message="exit 3", final=True, instance="a")
    assert [(a["attempt"], a["outcome"], a["message"]) for a in ended["attempts"]] == [(1, "Failed", "exit 3")]
