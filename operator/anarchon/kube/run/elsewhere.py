"""The runs of a shared job that ran in another cluster, shown here too: a light AnarchonRun each.

A job shared between clusters (``spec.sharedName``) runs each slot in one cluster only: there
its runner writes the AnarchonRun and launches the Pod. Every other cluster shows the run too,
so that ``kubectl get anarchonruns``, the CLI and the job's status tell the whole history
wherever one looks: an AnarchonRun whose status names the cluster it ran in (``status.cluster``,
the Cluster column of ``-o wide``; no label, as a run may move: see below) and follows the
store's record of the run (phase, attempts, instance, message: :func:`.runstatus.elsewhere`).
It has no Pod, and no runner here: its phase moves when the record does, at the next look.

Each replica looks at its shared jobs' newest store records at every check of the shared specs
(:mod:`.shared`), so a run shows here within about a check of its start and of its end. The
guards are those of mending runs without an object (:mod:`.mend`): a run the watch saw deleted
(by hand, or by the history limits) stays gone, and so does one the limits would delete at
once or older than every object of the job.

A run this cluster ran (its object has no ``status.cluster``) is left to its runner and to
mending, unless the store says a later attempt took it over in another cluster: this cluster
was lost (every replica gone, or its API server out of their reach) for a lease and more, and
is back. Then its Pods of the run that still live are stale (launched by an attempt fenced off
since, with a smaller fencing token): they are deleted, and the object becomes the light run
of the cluster that has the run now. The other way, a light run here becomes this cluster's
own when a replica here relaunches it (:func:`.run.runstatus.start_attempt`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from ...engine import LeaseBackend, Run, RunState
from ...engine.schedule import slots_between
from ..api.client import Kube
from ..job.spec import JobSpec, run_name
from . import record, runstatus
from .mend import MISSING_LOOK_EXTRA, MISSING_LOOK_MAX, elsewhere_of, open_run, past_limits
from .pods import PodFate, delete_pod, fate_of, pods_of_run

log = logging.getLogger("anarchon.kube.run.elsewhere")


async def mirror_elsewhere(
    kube: Kube,
    backend: LeaseBackend,
    spec: JobSpec,
    here: str,
    items: Sequence[dict[str, Any]],
    *,
    now_ms: int,
    look_back_ms: int,
    deleted: Callable[[str, str], bool] = lambda namespace, name: False,
) -> list[str]:
    """Write, from the store's records, the runs of ``spec``'s job that ran in other clusters; their names.

    ``items`` are the job's objects here; ``look_back_ms`` how far back to look (more than the
    time between two looks).
    """
    by_slot = {int(i["spec"]["slot"]): i for i in items}
    phases = [(slot, runstatus.RunStatus.of(i.get("status")).phase) for slot, i in by_slot.items()]
    window = slots_between(spec.schedule, now_ms - look_back_ms, now_ms)
    look = min(MISSING_LOOK_MAX, MISSING_LOOK_EXTRA + sum(1 for _ in islice(window, MISSING_LOOK_MAX)))
    records = await backend.history(spec.key, look)
    # This cluster's open runs older than the look (it was away a while): did they move?
    looked = {run.slot for run in records}
    lease_ms = spec.options.effective_lease_ms
    for slot, obj in by_slot.items():
        status = runstatus.RunStatus.of(obj.get("status"))
        ours = status.phase is not None and status.cluster is None and open_run(obj)
        if ours and slot not in looked and now_ms - slot >= lease_ms and (run := await backend.get_run(spec.key, slot)):
            records.append(run)
    written = []
    for run in records:
        there = elsewhere_of(run, here)
        if there is None or run.state is RunState.SKIPPED:
            continue  # ran here, or skipped (whoever is told so writes it, in every cluster)
        name = run_name(spec.name, run.slot)
        item = by_slot.get(run.slot)
        if item is None:
            if (by_slot and run.slot < min(by_slot)) or deleted(spec.namespace, name):
                continue
            if not run.state.active and past_limits(spec, phases, run):
                continue
            item = await record.ensure_run(kube, spec, run.slot, record.cause_guess(spec, run.slot))
        status = runstatus.RunStatus.of(item.get("status"))
        if status.phase is not None and status.cluster is None:
            if (status.attempt or 0) >= run.attempt:
                continue  # this cluster's own object of the run: its runner, or mending, writes it
            await _moved(kube, spec.namespace, name, there)
        elif runstatus.elsewhere(item.get("status") or {}, run=run, cluster=there) is None:
            continue  # says so already

        def change(s: runstatus.Status, run: Run = run, there: str = there) -> runstatus.Status | None:
            return runstatus.elsewhere(s, run=run, cluster=there)

        if await record.update_status(kube, spec.namespace, name, run.attempt, change):
            written.append(name)
    if written:
        log.info("%s: runs of other clusters shown here: %s", spec.engine_name, ", ".join(written))
    return written


async def _moved(kube: Kube, namespace: str, name: str, there: str) -> None:
    """The run moved: it was relaunched in cluster ``there`` while this one was lost. Its Pods here
    were launched by an attempt fenced off since (a smaller fencing token): those still live go."""
    for pod in await pods_of_run(kube, namespace, name):
        if fate_of(pod).fate is PodFate.LIVE:
            log.warning("%s: relaunched in cluster %s: deleting its stale Pod here", name, there)
            await delete_pod(kube, namespace, pod["metadata"]["name"])
