"""Mending: an AnarchonRun left open after the store ended its run is made to say how it ended.

A run ends in the store before its object says so whenever its runner is not the one ending
it: overlap Replace (the newer run's claim ends the older run) and giving up (a backup finds
no attempt left). The replica that made that change writes the object next. If it dies in
between, or the API server refuses it for longer than the retries last, nobody else would:
no runner holds the run any more, and no backup takes over a run the store has ended. The
object would say Running for ever; a replaced run's Pod would run on beside its successor.

So every status refresh of a job looks over its open runs (the ones no attempt of this
replica runs) and asks the store about each: a run the store ended more than a lease ago
(whoever ended it has had its chance to write) gets the store's verdict on its object, and a
replaced run's live Pods are deleted first. The writes are idempotent and guarded like any
other, so replicas doing this at once agree.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..engine import LeaseBackend, RunState, Scheduler
from ..engine.model import REPLACED_BY, Run
from . import runs
from .client import Kube
from .pods import pods_of_run
from .runner import end_replaced
from .spec import JobSpec, engine_key

log = logging.getLogger("anarchon.kube.mend")


def open_run(item: dict[str, Any]) -> bool:
    """The object does not say the run is over: it runs, waits between attempts, or has no status
    yet (its creator died between the create and the first status write)."""
    return not runs.ended(item.get("status") or {})


async def mend_runs(kube: Kube, scheduler: Scheduler, spec: JobSpec, items: Sequence[dict[str, Any]]) -> list[str]:
    """Close the open objects among ``items`` whose run the store ended a while ago; their names."""
    backend = scheduler.backend
    key = engine_key(spec.namespace, spec.name, spec.uid)
    loop = scheduler.jobs.get(key)
    if not isinstance(backend, LeaseBackend) or loop is None:
        return []  # a claim-only store ends nothing on its own; a job we do not run is not ours to mend
    mine = set(loop.running_slots)
    grace_ms = loop.options.lease_ms
    mended = []
    for item in items:
        slot = int(item["spec"]["slot"])
        if slot in mine or not open_run(item):
            continue
        run = await backend.get_run(key, slot)
        if run is None or run.state.active or scheduler.clock.now_ms() - run.updated_ms < grace_ms:
            continue
        name = item["metadata"]["name"]
        await _close(kube, spec, name, run)
        mended.append(name)
    return mended


async def _close(kube: Kube, spec: JobSpec, name: str, run: Run) -> None:
    phase = str(run.state)  # the engine's words are the AnarchonRun's phases
    message = run.error or f"ended in the store as {phase}"
    log.warning("run %s is open but its run ended in the store (%s): closing it", name, message)
    if run.state is RunState.INTERRUPTED and message.startswith(REPLACED_BY):
        pods = [p["metadata"]["name"] for p in await pods_of_run(kube, spec.namespace, name)]
        await end_replaced(kube, spec.namespace, name, pods, message)
        return
    await runs.update_status(
        kube,
        spec.namespace,
        name,
        run.attempt,
        lambda s: runs.end_attempt(s, attempt=run.attempt, outcome=phase, message=message, final=True),
    )
