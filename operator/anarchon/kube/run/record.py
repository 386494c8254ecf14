"""AnarchonRun objects: one per run (job + slot), what ``kubectl get anarchonruns`` shows.

The store decides who runs what; the AnarchonRun mirrors it for people. Its status is
written with optimistic concurrency and an attempt guard: a write from attempt N is refused
once attempt N+1 has written, so a runner that froze and woke up cannot overwrite the
status of the attempt that replaced it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..client import ApiException, Kube, call, path, turn
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
from ..spec import JobSpec, run_name, slot_time

Status = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_body(spec: JobSpec, job_uid: str, slot: int, trigger: str) -> dict[str, Any]:
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
        "spec": {"job": spec.name, "slot": slot, "slotTime": slot_time(slot), "trigger": trigger},
    }


def history_kinds(spec: JobSpec) -> list[tuple[tuple[str, ...], int]]:
    """The kinds of ended runs the history limits keep apart (their phases), and how many of each.

    Skipped runs have a kind of their own: a long job on a short period skips many slots, and
    they must not push the successful runs out of the history.
    """
    return [
        (("Succeeded",), spec.successful_history),
        (("Skipped",), spec.successful_history),
        (("Failed", "Interrupted", "Cancelled"), spec.failed_history),
    ]


def ran_at(run: Mapping[str, Any]) -> tuple[str, int]:
    """When a run ran, for the history limits' order: its start, or (a Skipped run, one that
    never started) its object's creation, at the claim; then its slot, between equal seconds.

    Both are RFC3339 UTC to the second, so their text sorts as their time.
    """
    status = run.get("status") or {}
    when = status.get("startTime") or (run.get("metadata") or {}).get("creationTimestamp") or ""
    return str(when), int((run.get("spec") or {}).get("slot") or 0)


def trigger_guess(spec: JobSpec, slot: int) -> str:
    """What started a run whose object is written by someone who does not know: a slot of the
    schedule was scheduled, any other slot was a manual trigger (or a backfill)."""
    return "Schedule" if spec.schedule.next_after(slot - 1) == slot else "Manual"


async def ensure_run(kube: Kube, spec: JobSpec, slot: int, trigger: str) -> dict[str, Any]:
    """Create the run's object, or return the existing one (every replica may try).

    Safe to retry: a create whose reply was lost is found again by the 409 of the next try.
    """
    body = run_body(spec, spec.uid, slot, trigger)
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
        if int(status.get("attempt") or 0) > attempt:
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


#: The run's condition that says its current Pod is Pending, and why.
POD_PENDING = "PodPending"
#: The run's ``status.reason`` when its Pod stayed Pending past the job's ``pendingTimeout``.
PENDING_TIMEOUT = "PendingTimeout"
#: The run's ``status.reason`` when its try's Pod ran past the job's ``timeout`` (as the kubelet says it).
DEADLINE_EXCEEDED = "DeadlineExceeded"


def _pending_condition(status: Status, pending: bool, reason: str, message: str) -> None:
    """Set the PodPending condition; its transition time moves only when its status does."""
    conditions = list(status.get("conditions") or [])
    old = next((c for c in conditions if c.get("type") == POD_PENDING), None)
    value = "True" if pending else "False"
    since = old["lastTransitionTime"] if old and old.get("status") == value else now_rfc3339()
    conditions = [c for c in conditions if c.get("type") != POD_PENDING]
    conditions.append(
        {"type": POD_PENDING, "status": value, "reason": reason, "message": message[:2000], "lastTransitionTime": since}
    )
    status["conditions"] = conditions


def pod_pending(status: Status, *, attempt: int, reason: str, message: str) -> Status | None:
    """The attempt's Pod is Pending and says why: the run shows it (reason, message, condition)."""
    if int(status.get("attempt") or 0) != attempt or status.get("phase") != "Running":
        return None  # not this attempt's run any more, or it ended meanwhile
    if status.get("reason") == reason and status.get("message") == message:
        return None
    status.update(reason=reason, message=message)
    _pending_condition(status, True, reason, message)
    return status


def pod_started(status: Status, *, attempt: int, message: str) -> Status | None:
    """The attempt's Pod left Pending: what held it is no longer said."""
    if int(status.get("attempt") or 0) != attempt or "reason" not in status:
        return None
    status.pop("reason")
    status["message"] = ""
    _pending_condition(status, False, "Started", message)
    return status


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _close_try(status: Status, try_number: int, outcome: str, message: str, now: str) -> None:
    for entry in status.get("tries") or []:
        if int(entry.get("try", 0)) == try_number and entry.get("outcome") == "Running":
            entry.update(outcome=outcome, finishTime=now, message=message)


def _close_open_attempts(attempts: list[dict[str, Any]], now: str) -> None:
    """Earlier attempts still open (their runner died or handed over) ended Interrupted: a later one took over."""
    for previous in attempts:
        if not previous.get("outcome") or previous.get("outcome") == "Running":
            previous["outcome"] = "Interrupted"
            previous.setdefault("finishTime", now)


