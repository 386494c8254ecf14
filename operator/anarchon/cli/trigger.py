"""``anarchon trigger JOB``: a run now (or at ``--at``), outside the job's schedule.

It annotates the job (through the API: no kubectl needed, so it also works from the
operator's image); the replicas claim that slot like any scheduled one (see
:mod:`anarchon.kube.triggers`).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .common import Failure, add_kube_args, job_not_found, report, with_kube

if TYPE_CHECKING:
    from ..kube.client import Kube


def run(args: argparse.Namespace) -> int:
    from ..kube.client import ApiException
    from ..kube.constants import ANNOTATION_TRIGGER
    from ..kube.triggers import parse_trigger

    at = args.at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if parse_trigger(at) is None:
        message = f"--at {at!r} is not a time between 1970 and 9999 (RFC3339, or ms since the epoch)"
        return report("trigger", Failure(message, 2))

    async def annotate(kube: Kube, namespace: str) -> int:
        try:
            await kube.annotate_job(namespace, args.job, {ANNOTATION_TRIGGER: at})
        except ApiException as exc:
            if exc.status == 404:
                raise job_not_found(namespace, args.job) from None
            raise
        print(f"anarchonjob {namespace}/{args.job}: run of {at} requested")
        return 0

    return with_kube("trigger", args, annotate)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tr = sub.add_parser("trigger", help="run a job now, outside its schedule")
    tr.add_argument("job")
    add_kube_args(tr)
    tr.add_argument("--at", help="the run's slot: an RFC3339 time or ms since the epoch (default: now)")
    tr.set_defaults(func=run)
