"""``anarchon why JOB [--slot T | --last N]``: why each slot did (or did not) run.

The facts live in three places: the slot's AnarchonRun (who won it, when it launched, its tries,
takeovers and outcome; Skipped and the run that was active), the job's ``status.missed``
(windows of slots missed, and why: the operator keeps them there after the Events fade) and the
job itself (not yet due, suspended, an invalid spec, created after the slot). This verb puts
them side by side, one verdict per slot.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .common import Failure, add_kube_args, count_arg, read_job, report, time_arg, with_kube
from .output import add_output_arg, dump, table

if TYPE_CHECKING:
    from ..kube.api.client import Kube
    from ..kube.job.missed import Window
    from ..kube.job.spec import JobSpec


def _after(slot: int, rfc3339: str | None) -> str | None:
    """How long after the slot a time was, to the second the API server keeps: ``+2s``, ``<1s``."""
    from ..kube.job.spec import ms_of

    t = ms_of(rfc3339)
    if t is None:
        return None
    return "<1s" if t - slot < 1000 else f"+{(t - slot) // 1000}s"


def _condition(job: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)


def _ran(slot: int, run: dict[str, Any], spec: JobSpec | None) -> dict[str, Any]:
    """A slot that has a run: what it did, who ran it and how late each step was."""
    from ..engine import Cause, RunState
    from ..kube.run.record import cause_of
    from ..kube.run.runstatus import RunStatus

    status = RunStatus.of(run.get("status"))
    phase = str(status.phase or "")
    attempts = status.attempts
    winner = attempts[0].instance if attempts else status.instance
    cause = cause_of(run)
    record: dict[str, Any] = {
        "run": run["metadata"]["name"],
        "trigger": None if cause is None else str(cause),
        "phase": phase or None,
        "winner": winner,
        "cluster": status.cluster,
        "created": _after(slot, run["metadata"].get("creationTimestamp")),
        "launched": _after(slot, status.start_time),
        "tries": len(status.tries),
        "attempts": len(attempts),
        "takeovers": status.takeovers or 0,
        "reason": status.reason,
        "message": " ".join((status.message or "").split()),
    }
    if status.phase is RunState.SKIPPED:
        record["verdict"] = "skipped"
        record["why"] = record["message"] or "the overlap policy skipped it: an earlier run was still active"
        return record
    if status.phase is RunState.CANCELLED:
        record["verdict"] = "cancelled"
        record["why"] = record["message"] or "cancelled"
        return record
    if not phase:
        record["verdict"] = "claimed"
        record["why"] = f"claimed {record['created'] or ''} by a replica; no status yet".replace("  ", " ")
        return record
    record["verdict"] = "ran" if status.ended else "running"
    steps = [f"won by {winner or '?'}" + (f" ({cause} run)" if cause not in (None, Cause.SCHEDULE) else "")]
    if status.cluster:
        steps.append(f"ran in cluster {status.cluster} (its Pod is there)")
    if record["created"]:
        jitter = f" (jitter up to {spec.options.jitter_ms / 1000:g}s)" if spec is not None else ""
        steps.append(f"claimed {record['created']}{jitter}")
    if record["launched"]:
        steps.append(f"launched {record['launched']}")
    if record["tries"] > 1:
        steps.append(f"{record['tries']} tries")
    if record["takeovers"]:
        steps.append(f"{record['takeovers']} takeover(s)")
    if len(attempts) > 1:
        steps.append(f"{len(attempts)} attempts")
    outcome = f"{phase}" + (f": {record['message']}" if record["message"] else "")
    record["why"] = ", ".join(steps) + f"; {outcome}"
    return record


def _not_run(
    slot: int, now_ms: int, job: dict[str, Any], spec: JobSpec | None, windows: list[Window]
) -> dict[str, Any]:
    """A slot without a run: the first of the job's facts that explains it."""
    from ..kube.constants import ANNOTATION_SUSPEND_REASON
    from ..kube.job.spec import ms_of

    record: dict[str, Any] = {"run": None}
    created = ms_of(job["metadata"].get("creationTimestamp"))
    if slot > now_ms:
        return {**record, "verdict": "not yet due", "why": "the slot is in the future"}
    window = next((w for w in windows if w.first_ms <= slot <= w.last_ms), None)
    if window is not None:
        return {
            **record,
            "verdict": "missed",
            "reason": window.reason,
            "why": f"{window.reason}: {window.message} ({window.count} slot(s) missed alike)",
        }
    if created is not None and slot < created:
        return {**record, "verdict": "before the job", "why": "the job was created after this slot"}
    invalid = _condition(job, "Invalid")
    if invalid is not None and invalid.get("status") == "True":
        return {**record, "verdict": "invalid", "why": f"the job's spec is invalid: {invalid.get('message')}"}
    ready = _condition(job, "Ready")
    since = ms_of(ready.get("lastTransitionTime")) if ready else None
    if spec is not None and spec.options.suspend and (since is None or since <= slot):
        reason = (job["metadata"].get("annotations") or {}).get(ANNOTATION_SUSPEND_REASON)
        return {**record, "verdict": "suspended", "why": "the job is suspended" + (f": {reason}" if reason else "")}
    if spec is not None and now_ms - slot < spec.options.jitter_ms + spec.options.effective_lease_ms:
        return {**record, "verdict": "due", "why": "due just now: the replicas are claiming it"}
    return {
        **record,
        "verdict": "no record",
        "why": (
            "no run and no missed slot recorded: its run was deleted (by hand, or by the history limits),"
            " or no replica ran the job then and the replica that came back started later than the"
            " catch-up window after it (misses are only counted that far back)"
        ),
    }


