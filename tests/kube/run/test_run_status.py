"""A run's typed status (RunStatus): what the operator writes reads back as written, in the CRD's words.

Pure functions, no cluster. Every reader of a run reads its status as a RunStatus, and every
change writes it back through RunStatus.wire: a field read wrong, or lost on the way back,
would be gone from the object at the next write.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from anarchon.engine import Cause, RunState
from anarchon.kube.job.spec import parse_job
from anarchon.kube.run.record import cause_of, run_body, trigger_of
from anarchon.kube.run.runstatus import (
    RunStatus,
    Status,
    end_attempt,
    interrupted,
    pod_pending,
    pod_started,
    skipped,
    slot_skipped,
    start_attempt,
    try_failed,
)

RUN_CRD = Path(__file__).resolve().parents[3] / "crds" / "anarchonruns.anarchon.io.yaml"
AT = datetime(2026, 12, 3, 17, 0, 30, tzinfo=UTC)


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(RUN_CRD.read_text())
    properties: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return properties


def _written() -> list[Status]:
    """What each change of a run writes, along a run that meets them all."""
    started = start_attempt({}, attempt=1, instance="a", pod="job-1")
    pending = pod_pending(started, attempt=1, reason="Unschedulable", message="Pod job-1 is Pending: no node")
    assert pending is not None
    running = pod_started(pending, attempt=1, message="Pod job-1: the Pod is Running")
    assert running is not None
    failed = try_failed(running, try_number=1, message="exit 3", next_try_at=AT, next_pod="job-1-r1")
    assert failed is not None
    adopted = start_attempt(failed, attempt=2, instance="b", pod="job-1-r1", try_number=2, adopted=True)
    cancelled = end_attempt(
        adopted, attempt=2, outcome=RunState.CANCELLED, message="cancelled by alice", final=True, failed_try="exit 4"
    )
    lost = end_attempt(started, attempt=1, outcome=RunState.INTERRUPTED, message="Pod lost", final=False)
    found_ended = end_attempt(lost, attempt=2, outcome=RunState.SUCCEEDED, message="done", final=True, instance="c")
    replaced = interrupted(started, message="replaced by the run of slot 2")
    deadline = end_attempt(
        running, attempt=1, outcome=RunState.FAILED, message="ran past timeout", final=True, reason="DeadlineExceeded"
    )
    overlapped = skipped({}, message="skipped: the run job-0 is still active", instance="a")
    skipped_slot = slot_skipped({}, message="overlap", instance="a")
    written = [started, pending, running, failed, adopted, cancelled, lost, found_ended, replaced, deadline]
    return [*written, *(s for s in (overlapped, skipped_slot) if s is not None)]


def test_every_status_the_operator_writes_reads_back_as_written() -> None:
    written = _written()
    assert len(written) == 12
    for status in written:
        assert RunStatus.of(status).wire() == status


def test_a_written_status_has_only_the_crds_fields_and_words() -> None:
    schema = _schema()["status"]["properties"]
    for status in _written():
        assert set(status) <= set(schema), set(status) - set(schema)
        assert status["phase"] in schema["phase"]["enum"]
        for key in ("attempts", "tries", "conditions"):
            items = schema[key]["items"]
            for entry in status.get(key, []):
                assert set(entry) <= set(items["properties"]), (key, set(entry) - set(items["properties"]))
                assert set(items.get("required", [])) <= set(entry), (key, entry)
                for field, value in entry.items():
                    if "enum" in items["properties"][field]:
                        assert value in items["properties"][field]["enum"], (key, field, value)


def test_a_status_is_read_typed() -> None:
    cancelled = RunStatus.of(_written()[5])
    assert cancelled.phase is RunState.CANCELLED and cancelled.ended
    assert (cancelled.attempt, cancelled.instance, cancelled.current_try, cancelled.takeovers) == (2, "b", 2, 1)
    assert [(a.attempt, a.outcome, a.adopted, a.launched) for a in cancelled.attempts] == [
        (1, RunState.INTERRUPTED, False, True),
        (2, RunState.CANCELLED, True, False),
    ]
    assert [(t.number, t.pod_name, t.outcome, t.message) for t in cancelled.tries] == [
        (1, "job-1", RunState.FAILED, "exit 3"),
        (2, "job-1-r1", RunState.FAILED, "exit 4"),
    ]
    assert cancelled.conditions == [], "a new attempt's Pod: what held an earlier one says nothing about it"
    started = RunStatus.of(_written()[2])
    assert [(c.type, c.holds, c.reason) for c in started.conditions] == [("PodPending", False, "Started")]
    assert started.reason is None and started.message == ""
    lost = RunStatus.of(_written()[6])
    assert lost.phase is RunState.INTERRUPTED and not lost.ended, "between attempts: the next one takes it up"
    assert RunStatus.of(None) == RunStatus.of({}) == RunStatus() and RunStatus().wire() == {}


def test_a_runs_trigger_is_its_cause_by_the_same_word() -> None:
    """``spec.trigger`` keeps its name (people select runs by it); its values are the engine's causes."""
    assert sorted(trigger_of(cause) for cause in Cause) == sorted(_schema()["spec"]["properties"]["trigger"]["enum"])
    job = {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonJob",
        "metadata": {"name": "sync", "namespace": "team-a", "uid": "u-1", "generation": 1},
        "spec": {"every": "10s", "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}}},
    }
    spec = parse_job(job)
    for cause in Cause:
        body = run_body(spec, spec.uid, 1_800_000_000_000, cause)
        assert body["spec"]["trigger"] == str(cause)
        assert cause_of(body) is cause
    assert cause_of({"spec": {"job": "sync"}}) is None
