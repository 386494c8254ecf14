"""AnarchonRun objects: one per run (job + slot), what ``kubectl get anarchonruns`` shows.

The store decides who runs what; the AnarchonRun mirrors it for people. Its status is
written with optimistic concurrency and an attempt guard: a write from attempt N is refused
once attempt N+1 has written, so a runner that froze and woke up cannot overwrite the
status of the attempt that replaced it.

What the status says, and how it changes, is :mod:`.runstatus`'s: this module writes the
object (its creation, the changes :mod:`.runstatus` makes to its status, its cancel request)
and reads it back (by job, by the history limits' order).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...engine import Cause, RunState
from ..api.client import ApiException, Kube, call, path, turn
from ..constants import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_BY,
    API_VERSION,
    JOB_KIND,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_SLOT,
    MANAGED_BY,
    RUN_KIND,
    RUNS,
)
from ..job.spec import JobSpec, run_name, slot_time
from .runstatus import RunStatus, Status, slot_skipped


def trigger_of(cause: Cause) -> str:
    """The run's ``spec.trigger`` for the engine's cause of the run: the CRD's field keeps its name
    (people select runs by it), and its values are the cause's own words."""
    return str(cause)


def cause_of(run: Mapping[str, Any]) -> Cause | None:
    """Why the run exists, as its ``spec.trigger`` says (None: it does not say)."""
    trigger = (run.get("spec") or {}).get("trigger")
    return Cause(str(trigger)) if trigger else None


def cause_guess(spec: JobSpec, slot: int) -> Cause:
    """What started a run whose object is written by someone who does not know: a slot of the
    schedule was scheduled, any other slot was a manual trigger (or a backfill)."""
    return Cause.SCHEDULE if spec.schedule.next_after(slot - 1) == slot else Cause.MANUAL


def run_body(spec: JobSpec, job_uid: str, slot: int, cause: Cause) -> dict[str, Any]:
    name = run_name(spec.name, slot)
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": {LABEL_JOB: spec.name, LABEL_SLOT: str(slot), LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": JOB_KIND,
                    "name": spec.name,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"job": spec.name, "slot": slot, "slotTime": slot_time(slot), "trigger": trigger_of(cause)},
    }


def history_kinds(spec: JobSpec) -> list[tuple[tuple[RunState, ...], int]]:
    """The kinds of ended runs the history limits keep apart (their phases), and how many of each.

    Skipped runs have a kind of their own: a long job on a short period skips many slots, and
    they must not push the successful runs out of the history.
    """
    return [
        ((RunState.SUCCEEDED,), spec.successful_history),
        ((RunState.SKIPPED,), spec.successful_history),
        ((RunState.FAILED, RunState.INTERRUPTED, RunState.CANCELLED), spec.failed_history),
    ]


def ran_at(run: Mapping[str, Any]) -> tuple[str, int]:
    """When a run ran, for the history limits' order: its start, or (a Skipped run, one that
    never started) its object's creation, at the claim; then its slot, between equal seconds.

    Both are RFC3339 UTC to the second, so their text sorts as their time.
    """
    when = RunStatus.of(run.get("status")).start_time or (run.get("metadata") or {}).get("creationTimestamp") or ""
    return str(when), int((run.get("spec") or {}).get("slot") or 0)


async def ensure_run(kube: Kube, spec: JobSpec, slot: int, cause: Cause) -> dict[str, Any]:
    """Create the run's object, or return the existing one (every replica may try).

    Safe to retry: a create whose reply was lost is found again by the 409 of the next try.
    """
    body = run_body(spec, spec.uid, slot, cause)
    name = body["metadata"]["name"]
    try:
        created = await call(
            f"creating run {name}",
            lambda: kube.request("POST", path(RUNS, spec.namespace), body),
        )
        return dict(created)
    except ApiException as exc:
        if exc.status != 409:
            raise
    return dict(
        await call(
            f"reading run {name}",
            lambda: kube.request("GET", path(RUNS, spec.namespace, name)),
        )
    )


class _Conflict(Exception):
    """The object changed between our read and our write: read it again."""


@dataclass
class InHand:
    """The run's object as a runner last created, read or wrote it: its next write starts there.

    A write from it carries its resourceVersion, so it is applied only if nobody wrote since;
    otherwise the API server answers 409 and the write reads the object afresh. A runner is
    usually the run's only writer, so most writes need no read: one request instead of two.
    """

    body: dict[str, Any] | None = None


