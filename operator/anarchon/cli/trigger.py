"""``anarchon trigger JOB``: a run now (or at ``--at``), outside the job's schedule.

It annotates the job (through the API: no kubectl needed, so it also works from the
operator's image); the replicas claim that slot like any scheduled one (see
:mod:`anarchon.kube.triggers`). With ``--wait`` it follows the run to its end and exits with
its outcome: 0 if it Succeeded, 1 otherwise (Failed, Interrupted, Skipped, Cancelled), so a
script or a CI step can run a job and act on the result.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .common import Failure, add_kube_args, not_found, report, time_arg, with_kube
from .follow import follow

if TYPE_CHECKING:
    from ..kube.client import Kube


def _seconds(value: str) -> float:
    from ..engine.durations import parse_duration
    from ..engine.errors import ScheduleError

    try:
        ms = parse_duration(value, what="--timeout")
    except ScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--timeout: ")) from exc
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return ms / 1000


def run(args: argparse.Namespace) -> int:
    from ..kube.client import ApiException
    from ..kube.constants import ANNOTATION_TRIGGER
    from ..kube.spec import run_name

    at = args.at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    try:
        slot = time_arg("--at", at)
    except Failure as failure:
        return report("trigger", failure)

    async def annotate(kube: Kube, namespace: str) -> int:
        try:
            await kube.annotate_job(namespace, args.job, {ANNOTATION_TRIGGER: at})
        except ApiException as exc:
            if exc.status == 404:
                raise await not_found(kube, namespace, args.job) from None
            raise
        print(f"anarchonjob {namespace}/{args.job}: run of {at} requested", flush=True)
        if not args.wait:
            return 0
        phase = await follow(kube, namespace, run_name(args.job, slot), args.timeout)
        return 0 if phase == "Succeeded" else 1  # never None: no absent_s

    return with_kube("trigger", args, annotate)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tr = sub.add_parser("trigger", help="run a job now, outside its schedule")
    tr.add_argument("job")
    add_kube_args(tr)
    tr.add_argument("--at", help="the run's slot: an RFC3339 time or ms since the epoch (default: now)")
    tr.add_argument("--wait", "-w", action="store_true", help="follow the run to its end; exit 0 if it Succeeded")
    tr.add_argument("--timeout", type=_seconds, help="with --wait: give up after this long (e.g. 10m; default: never)")
    tr.set_defaults(func=run)
