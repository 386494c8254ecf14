"""``anarchon list``: the jobs of a namespace (or all), with schedule, suspension, active runs, last and next time."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from .common import add_kube_args, with_kube
from .output import add_output_arg, dump, relative, table

if TYPE_CHECKING:
    from ..kube.api.client import Kube


def run(args: argparse.Namespace) -> int:
    from .records import job_record, suspended_text

    async def show(kube: Kube, namespace: str) -> int:
        jobs = await kube.list_jobs(None if args.all_namespaces else namespace)
        now_ms = time.time_ns() // 1_000_000
        records = [job_record(job, now_ms) for job in jobs]
        if args.output != "table":
            print(dump(records, args.output))
            return 0
        if not records:
            print("no AnarchonJobs" + ("" if args.all_namespaces else f" in namespace {namespace}"))
            return 0
        headers = ["NAME", "SCHEDULE", "SUSPENDED", "ACTIVE", "LAST", "NEXT"]
        rows = [
            [
                r["name"],
                r["schedule"] or "<invalid: " + r["problems"][0] + ">",
                suspended_text(r),
                str(r["active"]),
                relative(r["lastScheduleTime"]),
                relative(r["nextScheduleTime"]),
            ]
            for r in records
        ]
        if args.all_namespaces:
            headers, rows = (
                ["NAMESPACE", *headers],
                [[r["namespace"], *row] for r, row in zip(records, rows, strict=True)],
            )
        print(table(headers, rows))
        return 0

    return with_kube("list", args, show)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ls = sub.add_parser("list", help="the jobs: schedule, suspended, active runs, last and next time")
    add_kube_args(ls)
    ls.add_argument("--all-namespaces", "-A", action="store_true", help="the jobs of every namespace")
    add_output_arg(ls)
    ls.set_defaults(func=run)
