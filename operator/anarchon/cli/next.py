"""``anarchon next FILE|JOB -c 10``: a job's next times on its zone's wall clock, clock changes marked.

A FILE is read offline (every AnarchonJob in it); otherwise JOB is read from the API server.
The times are the engine's (:mod:`.times`), what the replicas will claim.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING, Any

from .common import Failure, add_kube_args, count_arg, default_namespace, read_job, report, time_arg, with_kube
from .manifests import read
from .output import add_output_arg, dump, table

if TYPE_CHECKING:
    from ..kube.api.client import Kube


def _next(label: str, body: dict[str, Any], after_ms: int, count: int) -> dict[str, Any]:
    from ..kube.job.spec import SpecError, parse_job, schedule_column
    from .times import upcoming, zone_of

    try:
        spec = parse_job(body)
    except SpecError as exc:
        raise Failure(f"{label} is invalid: {exc}") from None
    return {
        "namespace": spec.namespace,
        "name": spec.name,
        "schedule": schedule_column(spec.schedule),
        "timeZone": zone_of(spec.schedule),
        "suspended": spec.options.suspend,
        "next": upcoming(spec.schedule, after_ms, count),
    }


def _print(jobs: list[dict[str, Any]], fmt: str) -> None:
    from .times import rows

    if fmt != "table":
        print(dump(jobs, fmt))
        return
    for i, job in enumerate(jobs):
        suspended = " (suspended: these slots do not run, a trigger still does)" if job["suspended"] else ""
        print(("\n" if i else "") + f"{job['namespace']}/{job['name']}: {job['schedule']}{suspended}")
        print(table(*rows(job["next"])))


def run(args: argparse.Namespace) -> int:
    try:
        after_ms = time.time_ns() // 1_000_000 if args.after is None else time_arg("--after", args.after)
    except Failure as failure:
        return report("next", failure)
    if os.path.exists(args.target):
        try:
            manifest = read(args.target, args.namespace or default_namespace(args.kubeconfig))
            if manifest.problems:
                raise Failure(f"{args.target}: {manifest.problems[0]}")
            _print(
                [_next(f"{args.target}: {label}", body, after_ms, args.count) for label, body in manifest.jobs],
                args.output,
            )
        except Failure as failure:
            return report("next", failure)
        return 0

    async def show(kube: Kube, namespace: str) -> int:
        body = await read_job(kube, namespace, args.target)
        _print([_next(f"AnarchonJob {namespace}/{args.target}", body, after_ms, args.count)], args.output)
        return 0

    return with_kube("next", args, show)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    nx = sub.add_parser("next", help="a job's next times in its zone, clock changes marked (FILE offline, or JOB)")
    nx.add_argument("target", metavar="FILE|JOB", help="a YAML file of AnarchonJobs, or a job's name")
    # -n is the namespace, as in every verb; the count is -c.
    nx.add_argument("--count", "-c", type=count_arg, default=10, help="how many times (default 10)")
    nx.add_argument("--after", help="times after this one: RFC3339 or ms since the epoch (default: now)")
    add_kube_args(nx)
    add_output_arg(nx)
    nx.set_defaults(func=run)
