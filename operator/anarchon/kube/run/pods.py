"""The Pods of a run: building them from the template, finding them again, reading their fate.

A run's Pods carry the label ``anarchon.io/run=<run>``, so any replica can find them from
the run's name alone: that is what makes adoption possible after the runner died.
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..api.client import ApiException, Kube, call, path
from ..constants import (
    ANNOTATION_INSTANCE,
    ANNOTATION_SCHEDULED_AT,
    API_VERSION,
    LABEL_ATTEMPT,
    LABEL_FOLLOWER,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_RUN,
    LABEL_SLOT,
    LABEL_TRY,
    MANAGED_BY,
    MERGE,
    RUN_KIND,
)
from ..job.spec import JobSpec, slot_time
from .workload import run_env, with_run_env

#: Failure reasons that say the Pod was lost rather than that its work failed.
LOST_REASONS = frozenset({"Evicted", "NodeLost", "Preempting", "Shutdown", "Terminated", "NodeShutdown"})


#: What a label value may be (at most 63 characters).
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def follower_label(instance: str) -> str:
    """The :data:`LABEL_FOLLOWER` value of a replica: its instance id, made a valid label value.

    The chart's instance ids (Pod names) are valid as they are. Others (the default
    ``hostname:pid``) keep their readable characters and gain a digest of the whole id, so
    two instances never share a value.
    """
    if _LABEL_VALUE.fullmatch(instance):
        return instance
    digest = hashlib.sha256(instance.encode()).hexdigest()[:12]
    readable = re.sub(r"[^-A-Za-z0-9_.]", "-", instance)[:50].strip("-_.")
    return f"{readable}-{digest}" if readable else digest


def follower_of(pod: dict[str, Any] | None) -> str | None:
    """The :data:`LABEL_FOLLOWER` value the Pod carries (None: none, e.g. launched by an older version)."""
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_FOLLOWER)
    return None if value is None else str(value)


class PodFate(StrEnum):
    LIVE = "Live"  # Pending or Running: the attempt is alive
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"  # the work failed (exit code != 0, deadline exceeded)
    LOST = "Lost"  # ended without running to its end (evicted, node shut down): interrupted, not failed
    # Being deleted, or its node stopped reporting (phase Unknown): its containers may still
    # run, so no other Pod of the run may start until it is gone. Never force-deleted.
    LINGERING = "Lingering"
    GONE = "Gone"  # no such Pod


@dataclass(frozen=True)
class PodView:
    name: str
    fate: PodFate
    message: str
    body: dict[str, Any] | None = None


def fate_of(pod: dict[str, Any] | None) -> PodView:
    """Classify a Pod (as a dict from the API) for the run state machine."""
    if pod is None:
        return PodView("", PodFate.GONE, "the Pod is gone")
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name", ""))
    phase = status.get("phase") or "Pending"
    reason = status.get("reason") or ""
    if phase == "Succeeded":
        return PodView(name, PodFate.SUCCEEDED, "the Pod succeeded", pod)
    if phase == "Failed":
        if reason in LOST_REASONS:
            return PodView(name, PodFate.LOST, f"the Pod was lost ({reason}): {status.get('message', '')}".strip(), pod)
        return PodView(name, PodFate.FAILED, _failure_message(status), pod)
    if phase == "Unknown":
        return PodView(name, PodFate.LINGERING, "the Pod's node stopped reporting (phase Unknown)", pod)
    if meta.get("deletionTimestamp"):
        return PodView(name, PodFate.LINGERING, "the Pod is being deleted", pod)
    return PodView(name, PodFate.LIVE, f"the Pod is {phase}", pod)


#: Waiting reasons of a Pod that is on its way: not worth a word on the run.
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})


@dataclass(frozen=True)
class Waiting:
    """Why a Pending Pod does not start, in the Pod's own words."""

    reason: str
    message: str


def waiting_of(pod: dict[str, Any] | None) -> Waiting | None:
    """Why a Pending Pod waits, if it says: not scheduled (Unschedulable: no node fits), or a
    container that cannot start (ErrImagePull, ImagePullBackOff, CreateContainerConfigError...).

    None for a Pod that is not Pending, or that is only on its way (being created).
    """
    if pod is None:
        return None
    status = pod.get("status") or {}
    if (status.get("phase") or "Pending") != "Pending" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return Waiting(str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or ""))
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason and reason not in STARTING_REASONS:
            return Waiting(reason, f"container {cs.get('name')}: {waiting.get('message') or reason}")
    return None


def pending_for_s(pod: dict[str, Any] | None, now: datetime) -> float | None:
    """How long a Pending Pod has existed (from its creation, whoever adopted it since); None if not Pending."""
    if pod is None or ((pod.get("status") or {}).get("phase") or "Pending") != "Pending":
        return None
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return None
    since = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    return (now - since).total_seconds()


def running_for_s(pod: dict[str, Any] | None, now: datetime) -> float | None:
    """How long the Pod has run: since its ``status.startTime`` (when its node took it), from
    which its activeDeadlineSeconds counts too; None before that."""
    started = ((pod or {}).get("status") or {}).get("startTime")
    if not started:
        return None
    return (now - datetime.fromisoformat(str(started).replace("Z", "+00:00"))).total_seconds()


def _failure_message(status: dict[str, Any]) -> str:
    if status.get("reason") == "DeadlineExceeded":
        return "the Pod ran past its active deadline (timeout)"
    for cs in status.get("containerStatuses") or []:
        term = ((cs.get("state") or {}).get("terminated")) or {}
        if term and term.get("exitCode", 0) != 0:
            why = f" ({term['reason']})" if term.get("reason") else ""
            return f"container {cs.get('name')} exited with code {term.get('exitCode')}{why}"
    return f"the Pod failed{': ' + status['message'] if status.get('message') else ''}"


