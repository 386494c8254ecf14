"""``anarchon trigger JOB``: a run now (or at ``--at``), outside the job's schedule.

It adds a request to the job's trigger queue, an annotation of its own
(``anarchon.io/trigger.<id>``, through the API: no kubectl needed, so it also works from the
operator's image), written onto the version of the job it read: it never overwrites another
request, and the queue's bound holds (a full queue is refused, rc 1). The replicas claim the
slot like any scheduled one, then remove the request (see :mod:`anarchon.kube.job.triggers`): a
request sent while no replica runs waits for them. With ``--wait`` it follows the run to its
end and exits with its outcome: 0 if it Succeeded, 1 otherwise (Failed, Interrupted, Skipped,
Cancelled, or not over within ``--timeout``, 10 minutes by default), so a script or a CI step
can run a job and act on the result.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .common import Failure, add_kube_args, add_wait_args, not_found, report, time_arg, with_kube
from .follow import follow

if TYPE_CHECKING:
    from ..kube.api.client import Kube


async def ask(kube: Kube, namespace: str, job: str, at: str) -> str:
    """Queue a request for a run of ``job`` at ``at``; its annotation key. A full queue, or a
    missing job, is the verb's one-line failure. ``anarchon ui`` asks through this too."""
    from ..kube.api.client import ApiException
    from ..kube.constants import MAX_PENDING_TRIGGERS
    from ..kube.job.triggers import Contended, QueueFull, request_trigger

    try:
        return await request_trigger(kube, namespace, job, at)
    except ApiException as exc:
        if exc.status == 404:
            raise await not_found(kube, namespace, job) from None
        raise
    except QueueFull as full:
        raise Failure(
            f"anarchonjob {namespace}/{job}: the trigger queue is full, {full.pending} requests pending"
            f" (at most {MAX_PENDING_TRIGGERS}): are its replicas running? Try again once they handled some"
        ) from None
    except Contended as exc:
        raise Failure(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from ..engine import RunState
    from ..kube.job.spec import run_name

    at = args.at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    try:
        slot = time_arg("--at", at)
    except Failure as failure:
        return report("trigger", failure)

    async def annotate(kube: Kube, namespace: str) -> int:
        await ask(kube, namespace, args.job, at)
        print(f"anarchonjob {namespace}/{args.job}: run of {at} requested", flush=True)
        if not args.wait:
            return 0
        phase = await follow(kube, namespace, run_name(args.job, slot), args.timeout)
        return 0 if phase is RunState.SUCCEEDED else 1  # never None: no absent_s

    return with_kube("trigger", args, annotate)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tr = sub.add_parser("trigger", help="run a job now, outside its schedule")
    tr.add_argument("job")
    add_kube_args(tr)
    tr.add_argument("--at", help="the run's slot: an RFC3339 time or ms since the epoch (default: now)")
    add_wait_args(tr, "Succeeded")
    tr.set_defaults(func=run)