def explain(
    job: dict[str, Any], run_objects: list[dict[str, Any]], slots: list[int], now_ms: int
) -> list[dict[str, Any]]:
    """One record per slot, oldest first: its verdict, why, and the facts behind it."""
    from ..kube.job import missed
    from ..kube.job.spec import SpecError, parse_job, slot_time

    try:
        spec: JobSpec | None = parse_job(job)
    except SpecError:
        spec = None
    by_slot = {int((r.get("spec") or {}).get("slot") or 0): r for r in run_objects}
    windows = missed.from_status(job.get("status") or {})
    records = []
    for slot in slots:
        run = by_slot.get(slot)
        facts = _ran(slot, run, spec) if run is not None else _not_run(slot, now_ms, job, spec, windows)
        records.append({"slot": slot, "slotTime": slot_time(slot), **facts})
    return records


def _slots(job: dict[str, Any], run_objects: list[dict[str, Any]], args: argparse.Namespace, now_ms: int) -> list[int]:
    """The slots asked about: ``--slot``'s (a run's slot, or the schedule's), or the last N due, with
    the manual runs among them."""
    from ..engine.schedule import slots_between
    from ..kube.job.spec import SpecError, parse_job, slot_time

    run_slots = {int((r.get("spec") or {}).get("slot") or 0) for r in run_objects}
    try:
        schedule = parse_job(job).schedule
    except SpecError as exc:
        if args.slot is not None and args.slot in run_slots:
            return [args.slot]
        raise Failure(f"the job's spec is invalid, it has no slots: {exc}") from None
    if args.slot is not None:
        if args.slot in run_slots or schedule.next_after(args.slot - 1) == args.slot:
            return [args.slot]
        before = next(iter(slots_between(schedule, args.slot - 366 * 86_400_000, args.slot)), None)
        after = schedule.next_after(args.slot)
        near = f"the next is {slot_time(after)}" if before is None else f"the one before is {slot_time(before)}"
        raise Failure(f"{slot_time(args.slot)} is not a slot of the job ({schedule}) and no run has it: {near}")
    slots = _last_slots(schedule, now_ms, args.last)  # a slot due at now_ms included
    first = slots[0] if slots else now_ms
    return sorted({*slots, *(s for s in run_slots if first <= s <= now_ms)})


def _last_slots(schedule: Any, now_ms: int, count: int) -> list[int]:
    """The ``count`` latest slots at or before ``now_ms``: found by stepping back in spans four times longer each."""
    from ..engine.schedule import slots_between

    span = 60_000
    while True:
        found = list(slots_between(schedule, now_ms - span, now_ms))
        if len(found) >= count or span > 5 * 366 * 86_400_000:
            return found[-count:]
        span *= 4


def _print(records: list[dict[str, Any]], namespace: str, name: str, fmt: str) -> None:
    if fmt != "table":
        print(dump(records, fmt))
        return
    print(f"{namespace}/{name}:")
    print(
        table(
            ["SLOT", "VERDICT", "RUN", "WHY"],
            [[r["slotTime"], r["verdict"], r["run"] or "-", r["why"]] for r in records],
        )
    )


def run(args: argparse.Namespace) -> int:
    from ..kube.run.record import list_runs

    try:
        args.slot = None if args.slot is None else time_arg("--slot", args.slot)
    except Failure as failure:
        return report("why", failure)

    async def show(kube: Kube, namespace: str) -> int:
        job = await read_job(kube, namespace, args.job)
        run_objects = await list_runs(kube, namespace, args.job)
        now_ms = time.time_ns() // 1_000_000
        slots = _slots(job, run_objects, args, now_ms)
        _print(explain(job, run_objects, slots, now_ms), namespace, args.job, args.output)
        return 0

    return with_kube("why", args, show)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    w = sub.add_parser("why", help="why each slot of a job did or did not run")
    w.add_argument("job")
    which = w.add_mutually_exclusive_group()
    which.add_argument("--slot", metavar="TIME", help="one slot: RFC3339, or ms since the epoch")
    which.add_argument(
        "--last",
        type=count_arg,
        default=5,
        metavar="N",
        help="the N latest due slots, and the manual runs among them (default 5)",
    )
    add_kube_args(w)
    add_output_arg(w)
    w.set_defaults(func=run)