async def update_status(
    kube: Kube,
    namespace: str,
    name: str,
    attempt: int,
    change: Callable[[Status], Status | None],
    *,
    in_hand: InHand | None = None,
) -> bool:
    """Apply ``change`` to the run's status unless a later attempt owns it; True if written.

    False means a later attempt owns the run, or its object is gone: the caller's attempt is
    over. Conflicts and transient errors are retried (a re-read each time), so a write whose
    reply was lost is simply applied again to what the server now has: ``change`` must be
    idempotent. With ``in_hand`` the first try starts from the object held there (no read),
    and what was written is kept there for the next write.
    """
    held = InHand() if in_hand is None else in_hand

    async def read_modify_write() -> bool:
        body, held.body = held.body, None  # used once: a retry (conflict, lost reply) reads afresh
        if body is None:
            try:
                body = dict(await kube.request("GET", path(RUNS, namespace, name)))
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
        body = dict(body)
        status: Status = copy.deepcopy(body.get("status") or {})
        if (RunStatus.of(status).attempt or 0) > attempt:
            return False  # fenced: a later attempt has taken over this run
        new = change(status)
        if new is None:
            held.body = body
            return True
        body["status"] = new
        try:
            written = await kube.request("PUT", path(RUNS, namespace, name, "status"), body)
        except ApiException as exc:
            if exc.status == 409:
                raise _Conflict() from exc
            if exc.status == 404:
                return False
            raise
        held.body = dict(written)
        return True

    return await call(f"status of run {namespace}/{name}", read_modify_write, also=_Conflict)


@dataclass(frozen=True)
class Cancel:
    """Someone asked for the run to stop (:data:`..constants.ANNOTATION_CANCEL`): why, and who if known."""

    reason: str
    by: str | None = None

    @property
    def message(self) -> str:
        """What the run's status and Events say: ``cancelled by alice: wrong input``."""
        who = f" by {self.by}" if self.by else ""
        return f"cancelled{who}: {self.reason}" if self.reason else f"cancelled{who}"


def cancel_of(run: dict[str, Any] | None) -> Cancel | None:
    """The cancel asked for on the run's object, if any (an empty reason is a cancel all the same)."""
    annotations = ((run or {}).get("metadata") or {}).get("annotations") or {}
    if ANNOTATION_CANCEL not in annotations:
        return None
    reason = " ".join(str(annotations[ANNOTATION_CANCEL] or "").split())
    by = " ".join(str(annotations.get(ANNOTATION_CANCEL_BY) or "").split()) or None
    return Cancel(reason, by)


async def record_skipped(
    kube: Kube, spec: JobSpec, slot: int, reason: str, cause: Cause = Cause.SCHEDULE, *, instance: str
) -> None:
    """A Skipped slot gets its own AnarchonRun, so history shows why nothing ran; its status
    names the ``instance`` that wrote it, as a run's names the replica of its attempt (the other
    replicas learn from such writes who is still at work: see :mod:`.listener`).

    Its create and its status go in one API turn: under overload, its status queued again
    behind everything else left the run without a phase for that long (mending took it for an
    open run the store had ended, and wrote it too).
    """
    async with turn():
        body = await ensure_run(kube, spec, slot, cause)
        await update_status(
            kube,
            spec.namespace,
            body["metadata"]["name"],
            0,
            lambda s: slot_skipped(s, message=reason, instance=instance),
            in_hand=InHand(body),  # as created (or read): written without another read
        )


async def list_runs(kube: Kube, namespace: str, job: str) -> list[dict[str, Any]]:
    listing = await call(
        f"listing runs of {namespace}/{job}",
        lambda: kube.request("GET", path(RUNS, namespace), params={"labelSelector": f"{LABEL_JOB}={job}"}),
    )
    items = list(listing.get("items") or [])
    items.sort(key=lambda r: int((r.get("spec") or {}).get("slot") or 0))
    return items


async def delete_run(kube: Kube, namespace: str, name: str) -> None:
    try:
        await call(
            f"deleting run {namespace}/{name}",
            lambda: kube.request("DELETE", path(RUNS, namespace, name), params={"propagationPolicy": "Background"}),
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
