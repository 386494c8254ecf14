"""Ending a run the store ended while its Pod may live: its live Pods go, then its object says how it ended.

A replaced run (overlap Replace) is ended so by its own runner when the store tells it it was
replaced, by the newer run's winner (:mod:`.overlap`), and by mending (:mod:`..mend`) when
both died half-way; a run the store gave up (:data:`~anarchon.engine.limits.MAX_TAKEOVERS`
takeovers) by the backup that found no attempt left, or by mending. So it is safe to repeat,
and to run on several replicas at once. No run says Interrupted while its Pod runs on.
"""

from __future__ import annotations

from ...engine import RunState
from ..client import Kube
from ..pods import PodFate, PodView, delete_pod, fate_of, pods_of_run, read_pod, try_of
from . import record

#: What a run's object says when its own runner ends it for a newer run.
REPLACED_BY_NEWER = "replaced by a newer run (overlap Replace)"


async def end_replaced(
    kube: Kube, namespace: str, name: str, pods: list[str], message: str, *, then: str = "replaced by a newer run"
) -> str | None:
    """The run was replaced (final in the store): its live Pods go, its object says how it ended.

    A Pod that already ended keeps its outcome: the run is then Succeeded or Failed, as its
    Pod was (the newest Pod, of the run's current try: ``pods`` come oldest try first). Each
    delete is conditional on the version of the Pod we read, so a Pod that ends between our
    read and our delete is not taken for interrupted; and it has no grace period, so the Pod
    cannot go on to end Succeeded after its run was recorded Interrupted (the kubelet still
    stops its containers with SIGTERM, then SIGKILL). Returns the Pod's outcome, if one
    ended. Safe to repeat, and to run on several replicas at once.
    """
    last: PodView | None = None  # how the newest of them (the current try's) had ended, if it had
    for pod in pods:
        last = await _stop_pod(kube, namespace, pod)
    tried = 0 if last is None else try_of(last.body or {})

    def change(s: record.Status) -> record.Status | None:
        # An earlier try's failed Pod is not the run's outcome: a run replaced while it waited
        # out a backoff (its next try had no Pod yet) was interrupted, not failed.
        run = record.RunStatus.of(s)
        if last is None or tried < run.current_try:
            return record.interrupted(s, message=message)
        why = f"{last.message} (then {then})"
        outcome = RunState.SUCCEEDED if last.fate is PodFate.SUCCEEDED else RunState.FAILED
        return record.end_attempt(s, attempt=run.attempt or 1, outcome=outcome, message=why, final=True)

    # Whatever attempt wrote last: the store has already ended the run.
    await record.update_status(kube, namespace, name, 10**6, change)
    return None if last is None else str(last.fate)


async def end_given_up(kube: Kube, namespace: str, name: str, message: str) -> str | None:
    """The store gave the run up: as a replaced run, its live Pods go before its object says so."""
    pods = [p["metadata"]["name"] for p in await pods_of_run(kube, namespace, name)]
    return await end_replaced(kube, namespace, name, pods, message, then="given up")


async def _stop_pod(kube: Kube, namespace: str, pod: str) -> PodView | None:
    """Delete a live Pod of a replaced run; the Pod's view if it had ended instead."""
    while True:
        view = fate_of(await read_pod(kube, namespace, pod))
        if view.fate in (PodFate.SUCCEEDED, PodFate.FAILED):
            return view
        if view.body is None:
            return None
        version = str((view.body.get("metadata") or {}).get("resourceVersion") or "")
        if await delete_pod(kube, namespace, pod, grace_seconds=0, if_version=version or None):
            return None
