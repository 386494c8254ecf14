"""``anarchon get JOB`` (or ``describe JOB``): one job, its conditions, its recent runs and its next times."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .common import add_kube_args, read_job, with_kube
from .output import add_output_arg, dump, fields, relative, table

if TYPE_CHECKING:
    from ..kube.api.client import Kube


def _at(rfc3339: str | None) -> str:
    return f"{rfc3339} ({relative(rfc3339)})" if rfc3339 else "-"


def _text(job: dict[str, Any]) -> str:
    from .records import run_rows, suspended_text
    from .times import rows

    record = job["job"]
    pairs = {
        "Name": f"{record['namespace']}/{record['name']}",
        "Schedule": record["schedule"] or "-",
        "Time zone": record["timeZone"] or "-",
        "Suspended": suspended_text(record),
        "Active runs": str(record["active"]),
        "Last scheduled": _at(record["lastScheduleTime"]),
        "Last succeeded": _at(record["lastSuccessfulTime"]),
    }
    for c in job["conditions"]:
        pairs[c.get("type", "?")] = f"{c.get('status')} ({c.get('reason')}: {c.get('message')})"
    parts = [fields(pairs)]
    if record["problems"]:
        parts.append("Problems:\n" + "\n".join(f"  {p}" for p in record["problems"]))
    if job["pendingTriggers"]:
        pending = job["pendingTriggers"]
        parts.append(f"Pending triggers ({len(pending)}):\n" + "\n".join(f"  {t}" for t in pending))
    runs = job["runs"]
    parts.append(f"Recent runs ({len(runs)}):\n" + (table(*run_rows(runs)) if runs else "  none"))
    if job["next"]:
        parts.append(f"Next {len(job['next'])} times:\n" + table(*rows(job["next"])))
    elif record["suspended"]:
        parts.append("Next times: none while suspended (a trigger still runs)")
    return "\n\n".join(parts)


def _pending_triggers(job: dict[str, Any]) -> list[str]:
    """The runs asked for and not yet taken by a replica, by the time each names (``now``, or a slot's)."""
    from ..kube.job.spec import slot_time
    from ..kube.job.triggers import NOW, parse_trigger, pending_requests

    def shown(value: str) -> str:
        if value.strip() == NOW:
            return NOW
        slot = parse_trigger(value)
        return f"{value!r} (not a time: refused)" if slot is None else slot_time(slot)

    return sorted(shown(v) for v in pending_requests(job["metadata"].get("annotations") or {}).values())


def run(args: argparse.Namespace) -> int:
    from ..kube.job.spec import parse_job
    from ..kube.run.record import list_runs
    from .records import job_record, run_record
    from .times import upcoming

    async def show(kube: Kube, namespace: str) -> int:
        job = await read_job(kube, namespace, args.job)
        runs = await list_runs(kube, namespace, args.job)
        now_ms = time.time_ns() // 1_000_000
        record = job_record(job, now_ms)
        times: list[dict[str, Any]] = []
        if not record["suspended"] and not record["problems"]:
            times = upcoming(parse_job(job).schedule, now_ms, args.next)
        out = {
            "job": record,
            "conditions": list((job.get("status") or {}).get("conditions") or []),
            "pendingTriggers": _pending_triggers(job),
            "runs": [run_record(r) for r in runs[-args.runs :]] if args.runs else [],
            "next": times,
        }
        print(dump(out, args.output) if args.output != "table" else _text(out))
        return 0

    return with_kube("get", args, show)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gt = sub.add_parser("get", aliases=["describe"], help="one job: conditions, recent runs, next times")
    gt.add_argument("job")
    add_kube_args(gt)
    gt.add_argument("--next", type=int, default=5, metavar="N", help="how many next times (default 5)")
    gt.add_argument("--runs", type=int, default=10, metavar="N", help="how many recent runs (default 10)")
    add_output_arg(gt)
    gt.set_defaults(func=run)