def try_of(pod: dict[str, Any]) -> int:
    """The try a Pod of a run is; 1 for a Pod made before retries existed (it has no such label)."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_TRY) or "1"
    return int(value) if str(value).isdigit() and int(value) >= 1 else 1


def build_pod(
    spec: JobSpec,
    *,
    run: str,
    pod: str,
    slot: int,
    attempt: int,
    try_number: int,
    instance: str,
    run_uid: str | None,
) -> dict[str, Any]:
    """The Pod of one try of a run, from the job's template; restartPolicy is always Never.

    Every container, init containers too, is told its run (:mod:`.workload`).
    """
    template = copy.deepcopy(spec.template)
    meta = dict(template.get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    labels.update(
        {
            LABEL_JOB: spec.name,
            LABEL_RUN: run,
            LABEL_SLOT: str(slot),
            LABEL_ATTEMPT: str(attempt),
            LABEL_TRY: str(try_number),
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_FOLLOWER: follower_label(instance),
        }
    )
    annotations = dict(meta.get("annotations") or {})
    annotations[ANNOTATION_SCHEDULED_AT] = slot_time(slot)
    annotations[ANNOTATION_INSTANCE] = instance
    body_meta: dict[str, Any] = {"name": pod, "namespace": spec.namespace, "labels": labels, "annotations": annotations}
    if run_uid:
        body_meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": RUN_KIND,
                "name": run,
                "uid": run_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    pod_spec = dict(template.get("spec") or {})
    pod_spec["restartPolicy"] = "Never"
    env = run_env(job=spec.name, run=run, slot_ms=slot, attempt=attempt, try_number=try_number)
    for key in ("initContainers", "containers"):
        if pod_spec.get(key):
            pod_spec[key] = [with_run_env(c, env) for c in pod_spec[key]]
    if spec.timeout_ms and "activeDeadlineSeconds" not in pod_spec:
        pod_spec["activeDeadlineSeconds"] = max(1, -(-spec.timeout_ms // 1000))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": body_meta, "spec": pod_spec}


def run_of(pod: dict[str, Any]) -> str:
    """The run a Pod belongs to (its label)."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN) or "")


async def pods_of_run(kube: Kube, namespace: str, run: str) -> list[dict[str, Any]]:
    """Every Pod of a run, oldest try first, and within a try oldest attempt first."""
    listing = await call(
        f"listing Pods of run {namespace}/{run}",
        lambda: kube.request("GET", path("pods", namespace), params={"labelSelector": f"{LABEL_RUN}={run}"}),
    )
    items: list[dict[str, Any]] = list(listing.get("items") or [])
    items.sort(
        key=lambda p: (try_of(p), int(((p.get("metadata") or {}).get("labels") or {}).get(LABEL_ATTEMPT, "0") or 0))
    )
    return items


async def read_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        pod: dict[str, Any] = await call(
            f"reading Pod {namespace}/{name}",
            lambda: kube.request("GET", path("pods", namespace, name)),
        )
        return pod
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def follow_pod(kube: Kube, namespace: str, name: str, follower: str) -> dict[str, Any] | None:
    """Label the Pod as followed by ``follower`` (an adopting replica's :func:`follower_label`):
    from then on that replica's Pod watch delivers its changes. The Pod as patched; None if gone.

    Sent once, not retried: the runner polls the Pod meanwhile and tries again at its next look
    (a patch whose reply was lost then sets the same label a second time).
    """
    try:
        pod: dict[str, Any] = await call(
            f"labelling Pod {namespace}/{name} as followed by {follower}",
            lambda: kube.request(
                "PATCH",
                path("pods", namespace, name),
                {"metadata": {"labels": {LABEL_FOLLOWER: follower}}},
                content_type=MERGE,
            ),
            retry_for_ms=0,
        )
        return pod
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def create_pod(kube: Kube, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Create the Pod; ``(pod, created)``. AlreadyExists means it was launched before: not again.

    A create whose reply was lost is retried and answered AlreadyExists: ``created`` is then
    False although this very call made the Pod. Callers treat both alike (the Pod name is the
    attempt's own), so that is harmless.
    """
    namespace = body["metadata"]["namespace"]
    name = body["metadata"]["name"]
    try:
        created: dict[str, Any] = await call(
            f"creating Pod {namespace}/{name}",
            lambda: kube.request("POST", path("pods", namespace), body),
        )
        return created, True
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = await read_pod(kube, namespace, name)
    return (existing or body), False


async def delete_pod(
    kube: Kube, namespace: str, name: str, *, grace_seconds: int | None = None, if_version: str | None = None
) -> bool:
    """Delete the Pod (gone already counts); False if ``if_version`` no longer matches (it changed)."""
    # Everything in the body (DeleteOptions): with a body, the API server ignores the query's
    # gracePeriodSeconds, so a grace sent beside a precondition was silently the Pod's default.
    body: dict[str, Any] = {}
    if grace_seconds is not None:
        body["gracePeriodSeconds"] = grace_seconds
    if if_version is not None:
        body["preconditions"] = {"resourceVersion": if_version}

    try:
        where = path("pods", namespace, name)
        await call(f"deleting Pod {namespace}/{name}", lambda: kube.request("DELETE", where, body or None))
    except ApiException as exc:
        if exc.status == 409 and if_version is not None:
            return False
        if exc.status != 404:
            raise
    return True
