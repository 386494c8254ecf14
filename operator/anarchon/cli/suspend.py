"""``anarchon suspend JOB [--reason TEXT]``: no more scheduled runs until ``resume``; the reason stays on the job.

``spec.suspend`` is what the replicas obey (a trigger still runs a suspended job); the reason
is the annotation ``anarchon.io/suspend-reason``, which ``list`` and ``get`` show beside the
job, so the next person knows why before resuming it. One merge patch sets both, so the job
is never suspended with a stale reason (a suspend without ``--reason`` removes an old one).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import add_kube_args, not_found, with_kube

if TYPE_CHECKING:
    from ..kube.client import Kube


def set_suspended(verb: str, args: argparse.Namespace, suspended: bool, reason: str | None) -> int:
    """Patch ``spec.suspend`` and the reason annotation (None removes it) of ``args.job`` at once."""
    from ..kube.client import ApiException
    from ..kube.constants import ANNOTATION_SUSPEND_REASON

    async def patch(kube: Kube, namespace: str) -> int:
        body = {"spec": {"suspend": suspended}, "metadata": {"annotations": {ANNOTATION_SUSPEND_REASON: reason}}}
        try:
            await kube.patch_job(namespace, args.job, body)
        except ApiException as exc:
            if exc.status == 404:
                raise await not_found(kube, namespace, args.job) from None
            raise
        what = "suspended" if suspended else "resumed"
        print(f"anarchonjob {namespace}/{args.job} {what}" + (f": {reason}" if reason else ""))
        return 0

    return with_kube(verb, args, patch)


def run(args: argparse.Namespace) -> int:
    return set_suspended("suspend", args, True, " ".join((args.reason or "").split()) or None)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("suspend", help="stop a job's scheduled runs (triggers still run), with a reason shown on it")
    sp.add_argument("job")
    sp.add_argument("--reason", help="why, shown by list and get until resume")
    add_kube_args(sp)
    sp.set_defaults(func=run)
