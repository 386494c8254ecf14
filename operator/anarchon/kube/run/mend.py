"""Mending: an AnarchonRun left open after the store ended its run is made to say how it ended.

A run ends in the store before its object says so whenever its runner is not the one ending
it: overlap Replace (the newer run's claim ends the older run) and giving up (a backup finds
no attempt left). The replica that made that change writes the object next. If it dies in
between, or the API server refuses it for longer than the retries last, nobody else would:
no runner holds the run any more, and no backup takes over a run the store has ended. The
object would say Running for ever; a replaced run's Pod would run on beside its successor.

So every pass of the controller's resync over a job (:class:`Mending`) looks over its open runs
(the ones no attempt of this replica runs) and asks the store about each: a run the store ended
more than a lease ago (whoever ended it has had its chance to write) gets the store's verdict on
its object, and a replaced run's live Pods are deleted first. The writes are idempotent and
guarded like any other, so replicas doing this at once agree. A run the store has no record of
at all (it lost its state) is claimed again once it has been missing for a lease
(:meth:`JobLoop.resume`): its object and its Pods are the record, and the attempt that wins
picks the run up from them.

Some runs never got an object at all: the replica that recorded a Skipped slot died before
writing it, a run was replaced or given up while every attempt had broken off before its
create. The resync also reads, once per period, the job's newest store records (those of
the last two minutes and a lease, and ten more), and gives each one the store ended a lease
ago, with no object, an object of its own with the store's verdict, unless the history
limits would delete it at once (they deleted it before: it is older than every kept run of
its kind), the watch saw its object deleted (by hand, or by the limits), it is older than
every object of the job, or it Succeeded or Failed (its runner created its object first: it
was deleted, maybe before this replica started).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from ...engine import LeaseBackend, RunState, Scheduler
from ...engine.model import REPLACED_BY, Run
from ...engine.schedule import slots_between
from ...engine.shared import cluster_of
from ..api.client import Kube
from ..job.spec import JobSpec, engine_key, ms_of, run_name
from . import record, runstatus
from .pods import pods_of_run
from .replaced import end_given_up, end_replaced

log = logging.getLogger("anarchon.kube.run.mend")


def open_run(item: dict[str, Any]) -> bool:
    """The object does not say the run is over: it runs, waits between attempts, or has no status
    yet (its creator died between the create and the first status write)."""
    return not runstatus.ended(item.get("status") or {})


def claimed_since(item: dict[str, Any]) -> int:
    """Since when the run has been claimed, at the earliest (ms): a run is claimed at its slot at
    the earliest, but a manual run of a slot still to come (``trigger --at`` a later time) is
    claimed when it is asked for, as its object is created; a claim of that slot would
    otherwise be left alone until the slot came."""
    slot = int(item["spec"]["slot"])
    created = ms_of((item.get("metadata") or {}).get("creationTimestamp"))
    return slot if created is None else min(slot, created)


async def mend_runs(kube: Kube, scheduler: Scheduler, spec: JobSpec, items: Sequence[dict[str, Any]]) -> list[str]:
    """Close the open objects among ``items`` whose run the store ended a while ago; their names."""
    backend = scheduler.backend
    key = spec.key
    loop = scheduler.jobs.get(key)
    if not isinstance(backend, LeaseBackend) or loop is None:
        return []  # a claim-only store ends nothing on its own; a job we do not run is not ours to mend
    mine = set(loop.running_slots)
    grace_ms = loop.options.lease_ms
    now = scheduler.clock.now_ms()
    mended = []
    for item in items:
        slot = int(item["spec"]["slot"])
        if slot in mine or not open_run(item) or now - claimed_since(item) < grace_ms:
            # A run claimed less than a lease ago was ended in the store less than a lease ago,
            # if at all, and is left alone below. No store read for it (every resync finds most
            # runs open).
            continue
        run = await backend.get_run(key, slot)
        if run is None:
            # Open here, unknown to the store: it lost its state. Nobody's lease covers the run
            # any more, so no backup would take it over: it is claimed again and picked up.
            if await loop.resume(slot):
                mended.append(item["metadata"]["name"])
            continue
        if run.state.active or scheduler.clock.now_ms() - run.updated_ms < grace_ms:
            continue
        if elsewhere_of(run, cluster_of(scheduler.instance_id)) is not None:
            continue  # moved to another cluster (this one was lost a while): kube/elsewhere.py shows it so
        name = item["metadata"]["name"]
        await _close(kube, spec, name, run)
        mended.append(name)
    return mended


#: How far back a look for runs without an object reaches beyond the grace, at least: more than
#: the time between two looks at a job (see status.JobStatus). A record becomes a candidate a lease after its run
#: ended, and by then a job on `every 1s` has newer records: a look at the newest ten records
#: missed such a Skip in the 20,000-slot chaos soak.
MISSING_LOOK_BACK_MS = 120_000
#: The ends only a runner writes, from its run's Pod (or its object's cancel): it created the run's
#: object first, so a record that ended so and has no object lost it to a deletion (by hand, or
#: by the history limits), which a replica started since has not seen.
RUNNER_ENDED = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})
#: Store records read besides the window's slots (manual runs, backfills), and at most in all.
MISSING_LOOK_EXTRA = 10
MISSING_LOOK_MAX = 200


async def mend_missing(
    kube: Kube,
    scheduler: Scheduler,
    spec: JobSpec,
    items: Sequence[dict[str, Any]],
    deleted: Callable[[str, str], bool] = lambda namespace, name: False,
    *,
    look_back_ms: int = MISSING_LOOK_BACK_MS,
) -> list[str]:
    """Create, with the store's verdict, the objects of recent runs the store ended that have none.

    ``deleted(namespace, name)`` says the object existed and was deleted (the run cache's
    watch saw it go): such a run was not lost, and is left gone.
    """
    backend = scheduler.backend
    key = spec.key
    loop = scheduler.jobs.get(key)
    if not isinstance(backend, LeaseBackend) or loop is None or not items:
        return []
    slots = {int(i["spec"]["slot"]) for i in items}
    phases = [(int(i["spec"]["slot"]), runstatus.RunStatus.of(i.get("status")).phase) for i in items]
    here = cluster_of(scheduler.instance_id)
    grace_ms = loop.options.lease_ms
    now = scheduler.clock.now_ms()
    window = slots_between(spec.schedule, now - grace_ms - look_back_ms, now)
    look = min(MISSING_LOOK_MAX, MISSING_LOOK_EXTRA + sum(1 for _ in islice(window, MISSING_LOOK_MAX)))
    mended = []
    for run in await backend.history(key, look):
        if run.slot in slots or run.slot < min(slots) or run.state.active or now - run.updated_ms < grace_ms:
            continue
        if run.state in RUNNER_ENDED or deleted(spec.namespace, run_name(spec.name, run.slot)):
            continue  # deleted by hand or by the history limits: not lost
        if elsewhere_of(run, here) is not None or past_limits(spec, phases, run):
            continue  # another cluster's run (kube/elsewhere.py writes it), or one the limits delete at once
        body = await record.ensure_run(kube, spec, run.slot, record.cause_guess(spec, run.slot))
        name = body["metadata"]["name"]
        log.warning("%s: the store ended it (%s), it had no object: writing one", name, run.state)
        await _close(kube, spec, name, run)
        mended.append(name)
    return mended


def past_limits(spec: JobSpec, phases: Sequence[tuple[int, RunState | None]], run: Run) -> bool:
    """Whether the history limits would delete an object of ``run`` at once, given the job's
    objects' ``(slot, phase)``: they deleted it before, as it is older than every kept run of its kind."""
    kind, keep = next(k for k in record.history_kinds(spec) if run.state in k[0])
    kept = sorted(slot for slot, phase in phases if phase in kind)
    return keep == 0 or (len(kept) >= keep and run.slot < kept[-keep])


