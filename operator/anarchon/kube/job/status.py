"""An AnarchonJob's status: its conditions, its runs at a glance, and the history limits.

Every replica writes it, for every job. Writes that every replica would make alike
(conditions, next schedule time) are made only when the stored value differs, and only onto
the version of the job they were read from: of the replicas that saw a new job at once, one
writes them and the others hear 409 (then see the write, and find nothing left to do).

History limits are enforced at every refresh (soon after a run starts or ends) and at every
resync (:meth:`JobStatus.resync`, periodic), so a job that went quiet, or whose limits were
lowered, still converges to its limits, as CronJob does at each sync.

A run's start and end ask for a refresh (:meth:`JobStatus.refresh_soon`), which covers every
change of the job until it is made: a start's within REFRESH_AFTER_START_S, an end's within
REFRESH_AFTER_END_S (sooner, if a start's is waiting). So a run shorter than the first (most
runs, on a busy cluster) costs one status write instead of two, each of which wakes the job
watch of every replica; the job's ACTIVE column shows a run up to that long after it started
(``kubectl get anarchonruns`` at once), and its end within a second. A stopping replica makes
its waiting refreshes at once (:meth:`JobStatus.flush`).

A replica that finds its store not shared with the others (:mod:`.sharing`) says so on every
valid job it schedules: Ready=False, reason StoreNotShared. Replicas may disagree a while (one
sees it first, one is new), and each would put its own word back at every change of the job:
so a replica that does not see it leaves another's StoreNotShared alone until it is older than
the sharing check's window (one that still sees it then writes it again, once).

The pruning of the store's records by age costs a store query, and is made less often than that,
per job and replica (as is mending's look for runs without an object, :mod:`..run.mend`): at
most every ten resync periods (what the engine still needs stays, whatever the history keeps,
and older records wait that much longer): made at every pass, the two were most of the store's
load with nothing due (figures: bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...engine import LeaseBackend, RunState, Scheduler
from ..api.client import Kube, in_background
from ..report.kube_events import EventPoster
from ..run import record, runstatus
from ..run.cache import RunCache
from . import missed
from .shared import SHARED_SPEC_MISMATCH
from .sharing import STORE_NOT_SHARED
from .spec import JobSpec, SpecError, schedule_column, slot_time

log = logging.getLogger("anarchon.kube.job.status")

#: How long a refresh asked for by a run's start may wait for more changes of the job (its end).
REFRESH_AFTER_START_S = 30.0
#: ... and one asked for by a run's end (or anything else).
REFRESH_AFTER_END_S = 1.0
#: A next slot that passed less than this ago is left to the refresh its run asks for: written at
#: once, every replica raced to write it (one write, two 409s) whenever the job watch brought a
#: status just after a slot, a third more job status writes per run under load.
NEXT_SLOT_GRACE_MS = 5_000
#: How many writes a missed window gets before it is given up unseen (a CRD without the field prunes it).
MISSED_WRITES_AT_MOST = 5
#: A refresh that failed while it carried missed windows is made again this long after (doubled
#: at each failure, up to the most): only this replica knows them, and the job's next run may be
#: a day away.
MISSED_RETRY_FIRST_S = 1.0
MISSED_RETRY_MOST_S = 60.0


@dataclass
class _Wait:
    """A job's refresh waiting until ``due`` (event-loop time); ``moved`` wakes it to look again."""

    due: float
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _condition(ctype: str, status: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:2000],
        "observedGeneration": generation,
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _ready(conditions: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == "Ready"), None)


