"""``anarchon cancel RUN`` (or ``--job JOB --slot T``): stop a run that has not ended, with a reason.

It sets the annotation ``anarchon.io/cancel`` (the reason) on the run's AnarchonRun, and
``anarchon.io/cancel-by`` (who asked, as the API server names the caller); ``kubectl annotate``
of the first alone does the same. The replica that runs the run deletes its Pod and ends it
Cancelled; with no replica up, the first that takes the run over does (see
:mod:`anarchon.kube.run.runner`). The patch is conditional on the version read: a run that ended
meanwhile is read again, and a run that has ended is left as it is (one line, exit 1).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .common import Failure, add_kube_args, add_wait_args, crds_missing, report, time_arg, with_kube
from .follow import follow

if TYPE_CHECKING:
    from ..kube.api.client import Kube
    from ..kube.run.record import Cancel

#: Where the API server says who the caller is (GA since Kubernetes 1.28).
REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def _caller(kube: Kube) -> str | None:
    """Who the API server takes us for (a user, or a ServiceAccount's name); None if it does not say."""
    from ..kube.api.client import ApiException, call

    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        review = await call("asking who we are", lambda: kube.request("POST", REVIEW, body))
    except ApiException:
        return None  # an older server, or one that forbids it: the cancel says nobody
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "") or None


async def _read(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    from ..kube.api.client import ApiException, call, path
    from ..kube.constants import API_VERSION, RUNS
    from .common import INSTALL_CRDS

    try:
        return dict(await call(f"reading run {name}", lambda: kube.request("GET", path(RUNS, namespace, name))))
    except ApiException as exc:
        if exc.status != 404:
            raise
    if await crds_missing(kube):
        raise Failure(f"the API server at {kube.endpoint.server} does not serve {API_VERSION}: {INSTALL_CRDS}")
    raise Failure(f"no AnarchonRun {name!r} in namespace {namespace!r} (HTTP 404)")


async def _annotate(kube: Kube, namespace: str, name: str, version: str, annotations: dict[str, str | None]) -> bool:
    """Set the annotations on the run as it was at ``version``; False if it changed since (it may have ended)."""
    from ..kube.api.client import ApiException, call, path
    from ..kube.constants import MERGE, RUNS

    patch = {"metadata": {"resourceVersion": version, "annotations": annotations}}
    try:
        await call(
            f"annotating run {name}",
            lambda: kube.request("PATCH", path(RUNS, namespace, name), patch, content_type=MERGE),
        )
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def _who_why(cancel: Cancel) -> str:
    return (f" by {cancel.by}" if cancel.by else "") + (f": {cancel.reason}" if cancel.reason else "")


async def request_cancel(kube: Kube, namespace: str, name: str, reason: str) -> str:
    """Ask the replicas to stop run ``name``; what was done, in one line. A run that has ended is
    the verb's one-line failure. ``anarchon ui`` cancels through this too."""
    from ..kube.constants import ANNOTATION_CANCEL, ANNOTATION_CANCEL_BY
    from ..kube.run.record import Cancel, cancel_of
    from ..kube.run.runstatus import RunStatus

    by = await _caller(kube)
    while True:
        obj = await _read(kube, namespace, name)
        status = RunStatus.of(obj.get("status"))
        where = f"anarchonrun {namespace}/{name}"
        if status.ended:
            message = " ".join((status.message or "").split())
            raise Failure(f"{where} has ended {status.phase}" + (f": {message}" if message else ""))
        if (asked := cancel_of(obj)) is not None:
            return f"{where}: cancel already requested{_who_why(asked)}"
        annotations = {ANNOTATION_CANCEL: reason, ANNOTATION_CANCEL_BY: by}
        if await _annotate(kube, namespace, name, str(obj["metadata"]["resourceVersion"]), annotations):
            return f"{where}: cancel requested{_who_why(Cancel(reason, by))}"
        # It changed since our read (its runner wrote its status): read it again.


def run(args: argparse.Namespace) -> int:
    from ..engine import RunState
    from ..kube.job.spec import run_name

    try:
        if (args.run is None) == (args.job is None) or (args.job is None) != (args.slot is None):
            raise Failure("name the run, or give --job and --slot (not both)", 2)
        name = args.run if args.run is not None else run_name(args.job, time_arg("--slot", args.slot))
    except Failure as failure:
        return report("cancel", failure)
    reason = " ".join((args.reason or "").split())

    async def cancel(kube: Kube, namespace: str) -> int:
        print(await request_cancel(kube, namespace, name, reason), flush=True)
        if not args.wait:
            return 0
        # A Pod that ended on its own before its delete landed gives the run its own outcome.
        phase = await follow(kube, namespace, name, args.timeout, claimed=True)
        return 0 if phase is RunState.CANCELLED else 1

    return with_kube("cancel", args, cancel)


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cn = sub.add_parser("cancel", help="stop a run: its Pod is deleted, nothing more launched; it ends Cancelled")
    cn.add_argument("run", nargs="?", help="the AnarchonRun (see `anarchon runs JOB`)")
    cn.add_argument("--job", help="the run's job (with --slot, instead of RUN)")
    cn.add_argument("--slot", help="the run's slot: an RFC3339 time or ms since the epoch (with --job)")
    cn.add_argument("--reason", help="why, recorded on the run (its message, its Events)")
    add_kube_args(cn)
    add_wait_args(cn, "Cancelled")
    cn.set_defaults(func=run)
