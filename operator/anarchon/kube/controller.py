"""The per-replica controller of AnarchonJobs: spec in, job loop out, status and Events back.

Every replica runs this for every AnarchonJob in its scope; all are active. It never
touches kopf's progress annotations or finalizers (only low-level watch events reach it),
so replicas never fight over them, and a job's deletion never waits on a replica.
Writes that every replica would make alike (conditions, next schedule time) are made only
when the stored value differs, so replicas converge instead of churning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..engine import Cause, ConfigError, Job, LeaseBackend, Run, RunContext, Scheduler
from . import runs
from .client import Kube
from .events import EventPoster
from .metrics import Metrics, MetricsListener
from .podwatch import PodWatch
from .runner import PodRunner
from .spec import JobSpec, SpecError, parse_job, run_name, schedule_column, slot_time

log = logging.getLogger("anarchon.kube.controller")

TRIGGER_ANNOTATION = "anarchon.io/trigger"
#: The trigger value already handled. Kept on the object, not only in memory: a replica that
#: starts later must not run an old trigger again once its run has left the store's history.
TRIGGER_HANDLED_ANNOTATION = "anarchon.io/trigger-handled"


def engine_key(namespace: str, name: str, uid: str) -> str:
    """The job's name in the store: a re-created object is a new job with its own history."""
    return f"{namespace}/{name}#{uid[:8]}"


