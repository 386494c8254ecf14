"""The per-replica controller of AnarchonJobs: spec in, job loop out, status and Events back.

Every replica runs this for every AnarchonJob in its scope; all are active. It never
touches kopf's progress annotations or finalizers (only low-level watch events reach it),
so replicas never fight over them, and a job's deletion never waits on a replica.
The job's status is written by :mod:`.status`, manual runs are handled by :mod:`.triggers`,
and what the engine reports goes out through :mod:`.listener`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..engine import ConfigError, Job, RunContext, Scheduler
from .client import Kube
from .events import EventPoster
from .metrics import Metrics
from .podwatch import PodWatch
from .runner import PodRunner
from .spec import JobSpec, SpecError, engine_key, parse_job
from .status import JobStatus
from .triggers import Triggers


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
        self.status = JobStatus(kube, scheduler, events)
        self.triggers = Triggers(kube, scheduler, events)

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
            await self.status.invalid(namespace, name, uid, generation, status, exc)
            return
        self.specs[key] = spec
        await self.status.valid(spec, status)
        await self.triggers.apply(spec, key, meta.get("annotations") or {})

    async def remove(self, namespace: str, name: str, uid: str) -> None:
        key = engine_key(namespace, name, uid)
        # The job is gone: its runs' Pods are garbage-collected with it, nothing to hand over.
        await self.scheduler.remove(key, handover=False)
        self.specs.pop(key, None)
        self.triggers.forget(key)

    # -- runs ------------------------------------------------------------------------------------

    def _runner(self, key: str) -> PodRunner:
        return PodRunner(
            self.kube,
            self.events,
            lambda: self.specs[key],
            on_change=self.status.refresh,
            pod_watch=self.pod_watch,
            on_launch=self._launched,
        )

    def _launched(self, ctx: RunContext) -> None:
        if ctx.attempt == 1:
            now_ms = self.scheduler.clock.now_ms()
            self.metrics.pod_skew.observe(max(0, now_ms - ctx.slot) / 1000)
