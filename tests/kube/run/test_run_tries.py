"""How an AnarchonRun's status counts tries: pure functions over the status, no cluster.

Each is applied by ``runs.update_status``, which re-applies it after a conflict or a lost
reply: applied twice, it must give what it gave once.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from anarchon.kube.run import runstatus

AT = datetime(2026, 12, 3, 17, 0, 30, tzinfo=UTC)


def _first_try_failed() -> runstatus.Status:
    status = runstatus.start_attempt({}, attempt=1, instance="a", pod="job-1")
    new = runstatus.try_failed(
        status, try_number=1, message="container main exited with code 3", next_try_at=AT, next_pod="job-1-r1"
    )
    assert new is not None
    return new


def test_a_failed_try_moves_the_run_to_the_next_try_and_says_when() -> None:
    status = _first_try_failed()
    assert status["phase"] == "Running", "a retried run is not over"
    assert (status["try"], status["nextTryTime"], status["podName"]) == (2, "2026-12-03T17:00:30Z", "")
    assert status["message"] == (
        "try 1 failed: container main exited with code 3; try 2 (Pod job-1-r1) at 2026-12-03T17:00:30Z"
    )
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Failed")]
    assert runstatus.next_try_time(status, 2) == AT
    assert runstatus.next_try_time(status, 1) is None, "the time belongs to the try that waits for it"


def test_a_failed_try_is_counted_once_when_its_write_is_repeated() -> None:
    status = _first_try_failed()
    again = runstatus.try_failed(copy.deepcopy(status), try_number=1, message="x", next_try_at=AT, next_pod="job-1-r1")
    assert again is None, "a repeat (lost reply) must not count try 1 twice, nor move the run to try 3"


def test_starting_the_next_try_clears_the_wait_and_keeps_the_history() -> None:
    status = runstatus.start_attempt(_first_try_failed(), attempt=1, instance="a", pod="job-1-r1", try_number=2)
    assert "nextTryTime" not in status and runstatus.next_try_time(status, 2) is None
    assert (status["try"], status["podName"], status["attempt"]) == (2, "job-1-r1", 1)
    assert [(t["try"], t["podName"], t["outcome"]) for t in status["tries"]] == [
        (1, "job-1", "Failed"),
        (2, "job-1-r1", "Running"),
    ]


def test_a_later_attempt_adopting_the_try_goes_on_with_it() -> None:
    first = runstatus.start_attempt(_first_try_failed(), attempt=1, instance="a", pod="job-1-r1", try_number=2)
    started = first["tries"][1]["startTime"]
    adopted = runstatus.start_attempt(copy.deepcopy(first), attempt=2, instance="b", pod="job-1-r1", try_number=2)
    assert [(t["try"], t["outcome"]) for t in adopted["tries"]] == [(1, "Failed"), (2, "Running")]
    assert adopted["tries"][1]["startTime"] == started, "one try, however many attempts follow its Pod"
    assert [(a["attempt"], a["outcome"]) for a in adopted["attempts"]] == [(1, "Interrupted"), (2, "Running")]


def test_the_final_end_closes_the_current_try() -> None:
    status = runstatus.start_attempt(_first_try_failed(), attempt=1, instance="a", pod="job-1-r1", try_number=2)
    ended = runstatus.end_attempt(
        status, attempt=1, outcome="Failed", message="failed after 2 tries: exit 3", final=True
    )
    assert (ended["phase"], ended["try"]) == ("Failed", 2)
    assert [(t["try"], t["outcome"]) for t in ended["tries"]] == [(1, "Failed"), (2, "Failed")]
    assert ended["tries"][1]["message"] == "failed after 2 tries: exit 3"


def test_an_interrupted_attempt_leaves_its_try_open_for_the_next_attempt() -> None:
    status = runstatus.start_attempt({}, attempt=1, instance="a", pod="job-1")
    lost = runstatus.end_attempt(status, attempt=1, outcome="Interrupted", message="Pod lost", final=False)
    assert [(t["try"], t["outcome"]) for t in lost["tries"]] == [(1, "Running")], "a lost Pod is not a failed try"


def test_a_run_ended_without_its_try_closes_it_interrupted() -> None:
    given_up = runstatus.end_attempt(
        runstatus.start_attempt({}, attempt=3, instance="a", pod="job-1"),
        attempt=3,
        outcome="Interrupted",
        message="gave up after attempt 3 of 3",
        final=True,
    )
    assert [(t["try"], t["outcome"]) for t in given_up["tries"]] == [(1, "Interrupted")]
    replaced = runstatus.interrupted(
        runstatus.start_attempt({}, attempt=1, instance="a", pod="job-1"), message="replaced"
    )
    assert replaced is not None and replaced["phase"] == "Interrupted"
    assert [(t["try"], t["outcome"]) for t in replaced["tries"]] == [(1, "Interrupted")]
    assert runstatus.interrupted(replaced, message="again") is None, "a run that ended keeps how it ended"