def elsewhere_of(run: Run, here: str | None) -> str | None:
    """The cluster ``run``'s current attempt ran in, when it is not ``here`` (a shared job's); else None."""
    there = cluster_of(run.instance)
    return there if there is not None and there != here else None


async def _close(kube: Kube, spec: JobSpec, name: str, run: Run) -> None:
    message = run.error or f"ended in the store as {run.state}"
    log.warning("run %s is open but its run ended in the store (%s): closing it", name, message)
    if run.state is RunState.INTERRUPTED and message.startswith(REPLACED_BY):
        pods = [p["metadata"]["name"] for p in await pods_of_run(kube, spec.namespace, name)]
        await end_replaced(kube, spec.namespace, name, pods, message)
        return
    if run.state is RunState.INTERRUPTED:
        await end_given_up(kube, spec.namespace, name, message)  # its Pod may live: it goes first
        return
    await record.update_status(
        kube,
        spec.namespace,
        name,
        run.attempt,
        lambda s: runstatus.end_attempt(s, attempt=run.attempt, outcome=run.state, message=message, final=True),
    )


#: How often a job's newest store records are looked over for runs without an object, at most.
MEND_MISSING_EVERY_MS = 60_000


class Mending:
    """A replica's mending of its jobs' runs, at each pass of its resync (:meth:`.JobController.resync_job`).

    Open runs are looked over at every pass; the store's newest records (a store query per
    job) once per period, which a failed look does not count as.
    """

    def __init__(
        self,
        kube: Kube,
        scheduler: Scheduler,
        deleted: Callable[[str, str], bool] = lambda namespace, name: False,
        *,
        resync_s: float = 30.0,
    ) -> None:
        self.kube = kube
        self.scheduler = scheduler
        #: Whether the run cache saw a run deleted lately (mending leaves such runs gone).
        self.deleted = deleted
        resync_ms = int(resync_s * 1000)
        self.every_ms = min(MEND_MISSING_EVERY_MS, 2 * resync_ms)
        #: Two looks are at most a look's period and a resync (1.5 periods at most) apart.
        self.look_back_ms = max(MISSING_LOOK_BACK_MS, self.every_ms + resync_ms * 3 // 2 + 15_000)
        #: When each job's store records were last looked over (clock ms, by engine key).
        self._looked: dict[str, int] = {}

    def forget(self, key: str) -> None:
        """The job is gone."""
        self._looked.pop(key, None)

    async def mend(self, spec: JobSpec, items: list[dict[str, Any]]) -> bool:
        """Close open runs the store ended, and (when due) write the missing ones: whether any was."""
        mended = await mend_runs(self.kube, self.scheduler, spec, items)
        key = engine_key(spec.namespace, spec.name, spec.uid)
        now = self.scheduler.clock.now_ms()
        if now - self._looked.get(key, -self.every_ms) < self.every_ms:
            return bool(mended)
        missing = await mend_missing(
            self.kube, self.scheduler, spec, items, self.deleted, look_back_ms=self.look_back_ms
        )
        self._looked[key] = self.scheduler.clock.now_ms()  # only once it got through: a failed look is made again
        return bool(mended or missing)
