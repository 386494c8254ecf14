"""What the verbs read from AnarchonJobs and AnarchonRuns, as plain records (one vocabulary for
tables, JSON and YAML): the fields the operator writes, and what follows from them.

The job's next time is computed here from its spec by the engine's schedule, not read from
its status: the status says what a replica last wrote, which is stale when none runs.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from ..kube.constants import ANNOTATION_SUSPEND_REASON
from ..kube.job.spec import SpecError, parse_job, schedule_column, slot_time
from ..kube.run.record import cause_of
from ..kube.run.runstatus import RunStatus, RunStep
from .times import zone_of


def job_record(job: dict[str, Any], now_ms: int) -> dict[str, Any]:
    meta, spec, status = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    suspended = bool(spec.get("suspend", False))
    try:
        parsed = parse_job(job)
    except SpecError as exc:
        schedule, zone, next_time, problems = None, None, None, exc.messages
    else:
        schedule, zone, problems = schedule_column(parsed.schedule), zone_of(parsed.schedule), []
        next_time = None if suspended else slot_time(parsed.schedule.next_after(now_ms))
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "schedule": schedule,
        "timeZone": zone,
        "suspended": suspended,
        "suspendReason": (meta.get("annotations") or {}).get(ANNOTATION_SUSPEND_REASON) if suspended else None,
        "active": int(status.get("activeCount") or 0),
        "lastScheduleTime": status.get("lastScheduleTime"),
        "lastSuccessfulTime": status.get("lastSuccessfulTime"),
        "nextScheduleTime": next_time,
        "problems": problems,
    }


def _word(value: StrEnum | None) -> str | None:
    """A phase, outcome or cause as the records show it: the word, a plain string (JSON, YAML)."""
    return None if value is None else str(value)


def _step(step: RunStep) -> dict[str, Any]:
    """One attempt or try of a run, as shown: its Pod, outcome, times and message."""
    return {
        "pod": step.pod_name,
        "outcome": _word(step.outcome),
        "startTime": step.start_time,
        "finishTime": step.finish_time,
        "message": step.message or "",
    }


def run_record(run: dict[str, Any]) -> dict[str, Any]:
    """A run: its outcome once it has one (an Interrupted run without a finish time waits for its next attempt)."""
    spec, status = run.get("spec") or {}, RunStatus.of(run.get("status"))
    attempts = [
        {"attempt": a.attempt, "instance": a.instance, "launched": a.launched or None, "adopted": a.adopted or None}
        | _step(a)
        for a in status.attempts
    ]
    return {
        "name": run["metadata"]["name"],
        "slot": int(spec.get("slot") or 0),
        "slotTime": spec.get("slotTime") or slot_time(int(spec.get("slot") or 0)),
        "trigger": _word(cause_of(run)),
        "phase": _word(status.phase),
        "outcome": None if not status.ended else _word(status.phase),
        "attempts": attempts,
        "takeovers": status.takeovers or 0,
        "try": status.current_try,
        "tries": [{"try": t.number} | _step(t) for t in status.tries],
        "startTime": status.start_time,
        "finishTime": status.finish_time,
        "reason": status.reason,
        "message": status.message or "",
    }


def run_rows(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The runs table: one line per run, its attempts counted and their instances in order, its tries.

    Attempts follow interruptions (a runner lost, a hand-over); TAKEOVERS counts those that
    adopted the live Pod (not counted against maxAttempts); tries follow failed Pods
    (``spec.retries``): TRIES is the try the run is on, or ended on.
    """
    headers = ["RUN", "SLOT", "TRIGGER", "PHASE", "ATTEMPTS", "TAKEOVERS", "INSTANCES", "TRIES", "OUTCOME", "MESSAGE"]
    rows = [
        [
            r["name"],
            r["slotTime"],
            r["trigger"] or "-",
            r["phase"] or "-",
            str(len(r["attempts"])),
            str(r["takeovers"]),
            ",".join(a["instance"] or "?" for a in r["attempts"]) or "-",
            str(r["try"]),
            r["outcome"] or "-",
            " ".join(r["message"].split())[:60],
        ]
        for r in records
    ]
    return headers, rows


def suspended_text(record: dict[str, Any]) -> str:
    """``no``, ``yes``, or ``yes (the reason)``: the SUSPENDED column and the Suspended line."""
    if not record["suspended"]:
        return "no"
    return f"yes ({record['suspendReason']})" if record["suspendReason"] else "yes"