def _condition(ctype: str, status: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:2000],
        "observedGeneration": generation,
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _same_conditions(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    def key(c: Mapping[str, Any]) -> tuple[Any, ...]:
        return (c.get("type"), c.get("status"), c.get("reason"), c.get("message"), c.get("observedGeneration"))

    return sorted(map(key, old)) == sorted(map(key, new))


class JobController:
    def __init__(
        self,
        kube: Kube,
        scheduler: Scheduler,
        events: EventPoster,
        metrics: Metrics,
        pod_watch: PodWatch | None = None,
    ) -> None:
        self.kube = kube
        self.pod_watch = pod_watch
        self.scheduler = scheduler
        self.events = events
        self.metrics = metrics
        self.specs: dict[str, JobSpec] = {}
        self._triggers: dict[str, str] = {}
        self._tasks: set[asyncio.Future[Any]] = set()

    # -- watch events ----------------------------------------------------------------------------

    async def apply(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        key = engine_key(namespace, name, uid)
        generation = int(meta.get("generation") or 0)
        status = body.get("status") or {}
        try:
            spec = parse_job(body)
            job = Job(key, spec.schedule, self._runner(key), spec.options)
            self.scheduler.add(job)  # new, or updated in place from the next slot
        except (SpecError, ConfigError) as exc:
            await self.scheduler.remove(key, handover=True)
            self.specs.pop(key, None)
            await self._invalid(namespace, name, uid, generation, status, exc)
            return
        self.specs[key] = spec
        await self._valid(spec, status)
        annotations = meta.get("annotations") or {}
        trigger = str(annotations.get(TRIGGER_ANNOTATION) or "")
        handled = str(annotations.get(TRIGGER_HANDLED_ANNOTATION) or "")
        if trigger and trigger != handled and self._triggers.get(key) != trigger:
            self._triggers[key] = trigger
            try:
                await self._manual(spec, key, trigger)
            except BaseException:
                self._triggers.pop(key, None)  # not handled: the next event tries again
                raise

    async def remove(self, namespace: str, name: str, uid: str) -> None:
        key = engine_key(namespace, name, uid)
        # The job is gone: its runs' Pods are garbage-collected with it, nothing to hand over.
        await self.scheduler.remove(key, handover=False)
        self.specs.pop(key, None)
        self._triggers.pop(key, None)

    # -- status ----------------------------------------------------------------------------------

    async def _invalid(
        self, namespace: str, name: str, uid: str, generation: int, status: Mapping[str, Any], exc: Exception
    ) -> None:
        message = "; ".join(exc.messages) if isinstance(exc, SpecError) else str(exc)
        conditions = [
            _condition("Ready", False, "InvalidSpec", message, generation),
            _condition("Invalid", True, "InvalidSpec", message, generation),
        ]
        if _same_conditions(list(status.get("conditions") or []), conditions):
            return  # another replica (or we) said so already
        log.warning("%s/%s: invalid spec: %s", namespace, name, message)
        await self.kube.patch_job_status(
            namespace,
            name,
            {
                "conditions": conditions,
                "observedGeneration": generation,
                "nextScheduleTime": None,
                "nextSlot": None,
                "schedule": None,
            },
        )
        await self.events.post(
            namespace=namespace, name=name, uid=uid, reason="InvalidSpec", message=message, warning=True
        )

    async def _valid(self, spec: JobSpec, status: Mapping[str, Any]) -> None:
        now = self.scheduler.clock.now_ms()
        next_slot = spec.schedule.next_after(now)
        what = f"suspended ({spec.schedule})" if spec.options.suspend else f"{spec.schedule}"
        conditions = [
            _condition(
                "Ready",
                not spec.options.suspend,
                "Suspended" if spec.options.suspend else "Scheduled",
                what,
                spec.generation,
            ),
            _condition("Invalid", False, "Valid", "the spec is valid", spec.generation),
        ]
        patch: dict[str, Any] = {}
        if not _same_conditions(list(status.get("conditions") or []), conditions):
            patch["conditions"] = conditions
            patch["observedGeneration"] = spec.generation
        if int(status.get("nextSlot") or 0) < now:
            patch.update(nextSlot=next_slot, nextScheduleTime=slot_time(next_slot))
        if status.get("schedule") != (column := schedule_column(spec.schedule)):
            patch["schedule"] = column
        if patch:
            await self.kube.patch_job_status(spec.namespace, spec.name, patch)

    async def refresh_status(self, spec: JobSpec) -> None:
        """Recompute active runs, last times and history from the job's AnarchonRuns."""
        items = await runs.list_runs(self.kube, spec.namespace, spec.name)
        phase = {r["metadata"]["name"]: (r.get("status") or {}).get("phase") for r in items}
        active = [
            {
                "name": r["metadata"]["name"],
                "slot": int(r["spec"]["slot"]),
                "attempt": int((r.get("status") or {}).get("attempt") or 1),
                "instance": str((r.get("status") or {}).get("instance") or ""),
            }
            for r in items
            if phase[r["metadata"]["name"]] in ("Claimed", "Running")
        ]
        scheduled = [int(r["spec"]["slot"]) for r in items if phase[r["metadata"]["name"]] not in (None, "Skipped")]
        succeeded = [int(r["spec"]["slot"]) for r in items if phase[r["metadata"]["name"]] == "Succeeded"]
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
        await self.kube.patch_job_status(spec.namespace, spec.name, patch)
        await self._enforce_history(spec, items, phase)

    async def _enforce_history(self, spec: JobSpec, items: list[dict[str, Any]], phase: dict[str, Any]) -> None:
        """Keep the newest N successful, N skipped and M failed runs; their Pods go with them (GC).

        Skipped runs have a bucket of their own: a long job on a short period skips many
        slots, and they must not push the successful runs out of the history.
        """

        def done(r: dict[str, Any]) -> bool:
            # An Interrupted run without a finish time is between attempts: not history yet.
            status = r.get("status") or {}
            return status.get("phase") != "Interrupted" or bool(status.get("finishTime"))

        def of(*phases: str) -> list[dict[str, Any]]:
            return [
                r
                for r in items
                if phase[r["metadata"]["name"]] in phases
                and done(r)
                and not self._still_active(spec, int(r["spec"]["slot"]))
            ]

        doomed: list[dict[str, Any]] = []
        for bucket, keep in (
            (of("Succeeded"), spec.successful_history),
            (of("Skipped"), spec.successful_history),
            (of("Failed", "Interrupted"), spec.failed_history),
        ):
            doomed += bucket[: max(0, len(bucket) - keep)]
        for r in doomed:
            await runs.delete_run(self.kube, spec.namespace, r["metadata"]["name"])
        if doomed and isinstance(self.scheduler.backend, LeaseBackend):
            kept = [int(r["spec"]["slot"]) for r in items if r not in doomed]
            if kept:
                key = engine_key(spec.namespace, spec.name, spec.uid)
                await self.scheduler.backend.prune(key, before_slot=min(kept))

    def _still_active(self, spec: JobSpec, slot: int) -> bool:
        loop = self.scheduler.jobs.get(engine_key(spec.namespace, spec.name, spec.uid))
        return loop is not None and slot in loop.running_slots

    # -- runs ------------------------------------------------------------------------------------

    def _runner(self, key: str) -> PodRunner:
        return PodRunner(
            self.kube,
            self.events,
            lambda: self.specs[key],
            on_change=self.refresh_status,
            pod_watch=self.pod_watch,
            on_launch=self._launched,
        )

    def _launched(self, ctx: RunContext) -> None:
        if ctx.attempt == 1:
            now_ms = self.scheduler.clock.now_ms()
            self.metrics.pod_skew.observe(max(0, now_ms - ctx.slot) / 1000)

    async def _manual(self, spec: JobSpec, key: str, trigger: str) -> None:
        slot = parse_trigger(trigger)
        if slot is None:
            await self.events.about(
                spec,
                reason="BadTrigger",
                message=f"annotation {TRIGGER_ANNOTATION}={trigger!r} is not a time",
                warning=True,
            )
            await self.kube.annotate_job(spec.namespace, spec.name, {TRIGGER_HANDLED_ANNOTATION: trigger})
            return
        result = await self.scheduler.trigger(key, slot)
        # Won or taken, the store has decided this slot: every replica may mark it handled
        # (the same value each time; a patch that changes nothing changes nothing).
        await self.kube.annotate_job(spec.namespace, spec.name, {TRIGGER_HANDLED_ANNOTATION: trigger})
        if result.won:
            await self.events.about(
                spec,
                reason="Triggered",
                message=f"manual run {run_name(spec.name, slot)} claimed by {self.scheduler.instance_id}",
            )

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background (listener hooks must not block); a failure is logged."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("background write failed: %s: %s", type(exc).__name__, exc)


def parse_trigger(value: str) -> int | None:
    """A trigger annotation names the manual slot: ms since epoch, or an RFC3339 time."""
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


class OperatorListener(MetricsListener):
    """Metrics plus Kubernetes Events and Skipped runs for what the engine reports."""

    def __init__(self, metrics: Metrics, controller_ref: list[JobController]) -> None:
        super().__init__(metrics)
        self._controller = controller_ref

    def _spec(self, job: str) -> tuple[JobController, JobSpec] | None:
        if not self._controller:
            return None
        controller = self._controller[0]
        spec = controller.specs.get(job)
        return None if spec is None else (controller, spec)

    def _event(self, job: str, reason: str, message: Callable[[JobSpec], str], *, warning: bool = False) -> None:
        """Post an Event on the job in the background: listener hooks must not block."""
        found = self._spec(job)
        if found:
            controller, spec = found
            controller.spawn(controller.events.about(spec, reason, message(spec), warning=warning))

    def skipped(self, job: str, slot: int, reason: str, cause: Cause = Cause.SCHEDULE) -> None:
        super().skipped(job, slot, reason, cause)
        found = self._spec(job)
        if found:
            controller, spec = found
            controller.spawn(runs.record_skipped(controller.kube, spec, slot, reason, str(cause)))
        self._event(job, "Skipped", lambda _: f"slot {slot_time(slot)}: {reason}")

    def missed(self, job: str, slot: int, reason: str) -> None:
        super().missed(job, slot, reason)
        self._event(job, "Missed", lambda _: f"slot {slot_time(slot)}: {reason}", warning=True)

    def took_over(self, job: str, slot: int, attempt: int, previous_instance: str | None) -> None:
        super().took_over(job, slot, attempt, previous_instance)
        me = self._controller[0].scheduler.instance_id if self._controller else "?"
        self._event(
            job,
            "TakeOver",
            lambda spec: (
                f"run {run_name(spec.name, slot)}: attempt {attempt} taken over by {me} from {previous_instance}"
            ),
            warning=True,
        )

    def run_interrupted_final(self, run: Run) -> None:
        super().run_interrupted_final(run)
        message = run.error or f"interrupted after attempt {run.attempt}"
        found = self._spec(run.job)
        if found:
            controller, spec = found
            controller.spawn(self._given_up(controller, spec, run.slot, run.attempt, message))
        self._event(
            run.job, "RunInterrupted", lambda spec: f"run {run_name(spec.name, run.slot)}: {message}", warning=True
        )

    @staticmethod
    async def _given_up(controller: JobController, spec: JobSpec, slot: int, attempt: int, message: str) -> None:
        await runs.record_given_up(controller.kube, spec, slot, attempt, message)
        await controller.refresh_status(spec)