def _count_takeovers(status: Status) -> None:
    status["takeovers"] = sum(1 for a in status.get("attempts") or [] if a.get("adopted"))


def launches_before(status: Status, attempt: int, pod: str) -> int:
    """How often attempts before ``attempt`` launched ``pod`` (a try's one Pod): what maxAttempts bounds.

    Only attempts that recorded a launch of that Pod count: one that adopted a live Pod, found
    it ended, or broke off before its start was recorded launched nothing, and the first Pod of
    a new try (after a failed one, which retries bound) is another Pod.
    """
    return sum(
        1
        for a in status.get("attempts") or []
        if int(a.get("attempt", 0)) < attempt and a.get("launched") and a.get("podName") == pod
    )


#: The phases that end a run whatever else its status says (Interrupted ends it only with a finish time).
FINAL_PHASES = frozenset({"Succeeded", "Failed", "Skipped", "Cancelled"})


class RunEnded(Exception):
    """The run's object says it is over: an attempt must not start (or reopen) it."""


def ended(status: Status) -> bool:
    """The status says how the run ended: a final phase, or Interrupted with a finish time."""
    phase = status.get("phase")
    return phase in FINAL_PHASES or (phase == "Interrupted" and bool(status.get("finishTime")))


def start_attempt(
    status: Status, *, attempt: int, instance: str, pod: str, try_number: int = 1, adopted: bool = False
) -> Status:
    """Attempt ``attempt`` follows ``pod``, the Pod of try ``try_number``: launched, or ``adopted``
    from an earlier attempt (a takeover, which ``status.takeovers`` counts and maxAttempts does not).

    Raises :class:`RunEnded` if the run has ended meanwhile (replaced by a newer run, given
    up): a start that was held up by API errors must not bring an ended run back to Running.
    """
    if ended(status):
        raise RunEnded(f"the run ended {status.get('phase')}: {status.get('message') or ''}".rstrip(": "))
    now = now_rfc3339()
    attempts = [a for a in status.get("attempts") or [] if int(a.get("attempt", 0)) != attempt]
    _close_open_attempts(attempts, now)
    entry_of_attempt: dict[str, Any] = {
        "attempt": attempt,
        "instance": instance,
        "podName": pod,
        "outcome": "Running",
        "startTime": now,
    }
    entry_of_attempt["adopted" if adopted else "launched"] = True
    attempts.append(entry_of_attempt)
    status.update(phase="Running", attempt=attempt, instance=instance, podName=pod, attempts=attempts, message="")
    _count_takeovers(status)
    status.setdefault("startTime", now)
    tries = list(status.get("tries") or [])
    entry = next((t for t in tries if int(t.get("try", 0)) == try_number), None)
    if entry is None:
        tries.append({"try": try_number, "podName": pod, "outcome": "Running", "startTime": now})
    else:  # adopted by a later attempt: the same try goes on
        entry.update(podName=pod, outcome="Running")
    status.update(tries=tries, **{"try": try_number})
    status.pop("nextTryTime", None)
    # A new Pod, or one adopted: what held an earlier attempt's Pod says nothing about it yet.
    status.pop("reason", None)
    if "conditions" in status:
        status["conditions"] = [c for c in status["conditions"] if c.get("type") != POD_PENDING]
    return status


def try_failed(status: Status, *, try_number: int, message: str, next_try_at: datetime, next_pod: str) -> Status | None:
    """Try ``try_number`` failed and the run gets another: the next try, and when it starts.

    The run stays Running. ``try`` and ``nextTryTime`` are what a backup that takes the run
    over during the backoff reads: it launches the next try, at that time, not the failed
    one again. Written once: a repeat (a lost reply) finds the try already counted.
    """
    if int(status.get("try") or 1) > try_number:
        return None
    now = now_rfc3339()
    _close_try(status, try_number, "Failed", message, now)
    at = rfc3339(next_try_at)
    status.update(
        {
            "try": try_number + 1,
            "nextTryTime": at,
            "podName": "",
            "message": f"try {try_number} failed: {message}; try {try_number + 1} (Pod {next_pod}) at {at}",
        }
    )
    status.pop("reason", None)
    if any(c.get("type") == POD_PENDING and c.get("status") == "True" for c in status.get("conditions") or []):
        _pending_condition(status, False, "TryFailed", message)
    return status


def try_past_deadline(status: Status, try_number: int, timeout_ms: int | None, now: datetime) -> bool:
    """Whether try ``try_number`` was launched more than ``timeout_ms`` before ``now``: its Pod,
    gone, was stopped for its deadline (or would have been), and is not launched again."""
    entry = next((t for t in status.get("tries") or [] if int(t.get("try", 0)) == try_number), None)
    if timeout_ms is None or entry is None or not entry.get("startTime"):
        return False
    started = datetime.fromisoformat(str(entry["startTime"]).replace("Z", "+00:00"))
    return (now - started).total_seconds() * 1000 > timeout_ms


