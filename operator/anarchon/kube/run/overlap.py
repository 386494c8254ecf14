"""Overlap Skip and Replace, as the winner of a new run applies them to the job's other runs."""

from __future__ import annotations

import logging

from ...engine import Overlap, RunSkipped
from . import record, runstatus
from .held import Held
from .pods import PodFate, fate_of, pods_of_run, run_of
from .replaced import end_replaced

log = logging.getLogger("anarchon.kube.run.overlap")


async def replace(held: Held, old: str) -> None:
    """Overlap Replace, by the new run's winner: the older run's Pods go, its object says why.

    The older run's own runner does the same when the store tells it it was replaced, so
    neither dying half-way leaves the old Pod running. Best effort here: the new run
    does not fail because the old one could not be cleaned up.
    """
    spec, new = held.spec, held.name
    message = f"replaced by the run of {new}"
    try:
        pods = [p["metadata"]["name"] for p in await pods_of_run(held.kube, spec.namespace, old)]
        await end_replaced(held.kube, spec.namespace, old, pods, message)
    except Exception as exc:
        log.warning("cleaning up %s, replaced by %s, failed: %s", old, new, exc)
        return
    await held.events.about(spec, reason="Replaced", message=f"run {old} {message}")


async def overlap_in_kubernetes(held: Held) -> None:
    """Overlap Skip and Replace by what runs, not only by what the store remembers.

    A store that lost its state (or a run it ended while its Pod lived on) lets a new slot be
    claimed beside a live Pod of an earlier run. Skip then ends this run Skipped; Replace
    ends the earlier run first, as it does for the runs the store names.
    """
    ctx, spec, name = held.ctx, held.spec, held.name
    live = await _live_of_other_runs(held)
    if not live:
        return
    if spec.options.overlap is Overlap.REPLACE:
        for other in sorted({run for run, _ in live}):
            await replace(held, other)
        return
    other, pod = live[0]
    message = f"skipped: the run {other} is still active (its Pod {pod} is live)"
    await held.confirm()
    await held.write(lambda s: runstatus.skipped(s, message=message, instance=ctx.instance))
    await held.events.about(spec, reason="Skipped", message=f"run {name}: {message}")
    raise RunSkipped(message)


async def _live_of_other_runs(held: Held) -> list[tuple[str, str]]:
    """Live Pods of the job's other runs, as (run, Pod): those of the runs whose object is open
    (most often none: no request), from the run cache when it is live, else one LIST of runs."""
    spec, name, runs_of = held.spec, held.name, held.wiring.runs_of
    objects = runs_of(spec.namespace, spec.name) if runs_of is not None else None
    if objects is None:
        objects = await record.list_runs(held.kube, spec.namespace, spec.name)
    pods = []
    for obj in objects:
        other = str(obj["metadata"]["name"])
        if other != name and not runstatus.ended(obj.get("status") or {}):
            pods += await pods_of_run(held.kube, spec.namespace, other)
    live = (PodFate.LIVE, PodFate.LINGERING)
    return [(run_of(p), fate_of(p).name) for p in pods if run_of(p) != name and fate_of(p).fate in live]
