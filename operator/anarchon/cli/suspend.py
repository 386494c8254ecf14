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
    from ..kube.api.client import Kube


async def patch_suspended(kube: Kube, namespace: str, job: str, suspended: bool, reason: str | None) -> str:
    """Patch ``spec.suspend`` and the reason annotation (None removes it) of ``job`` at once; what
    was done, in one line. ``anarchon ui`` suspends and resumes through this too."""
    from ..kube.api.client import ApiException
    from ..kube.constants import ANNOTATION_SUSPEND_REASON

    body = {"spec": {"suspend": suspended}, "metadata": {"annotations": {ANNOTATION_SUSPEND_REASON: reason}}}
    try:
        await kube.patch_job(namespace, job, body)
    except ApiException as exc:
        if exc.status == 404:
            raise await not_found(kube, namespace, job) from None
        raise
    what = "suspended" if suspended else "resumed"
    return f"anarchonjob {namespace}/{job} {what}" + (f": {reason}" if reason else "")


def set_suspended(verb: str, args: argparse.Namespace, suspended: bool, reason: str | None) -> int:
    """The verb: :func:`patch_suspended` of ``args.job``, its line printed."""

    async def patch(kube: Kube, namespace: str) -> int:
        print(await patch_suspended(kube, namespace, args.job, suspended, reason))
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