def next_try_time(status: Status, try_number: int) -> datetime | None:
    """When try ``try_number`` may launch its Pod (the backoff after the try before); None: at once."""
    at = status.get("nextTryTime")
    if not at or int(status.get("try") or 1) != try_number:
        return None
    return datetime.fromisoformat(str(at).replace("Z", "+00:00"))


def end_attempt(
    status: Status,
    *,
    attempt: int,
    outcome: str,
    message: str,
    final: bool,
    reason: str | None = None,
    instance: str | None = None,
    failed_try: str | None = None,
) -> Status:
    """The attempt ended; ``final``: so did the run, and its current try with it.

    Not final (the Pod was lost), the try stays open: the next attempt takes it up.
    An attempt that never recorded its start (it found its Pod already ended: the runner
    before it died after the launch) records itself here, given its ``instance``: otherwise
    the run would end with its history saying the dead runner's attempt is still Running.
    ``failed_try``: the current try's Pod had failed on its own first (the run ended otherwise
    before its retry: a cancel), so the try says Failed, with this message. A run that ends in
    a backoff announces no next try any more: its try is the last one that ran.
    """
    now = now_rfc3339()
    entries = list(status.get("attempts") or [])
    if instance is not None and not any(int(e.get("attempt", 0)) == attempt for e in entries):
        _close_open_attempts(entries, now)
        entries.append({"attempt": attempt, "instance": instance, "podName": status.get("podName"), "startTime": now})
        status.update(attempts=entries, attempt=attempt, instance=instance)
    if failed_try is not None:
        _close_try(status, int(status.get("try") or 1), "Failed", failed_try, now)
    if final:
        tries = [int(t.get("try", 0)) for t in status.get("tries") or []]
        if tries and int(status.get("try") or 1) not in tries:  # ended in the backoff: that try never ran
            status["try"] = max(tries)
        status.pop("nextTryTime", None)
        _close_try(status, int(status.get("try") or 1), outcome, message, now)
    for entry in status.get("attempts") or []:
        if int(entry.get("attempt", 0)) == attempt:
            entry.update(outcome=outcome, finishTime=now, message=message)
    status["message"] = message
    if reason is not None:
        status["reason"] = reason
    else:
        status.pop("reason", None)
    if any(c.get("type") == POD_PENDING and c.get("status") == "True" for c in status.get("conditions") or []):
        _pending_condition(status, False, reason or outcome, message)
    if final:
        status["phase"] = outcome
        status["finishTime"] = now
    else:
        status["phase"] = "Interrupted"
    return status


def skipped(status: Status, *, message: str, instance: str) -> Status | None:
    """The run was claimed but must not start (an earlier run's Pod is live): it ends Skipped."""
    if ended(status):
        return None
    status.update(phase="Skipped", message=message, attempt=0, instance=instance, finishTime=now_rfc3339())
    return status


def interrupted(status: Status, *, message: str) -> Status | None:
    """The store ended the run as Interrupted (replaced by a newer run): unless it ended already.

    A finish time alone does not make it ended: a status that an older operator reopened
    (Running, with the finish time of its end) is closed again, not left open for ever.
    """
    if ended(status):
        return None
    now = now_rfc3339()
    _close_try(status, int(status.get("try") or 1), "Interrupted", message, now)
    status.update(phase="Interrupted", message=message, finishTime=now)
    return status


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


async def record_given_up(kube: Kube, spec: JobSpec, slot: int, attempt: int, message: str) -> bool:
    """The store ended the run after its last attempt: its object says so, with a finish time.

    Written by the backup that found no attempt left, not by the runner (which may be dead):
    the attempt guard is the last attempt's number, so only a stale write of an older attempt
    is refused. The last attempt's Pod, if it still lives, is left alone; it goes with the run.
    """
    return await update_status(
        kube,
        spec.namespace,
        run_name(spec.name, slot),
        attempt,
        lambda s: end_attempt(s, attempt=attempt, outcome="Interrupted", message=message, final=True),
    )


async def record_skipped(
    kube: Kube, spec: JobSpec, slot: int, reason: str, trigger: str = "Schedule", *, instance: str
) -> None:
    """A Skipped slot gets its own AnarchonRun, so history shows why nothing ran; its status
    names the ``instance`` that wrote it, as a run's names the replica of its attempt (the other
    replicas learn from such writes who is still at work: see :mod:`..listener`).

    Its create and its status go in one API turn: under overload, its status queued again
    behind everything else left the run without a phase for that long (mending took it for an
    open run the store had ended, and wrote it too).
    """
    async with turn():
        body = await ensure_run(kube, spec, slot, trigger)
        await update_status(
            kube,
            spec.namespace,
            body["metadata"]["name"],
            0,
            lambda s: (
                None
                if s.get("phase")
                else {**s, "phase": "Skipped", "message": reason, "attempt": 0, "instance": instance}
            ),
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