def _age_s(condition: Mapping[str, Any]) -> float:
    """Seconds since the condition's lastTransitionTime (infinite if it has none that parses)."""
    try:
        since = datetime.fromisoformat(str(condition.get("lastTransitionTime")).replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (datetime.now(UTC) - since).total_seconds()


def _same_conditions(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    def key(c: Mapping[str, Any]) -> tuple[Any, ...]:
        return (c.get("type"), c.get("status"), c.get("reason"), c.get("message"), c.get("observedGeneration"))

    return sorted(map(key, old)) == sorted(map(key, new))


class JobStatus:
    """Writes the status of the AnarchonJobs this replica serves (all of them)."""

    def __init__(
        self,
        kube: Kube,
        scheduler: Scheduler,
        events: EventPoster,
        run_cache: RunCache | None = None,
        *,
        resync_s: float = 30.0,
        not_shared: Callable[[], str | None] = lambda: None,
        not_shared_kept_s: float = 0.0,
        shared_mismatch: Callable[[str], str | None] = lambda key: None,
        pinned: Callable[[str], Iterable[int]] = lambda key: (),
    ) -> None:
        self.kube = kube
        #: Per job (engine key), the slots whose store records must stay whatever their age:
        #: those of pending trigger requests (:meth:`.Triggers.pending_slots`).
        self.pinned = pinned
        self.scheduler = scheduler
        self.events = events
        self.run_cache = run_cache
        #: Why the store is not shared (:meth:`.StoreSharing.message`), None while it is, and how
        #: long another replica's word on it stands.
        self.not_shared = not_shared
        self.not_shared_kept_s = not_shared_kept_s
        #: Why the clusters sharing a job (by engine key) disagree on its spec (:mod:`.shared`), None if they do not.
        self.shared_mismatch = shared_mismatch
        #: The conditions of each job (by engine key) as last seen or written here, and the jobs
        #: whose StoreNotShared this replica wrote.
        self._conditions: dict[str, list[dict[str, Any]]] = {}
        self._said_not_shared: set[str] = set()
        self.prune_every_ms = 10 * int(resync_s * 1000)
        #: When each job's store records were last pruned (clock ms, by engine key).
        self._pruned: dict[str, int] = {}
        #: The jobs whose refresh waits (by engine key), with their newest spec, and the waits.
        self._soon: dict[str, JobSpec] = {}
        self._waits: dict[str, _Wait] = {}
        self._flushing = False  # a replica stopping: the waits end now
        #: Missed windows this replica reported and has not yet seen in the job's status, with
        #: the writes they had; and the windows the status held when last seen (by engine key).
        self._missed: dict[str, tuple[list[missed.Window], int]] = {}
        self._missed_seen: dict[str, list[missed.Window]] = {}
        self._missed_failures: dict[str, int] = {}  # refreshes in a row that failed with windows pending

    def forget(self, key: str) -> None:
        """The job is gone."""
        self._pruned.pop(key, None)
        self._soon.pop(key, None)
        self._conditions.pop(key, None)
        self._said_not_shared.discard(key)
        self._missed.pop(key, None)
        self._missed_seen.pop(key, None)
        self._missed_failures.pop(key, None)

    async def note_missed(self, spec: JobSpec, slots: list[int], message: str) -> None:
        """Slots the engine reported missed: their window goes into the job's status at the next refresh."""
        key = spec.key
        pending, _ = self._missed.get(key, ([], 0))
        self._missed[key] = ([*pending, missed.window(slots, message)], 0)
        await self.refresh_soon(spec)

    async def _missed_seen_in(self, spec: JobSpec, status: Mapping[str, Any]) -> None:
        """Note the windows the status holds; ours not among them yet are written (again) soon."""
        key = spec.key
        self._missed_seen[key] = seen = missed.from_status(status)
        pending, writes = self._missed.get(key, ([], 0))
        if not pending:
            return
        if missed.covers(seen, pending) or writes >= MISSED_WRITES_AT_MOST:
            del self._missed[key]
        elif writes and key not in self._waits:
            await self.refresh_soon(spec)  # another replica's write came after ours, without them

    async def refresh_soon(self, spec: JobSpec, ended: bool = True) -> None:
        """Refresh the job's status soon, once for all its changes until then: within
        REFRESH_AFTER_END_S, or (a run started: ``ended=False``) REFRESH_AFTER_START_S."""
        self._refresh_in(spec, REFRESH_AFTER_END_S if ended else REFRESH_AFTER_START_S)

    def _refresh_in(self, spec: JobSpec, delay_s: float) -> None:
        key = spec.key
        self._soon[key] = spec
        due = asyncio.get_running_loop().time() + delay_s
        wait = self._waits.get(key)
        if wait is None:
            wait = self._waits[key] = _Wait(due)
            wait.task = asyncio.create_task(self._later(key, wait), name=f"anarchon-status:{spec.engine_name}")
        elif due < wait.due:
            wait.due = due
            wait.moved.set()

    async def _later(self, key: str, wait: _Wait) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (left := wait.due - loop.time()) > 0 and not self._flushing:
                wait.moved.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wait.moved.wait(), left)
        finally:
            self._waits.pop(key, None)  # a change from here on asks for a refresh of its own
        spec = self._soon.pop(key, None)
        if spec is None:
            return  # the job is gone
        try:
            await in_background(self.refresh(spec))
        except Exception as exc:
            log.warning("status refresh of %s failed: %s", spec.engine_name, exc)
            if key in self._missed and not self._flushing:
                failures = self._missed_failures[key] = self._missed_failures.get(key, 0) + 1
                self._refresh_in(spec, min(MISSED_RETRY_MOST_S, MISSED_RETRY_FIRST_S * 2 ** (failures - 1)))
        else:
            self._missed_failures.pop(key, None)

    async def flush(self) -> None:
        """Make the waiting refreshes now: a stopping replica's would otherwise wait for the job's next run."""
        self._flushing = True
        waits = list(self._waits.values())
        for wait in waits:
            wait.moved.set()
        await asyncio.gather(*(w.task for w in waits if w.task is not None), return_exceptions=True)

    def _due(self, last: dict[str, int], spec: JobSpec, every_ms: int) -> bool:
        key = spec.key
        return self.scheduler.clock.now_ms() - last.get(key, -every_ms) >= every_ms

    def _done(self, last: dict[str, int], spec: JobSpec) -> None:
        last[spec.key] = self.scheduler.clock.now_ms()

    async def runs_of(self, spec: JobSpec) -> list[dict[str, Any]]:
        """The job's runs by slot: from the watch-fed cache when it is live, else one LIST."""
        if self.run_cache is not None and (cached := self.run_cache.runs_of(spec.namespace, spec.name)) is not None:
            return cached
        return await record.list_runs(self.kube, spec.namespace, spec.name)

    async def newest_slot(self, spec: JobSpec) -> int | None:
        """The slot of the job's newest AnarchonRun: the base of catch-up when the store has
        no history of the job (it lost its state while no replica ran)."""
        items = await self.runs_of(spec)
        return int((items[-1].get("spec") or {}).get("slot") or 0) if items else None

    async def invalid(
        self,
        namespace: str,
        name: str,
        uid: str,
        generation: int,
        status: Mapping[str, Any],
        exc: Exception,
        version: str | None = None,
    ) -> None:
        """The spec cannot run: Ready=False and Invalid=True with every problem, and a Warning Event."""
        message = "; ".join(exc.messages) if isinstance(exc, SpecError) else str(exc)
        conditions = [
            _condition("Ready", False, "InvalidSpec", message, generation),
            _condition("Invalid", True, "InvalidSpec", message, generation),
        ]
        if _same_conditions(list(status.get("conditions") or []), conditions):
            return  # another replica (or we) said so already
        written = await self.kube.patch_job_status(
            namespace,
            name,
            {
                "conditions": conditions,
                "observedGeneration": generation,
                "nextScheduleTime": None,
                "nextSlot": None,
                "schedule": None,
            },
            if_version=version,
        )
        if not written:
            return  # the job changed meanwhile (another replica said so, most likely): its next event decides
        log.warning("%s/%s: invalid spec: %s", namespace, name, message)
        await self.events.post(
            namespace=namespace, name=name, uid=uid, reason="InvalidSpec", message=message, warning=True
        )

    async def valid(self, spec: JobSpec, status: Mapping[str, Any], version: str | None = None) -> None:
        """The spec runs: Ready (or SharedSpecMismatch, Suspended, StoreNotShared), the next schedule time
        and the SCHEDULE column.

        ``version``: the job's resourceVersion that ``status`` was read from (see the module).
        """
        now = self.scheduler.clock.now_ms()
        key = spec.key
        current = list(status.get("conditions") or [])
        self._conditions[key] = current
        await self._missed_seen_in(spec, status)
        patch: dict[str, Any] = {}
        if (conditions := self._valid_conditions(spec, current)) is not None:
            patch["conditions"] = conditions
            patch["observedGeneration"] = spec.generation
        if int(status.get("nextSlot") or 0) < now - NEXT_SLOT_GRACE_MS:
            # Only then: at every run's start and end each replica comes here (the status
            # writes are job changes), and a cron schedule's next slot is its costliest part.
            next_slot = spec.schedule.next_after(now)
            patch.update(nextSlot=next_slot, nextScheduleTime=slot_time(next_slot))
        if status.get("schedule") != (column := schedule_column(spec.schedule)):
            patch["schedule"] = column
        if patch and await self.kube.patch_job_status(spec.namespace, spec.name, patch, if_version=version):
            self._wrote(key, conditions)

    async def sharing_changed(self, spec: JobSpec) -> bool:
        """The store was found shared, or not, or the clusters sharing the job came to agree on its spec, or
        not (:mod:`.shared`): the job's Ready condition says so now; whether it was written.

        From the conditions last seen, onto whatever version the job has: no change of the job
        comes to ask for it (the next one would find it written).
        """
        key = spec.key
        conditions = self._valid_conditions(spec, self._conditions.get(key, []))
        if conditions is None:
            return False
        patch = {"conditions": conditions, "observedGeneration": spec.generation}
        if not await self.kube.patch_job_status(spec.namespace, spec.name, patch):
            return False
        self._wrote(key, conditions)
        return True

    def _wrote(self, key: str, conditions: list[dict[str, Any]] | None) -> None:
        if conditions is None:
            return
        self._conditions[key] = conditions
        ready = _ready(conditions) or {}
        if ready.get("reason") == STORE_NOT_SHARED:
            self._said_not_shared.add(key)
        else:
            self._said_not_shared.discard(key)

    def _valid_conditions(self, spec: JobSpec, current: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """The conditions of a job whose spec runs, or None when ``current`` says the same already."""
        key = spec.key
        was = _ready(current)
        not_shared_before = (
            was is not None
            and was.get("reason") == STORE_NOT_SHARED
            and was.get("status") == "False"
            and was.get("observedGeneration") == spec.generation
        )
        why = self.not_shared()
        if (mismatch := self.shared_mismatch(key)) is not None:
            ready = _condition("Ready", False, SHARED_SPEC_MISMATCH, mismatch, spec.generation)
        elif spec.options.suspend:
            ready = _condition("Ready", False, "Suspended", f"suspended ({spec.schedule})", spec.generation)
        elif was is not None and not_shared_before and why is not None:
            ready = was  # said already (by us, or another replica in its words)
        elif was is not None and not_shared_before and key not in self._said_not_shared:
            # Another replica's word: it stands while fresh. If that replica still sees it, it
            # writes it again at the job's next change after ours.
            ready = was if _age_s(was) < self.not_shared_kept_s else self._scheduled(spec)
        elif why is not None:
            ready = _condition("Ready", False, STORE_NOT_SHARED, why, spec.generation)
        else:
            ready = self._scheduled(spec)
        conditions = [ready, _condition("Invalid", False, "Valid", "the spec is valid", spec.generation)]
        return None if _same_conditions(current, conditions) else conditions

    @staticmethod
    def _scheduled(spec: JobSpec) -> dict[str, Any]:
        return _condition("Ready", True, "Scheduled", f"{spec.schedule}", spec.generation)

    async def refresh(self, spec: JobSpec, *, listed: bool = False) -> None:
        """Recompute active runs, last times and history from the job's AnarchonRuns.

        ``listed``: read them with a LIST, not from the run cache, which may not have seen yet
        what this replica just wrote (mending, :meth:`.JobController.resync_job`).
        """
        if listed:
            items = await record.list_runs(self.kube, spec.namespace, spec.name)
        else:
            items = await self.runs_of(spec)
        runs = [(r, runstatus.RunStatus.of(r.get("status"))) for r in items]
        active = [
            {
                "name": r["metadata"]["name"],
                "slot": int(r["spec"]["slot"]),
                "attempt": status.attempt or 1,
                "instance": status.instance or "",
            }
            for r, status in runs
            if status.phase is not None and status.phase.active
        ]
        scheduled = [int(r["spec"]["slot"]) for r, status in runs if status.phase not in (None, RunState.SKIPPED)]
        succeeded = [int(r["spec"]["slot"]) for r, status in runs if status.phase is RunState.SUCCEEDED]
        now = self.scheduler.clock.now_ms()
        next_slot = spec.schedule.next_after(now)
        patch: dict[str, Any] = {
            "active": active,
            "activeCount": len(active),
            "nextSlot": next_slot,
            "nextScheduleTime": slot_time(next_slot),
        }
        if scheduled:
            patch["lastScheduleTime"] = slot_time(max(scheduled))
        if succeeded:
            patch["lastSuccessfulTime"] = slot_time(max(succeeded))
        key = spec.key
        if (pending := self._missed.get(key)) is not None:
            windows = missed.merged(self._missed_seen.get(key, []), pending[0], spec.schedule)
            patch["missed"] = [w.record() for w in windows]
        await self.kube.patch_job_status(spec.namespace, spec.name, patch)
        if pending is not None and self._missed.get(key, (None, 0))[0] is pending[0]:
            self._missed[key] = (pending[0], pending[1] + 1)  # a write made (a new window since starts over)
        await self._enforce_history(spec, items)

    async def resync(self, spec: JobSpec, items: list[dict[str, Any]] | None = None) -> None:
        """The periodic pass over a job, quiet or not: its history limits and its store records."""
        await self._enforce_history(spec, await self.runs_of(spec) if items is None else items)

    async def _enforce_history(self, spec: JobSpec, items: list[dict[str, Any]]) -> None:
        """Keep the newest N successful, N skipped and M failed runs; their Pods go with them (GC).

        Skipped runs have a bucket of their own: a long job on a short period skips many
        slots, and they must not push the successful runs out of the history.

        Newest by when they ran (:func:`.run.record.ran_at`), not by their slot: a manual run or a
        backfill of an old slot would otherwise be the oldest of the history, and deleted as
        soon as it ended.
        """
        status = {r["metadata"]["name"]: runstatus.RunStatus.of(r.get("status")) for r in items}
        running = self._running_slots(spec)

        def of(*phases: RunState) -> list[dict[str, Any]]:
            # Ended: an Interrupted run without a finish time is between attempts, not history yet.
            return [
                r
                for r in items
                if (s := status[r["metadata"]["name"]]).phase in phases
                and s.ended
                and int(r["spec"]["slot"]) not in running
            ]

        doomed: list[dict[str, Any]] = []
        for phases, keep in record.history_kinds(spec):
            bucket = sorted(of(*phases), key=record.ran_at)
            doomed += bucket[: max(0, len(bucket) - keep)]
        for r in doomed:
            await record.delete_run(self.kube, spec.namespace, r["metadata"]["name"])
        await self._prune_store(spec, items)

    async def _prune_store(self, spec: JobSpec, items: list[dict[str, Any]]) -> None:
        """Delete the job's store records the engine no longer needs, by the age of their slot.

        Not bound to the history: an old Failed run that ``failedRunsHistoryLimit`` keeps for
        ever must not hold every later record in the store with it. Only a run whose object
        is still open keeps its record (and the later ones): mending it needs the store's verdict.
        So does a pending trigger request's slot: a replica may have claimed it and not yet
        removed the request, and the next one to handle it must find the slot taken.
        """
        key = spec.key
        loop = self.scheduler.jobs.get(key)
        if loop is None or not isinstance(self.scheduler.backend, LeaseBackend):
            return
        if not self._due(self._pruned, spec, self.prune_every_ms):
            return
        if not items and key in self._pruned:
            # No run object, and pruned once already: a record comes with a run, and a run
            # with its object. Idle jobs would cost store queries for nothing.
            return
        before = self.scheduler.clock.now_ms() - loop.options.records_needed_ms
        before = min(
            [
                before,
                *(int(r["spec"]["slot"]) for r in items if not runstatus.ended(r.get("status") or {})),
                *self.pinned(key),
            ]
        )
        await self.scheduler.backend.prune(key, before_slot=before)
        self._done(self._pruned, spec)

    def _running_slots(self, spec: JobSpec) -> frozenset[int]:
        """The slots this replica runs right now for the job, read once per pass over its runs."""
        loop = self.scheduler.jobs.get(spec.key)
        return frozenset(loop.running_slots) if loop is not None else frozenset()
