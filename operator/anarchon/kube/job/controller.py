"""The per-replica controller of AnarchonJobs: spec in, job loop out, status and Events back.

Every replica runs this for every AnarchonJob in its scope; all are active. It writes no
finalizer on a job, and of its annotations only the trigger requests it handled (marked or
removed by conditional writes, see :mod:`.triggers`; :mod:`.jobwatch` hands it each change of
a job), so replicas never fight over a job, and a job's deletion never waits on a replica.
The job's status is written by :mod:`.status`, manual runs are handled by :mod:`.triggers`,
and what the engine reports goes out through :mod:`.listener`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...engine import ConfigError, HistoryStore, Job, LeaseBackend, RunContext, Scheduler
from ...engine.errors import StoreError
from ..api.client import Kube, background
from ..report.kube_events import EventPoster
from ..report.metrics import Metrics, job_times
from ..run import record
from ..run.cache import RunCache
from ..run.elsewhere import mirror_elsewhere
from ..run.mend import Mending, open_run
from ..run.podwatch import PodWatch
from ..run.runner import PodRunner
from .served import ServedJobs
from .shared import SHARED_SPEC_MISMATCH, SharedSpecs, Verdict
from .sharing import STORE_NOT_SHARED, StoreSharing
from .spec import JobSpec, SpecError, engine_key, parse_job, shared_name_of
from .status import JobStatus
from .triggers import Triggers, trigger_state

log = logging.getLogger("anarchon.kube.job.controller")


class JobController:
    def __init__(
        self,
        kube: Kube,
        scheduler: Scheduler,
        events: EventPoster,
        metrics: Metrics,
        pod_watch: PodWatch | None = None,
        run_cache: RunCache | None = None,
        *,
        resync_s: float = 30.0,
        sharing: StoreSharing | None = None,
        shared: SharedSpecs | None = None,
    ) -> None:
        self.kube = kube
        self.resync_s = resync_s
        self.pod_watch = pod_watch
        self.run_cache = run_cache
        self.scheduler = scheduler
        self.events = events
        self.metrics = metrics
        self.sharing = sharing
        #: The specs of jobs shared with other clusters (``spec.sharedName``), noted in the store.
        self.shared = shared or SharedSpecs(scheduler.backend, None, scheduler.clock.now_ms, every_s=resync_s)
        self.shared.specs = lambda: list(self.specs.values())
        self.shared.on_change = self._shared_changed
        self.shared.each = self._show_elsewhere
        self.specs: dict[str, JobSpec] = {}
        #: Each valid job's store key, by the object's uid (a shared job's is not derived from it).
        self._keys: dict[str, str] = {}
        self.triggers = Triggers(kube, scheduler, events)
        self.status = JobStatus(
            kube,
            scheduler,
            events,
            run_cache,
            resync_s=resync_s,
            not_shared=(lambda: None) if sharing is None else sharing.message,
            not_shared_kept_s=0.0 if sharing is None else sharing.window_s,
            shared_mismatch=self.shared.mismatch,
            pinned=self.triggers.pending_slots,
        )
        self.mending = Mending(
            kube,
            scheduler,
            (lambda namespace, name: False) if run_cache is None else run_cache.deleted,
            resync_s=resync_s,
        )
        self._telling: asyncio.Task[None] | None = None  # every job told whether the store is shared
        self.served = ServedJobs(scheduler.backend, scheduler.clock)
        #: Per job (engine key), what of its body the last complete handling went by: its
        #: generation (the spec's version) and its trigger annotations (see :meth:`apply`).
        self._handled: dict[str, tuple[int, tuple[tuple[str, str], ...]]] = {}

    # -- watch events ----------------------------------------------------------------------------

    async def apply(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        key = engine_key(namespace, name, uid, shared_name_of(body))
        generation = int(meta.get("generation") or 0)
        status = body.get("status") or {}
        version = str(meta.get("resourceVersion") or "") or None
        annotations = meta.get("annotations") or {}
        handled = (generation, trigger_state(annotations))
        spec = self.specs.get(key)
        if spec is not None and spec.uid != uid:
            # Another object of this cluster has the sharedName: it stays the job's, this one runs nothing.
            taken = SpecError(
                [
                    f"spec.sharedName: {spec.shared_name!r} is the sharedName of {spec.namespace}/{spec.name}"
                    " in this cluster already: one AnarchonJob per sharedName and cluster"
                ]
            )
            await self.status.invalid(namespace, name, uid, generation, status, taken, version)
            return
        if (old := self._keys.get(uid)) is not None and old != key:
            await self._stop(old, uid, handover=True)  # sharedName changed (an object older than the CRD's rule)
        if spec is not None and self._handled.get(key) == handled and key in self.scheduler.jobs:
            # Only the status changed: the replicas' own writes at every run's start and end,
            # each seen by every replica. The spec and the triggers are as last handled, so
            # nothing is parsed, rescheduled or triggered again.
            self.metrics.job_gauges.jobs[key] = job_times(spec, meta, status)
            await self.status.valid(spec, status, version)
            return
        self._handled.pop(key, None)
        verdict, changed = None, False
        try:
            spec = parse_job(body)
            if spec.shared_name:
                self.shared.check_usable()
                verdict, changed = await self.shared.note(spec)
            self.scheduler.add(self._job(spec))  # new, or updated in place from the next slot
        except (SpecError, ConfigError) as exc:
            await self.scheduler.remove(key, handover=True)
            self.specs.pop(key, None)
            self._keys.pop(uid, None)
            self.shared.forget(key)
            self.metrics.job_gauges.jobs.pop(key, None)  # no schedule: nothing is due
            await self.status.invalid(namespace, name, uid, generation, status, exc, version)
            return
        self.specs[key] = spec
        self._keys[uid] = key
        self.metrics.job_gauges.jobs[key] = job_times(spec, meta, status)
        await self.status.valid(spec, status, version)
        if verdict is not None and verdict.mismatch is not None and changed:
            await self.events.about(spec, reason=SHARED_SPEC_MISMATCH, message=verdict.mismatch, warning=True)
        await self.triggers.apply(spec, key, annotations, version)
        self._handled[key] = handled  # only now: a handling that failed is done again in full

    async def remove(self, namespace: str, name: str, uid: str) -> None:
        """The job is gone: stop its runs, then delete what the store keeps for it.

        Its runs' Pods are garbage-collected with it, so nothing is handed over. Every
        replica forgets the job once its own loop has stopped (the store's delete is
        idempotent), so the last replica to stop also removes a run that a slower one
        claimed meanwhile. A re-created job of the same name has a new uid, so a new key.
        """
        key = self._keys.get(uid) or engine_key(namespace, name, uid)
        spec = self.specs.get(key)
        if spec is not None and spec.uid != uid:
            return  # an object that had another's sharedName: it never ran here
        await self._stop(key, uid, handover=False)
        self.metrics.forget(key, namespace, name)
        try:
            if spec is not None and spec.shared_name:
                # The job lives on in the other clusters: only this cluster's note of its spec goes.
                await self.shared.drop(key)
            elif isinstance(self.scheduler.backend, HistoryStore):
                await self.scheduler.backend.forget_job(key)
        except StoreError as exc:
            log.warning("%s/%s deleted, but its store data stays for now: %s", namespace, name, exc)

    async def _stop(self, key: str, uid: str, *, handover: bool) -> None:
        """This replica runs the job of ``key`` no more, and forgets what it kept of it."""
        await self.scheduler.remove(key, handover=handover)
        self.specs.pop(key, None)
        self._keys.pop(uid, None)
        self._handled.pop(key, None)
        self.shared.forget(key)
        self.triggers.forget(key)
        self.status.forget(key)
        self.mending.forget(key)

    def _job(self, spec: JobSpec) -> Job:
        """The engine's job of ``spec``. A shared job is suspended while the clusters sharing it follow
        another spec, and held back while this replica's API server is out of reach (:mod:`.reach`)."""
        key = spec.key
        if not spec.shared_name:
            return Job(
                key,
                spec.schedule,
                self._runner(key),
                spec.options,
                recorded=lambda: self._newest_slot(key),
                open_slots=lambda: self._open_slots(key),
            )
        verdict = self.shared.verdict(key)
        options = replace(spec.options, suspend=True) if verdict is not None and verdict.waits else spec.options
        return Job(
            key,
            spec.schedule,
            self._runner(key),
            options,
            recorded=lambda: self._newest_slot(key),
            open_slots=lambda: self._open_slots(key),
            held=self.kube.reach.held,
        )

    async def _show_elsewhere(self, spec: JobSpec) -> None:
        """The runs of the shared job that ran in other clusters get their light objects here (:mod:`.elsewhere`)."""
        backend, here, cache = self.scheduler.backend, self.shared.cluster, self.run_cache
        if not isinstance(backend, LeaseBackend) or here is None or self.specs.get(spec.key) is not spec:
            return
        cached = None if cache is None else cache.runs_of(spec.namespace, spec.name)
        with background():
            items = cached if cached is not None else await record.list_runs(self.kube, spec.namespace, spec.name)
            look_back_ms = round(3 * self.shared.every_s * 1000) + spec.options.effective_lease_ms
            written = await mirror_elsewhere(
                self.kube,
                backend,
                spec,
                here,
                items,
                now_ms=self.scheduler.clock.now_ms(),
                look_back_ms=look_back_ms,
                deleted=lambda ns, name: cache is not None and cache.deleted(ns, name),
            )
        if written:
            await self.status.refresh_soon(spec)

    async def _shared_changed(self, spec: JobSpec, verdict: Verdict) -> None:
        """The clusters sharing the job came to agree or to disagree: claims resume or stop, and Ready says why."""
        if self.specs.get(spec.key) is not spec:
            return  # removed or changed meanwhile: its next handling says it
        self.scheduler.add(self._job(spec))
        with background():
            await self.status.sharing_changed(spec)
            if verdict.mismatch is not None:
                await self.events.about(spec, reason=SHARED_SPEC_MISMATCH, message=verdict.mismatch, warning=True)

    async def resync(self) -> None:
        """Every ``resync_s`` (± half, so that replicas spread out), a pass over every valid job.

        What no event asks for: runs the store ended while nobody was left to say so
        (:meth:`resync_job`), history limits of jobs that went quiet, or whose limits were
        lowered, and the store's records past their use (:meth:`.JobStatus.resync`), and the
        store data of jobs deleted while no replica watched (:mod:`.served`). Its API requests
        are background work (:func:`.client.background`): they wait behind the runs'.
        """
        with background():
            while True:
                await asyncio.sleep(self.resync_s * random.uniform(0.5, 1.5))
                try:
                    await self.served.tick(list(self.specs))
                except Exception as exc:
                    log.warning("noting the jobs served failed: %s", exc)
                for key, spec in list(self.specs.items()):
                    if self.specs.get(key) is not spec:
                        continue  # removed or changed while we were at an earlier job
                    try:
                        await self.resync_job(spec)
                    except Exception as exc:
                        log.warning("resync of %s failed: %s", spec.engine_name, exc)

    async def resync_job(self, spec: JobSpec) -> None:
        """One job's pass: its runs mended (:mod:`..run.mend`), then its status or only its history."""
        items = await self.status.runs_of(spec)
        if await self.mending.mend(spec, items):
            await self.status.refresh(spec, listed=True)  # the runs changed: the whole status
        else:
            await self.status.resync(spec, items)

    # -- the store shared, or not ----------------------------------------------------------------

    def sharing_changed(self) -> None:
        """The store was found not shared with the replicas at work, or shared again (:mod:`.sharing`):
        every job says so in its Ready condition, and gets a Warning Event while it is not."""
        if self._telling is not None:
            self._telling.cancel()  # what it was telling is out of date
        self._telling = asyncio.create_task(self._tell_sharing(), name="anarchon-store-sharing")

    async def _tell_sharing(self) -> None:
        why = None if self.sharing is None else self.sharing.message()
        with background():
            for key, spec in list(self.specs.items()):
                if self.specs.get(key) is not spec:
                    continue  # removed or changed meanwhile: its next handling says it
                try:
                    await self.status.sharing_changed(spec)
                except Exception as exc:
                    log.warning("telling %s whether the store is shared failed: %s", spec.engine_name, exc)
                if why is not None:
                    await self.events.about(spec, reason=STORE_NOT_SHARED, message=why, warning=True)

    # -- runs ------------------------------------------------------------------------------------

    async def _newest_slot(self, key: str) -> int | None:
        spec = self.specs.get(key)
        return None if spec is None else await self.status.newest_slot(spec)

    async def _open_slots(self, key: str) -> list[int]:
        """The slots of the job's runs that ran in this cluster and do not say how they ended; a
        light run of another cluster is that cluster's to pick up (see :mod:`.elsewhere`)."""
        spec = self.specs.get(key)
        if spec is None:
            return []
        items = await self.status.runs_of(spec)
        return [int(i["spec"]["slot"]) for i in items if open_run(i) and not (i.get("status") or {}).get("cluster")]

    def _runner(self, key: str) -> PodRunner:
        sharing = self.sharing
        return PodRunner(
            self.kube,
            self.events,
            lambda: self.specs[key],
            on_change=self.status.refresh_soon,
            pod_watch=self.pod_watch,
            wrote=None if self.run_cache is None else self.run_cache.wrote,
            runs_of=None if self.run_cache is None else self.run_cache.runs_of,
            cancels=None if self.run_cache is None else self.run_cache.cancels,
            on_launch=self._launched,
            store_shared=None if sharing is None else lambda: not sharing.strangers,
        )

    def _launched(self, ctx: RunContext) -> None:
        spec = self.specs.get(ctx.job)
        if ctx.attempt == 1 and spec is not None:
            now_ms = self.scheduler.clock.now_ms()
            self.metrics.job_pod_delay.labels(spec.namespace, spec.name).observe(max(0, now_ms - ctx.slot) / 1000)
