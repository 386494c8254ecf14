"""Wiring: one process = one instance = three watches (jobs, runs, Pods) + the engine's Scheduler.

Every replica is active (the store picks one winner per slot) and writes nothing to a job
but its status and the trigger it handled (:mod:`.triggers`, a value every replica writes
alike): no finalizers, so replicas never fight over an object and a job's deletion never
waits on a replica. Liveness and readiness are served by :mod:`.health`
from the first moment, before the store answers. SIGTERM and SIGINT hand running attempts
over (their Pods left running for a backup to adopt) before anything else stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import start_http_server

from ..engine import Clock, Scheduler, SystemClock, default_instance_id, observed
from ..engine.backends import from_url
from ..engine.errors import StoreError
from ..engine.retry import Backoff, retry
from ..engine.shared import instance_id as cluster_instance
from .api.client import API_CONCURRENCY, backlog_ms, connect
from .job.controller import JobController
from .job.jobwatch import JobWatch
from .job.shared import SharedSpecs
from .job.sharing import CHECK_EVERY_S, StoreSharing
from .report.health import HealthServer
from .report.kube_events import EventPoster
from .report.metrics import Metrics
from .run.cache import RunCache
from .run.listener import OperatorListener
from .run.pods import follower_label
from .run.podwatch import PodWatch

log = logging.getLogger("anarchon.kube")

#: How a replica waits for its store at start: a try within a second, then up to every 15 s.
STORE_WAIT = Backoff(first_ms=500, max_ms=15_000)
#: How long a stopping replica spends on the job status writes it still owes, after the hand-over.
FLUSH_S = 10.0
#: Container objects allocated (net) between two young collections of the cyclic garbage
#: collector; CPython's default is 700. See :func:`_tune_gc`.
GC_YOUNG = 10_000


def _tune_gc() -> None:
    """Fewer cyclic garbage collections: a replica allocates a burst of short-lived objects for
    every watch event it decodes, and with CPython's defaults the collector ran every 700 of
    them, promoting what was merely in flight to older generations whose full collections
    stalled the event loop. The start-up's objects are frozen (modules, classes: never garbage).
    The cost is a few thousand objects more waiting for a collection (figures: bench/README.md)."""
    gc.set_threshold(GC_YOUNG, 10, 10)


@dataclass
class OperatorConfig:
    store: str
    instance_id: str
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    kubeconfig: str | None = None
    metrics_port: int | None = 8080
    health_port: int | None = 8081
    #: How often every job is looked over for what no event asks for (history limits of a
    #: quiet job, the store's old records); see :meth:`.JobController.resync`.
    resync_s: float = 30.0
    #: API requests in flight at most (watches aside); see :data:`.client.API_CONCURRENCY`.
    api_concurrency: int = API_CONCURRENCY
    #: How often the replica notes itself in its store and checks that the others share it (:mod:`.sharing`).
    store_check_s: float = CHECK_EVERY_S
    #: This replica's cluster (``--cluster-name``): it leads the instance id, and lets the replica run
    #: jobs shared with other clusters (``spec.sharedName``, :mod:`.shared`). None: no such job runs.
    cluster_name: str | None = None
    stop_flag: asyncio.Event | None = None


def job_handler(controller: JobController) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """What the job watch calls with each change of a job: the controller applies or removes it."""

    async def on_job(kind: str, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            await controller.remove(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
        else:
            await controller.apply(body)

    return on_job


async def run_operator(cfg: OperatorConfig) -> None:
    """Run one replica until stopped.

    The store URL and the credentials are read first, before any port is opened: a URL that
    cannot work raises :class:`ConfigError`, missing credentials :class:`CredentialsError`,
    and the command line turns both into one line and exit code 2 rather than a crash loop.
    """
    _tune_gc()
    backend = from_url(cfg.store)  # no connection yet: a URL that cannot work fails here
    try:
        kube = await connect(cfg.kubeconfig, api_concurrency=cfg.api_concurrency)
    except BaseException:
        await backend.close()
        raise
    clock = SystemClock()
    metrics = Metrics(clock.now_ms)
    # Every store call the engine makes is timed (by store kind and operation), the engine none the wiser.
    backend = observed(backend, metrics.store_call(backend.capabilities.name))
    if cfg.metrics_port:
        start_http_server(cfg.metrics_port, registry=metrics.registry)
    instance_id = cluster_instance(cfg.cluster_name, cfg.instance_id or default_instance_id())
    events = EventPoster(kube, instance=instance_id)
    run_cache = RunCache(kube, cfg.namespaces)
    listener = OperatorListener(metrics, kube, events, instance_id=instance_id, run_cache=run_cache)
    scheduler = Scheduler(backend, instance_id=instance_id, listener=listener, clock=clock)
    scheduler.lag.add_backlog(backlog_ms)  # a replica whose API requests queue leaves new slots to the others
    pod_watch = PodWatch(kube, cfg.namespaces, follower=follower_label(instance_id))
    metrics.pod_watch_up.set_function(lambda: float(pod_watch.healthy))
    sharing = StoreSharing(backend, instance_id, run_cache.acted, clock.now_ms, every_s=cfg.store_check_s)
    metrics.store_not_shared.set_function(lambda: float(len(sharing.strangers)))
    shared = SharedSpecs(backend, cfg.cluster_name, clock.now_ms, every_s=cfg.store_check_s)
    controller = JobController(
        kube, scheduler, events, metrics, pod_watch, run_cache, resync_s=cfg.resync_s, sharing=sharing, shared=shared
    )
    sharing.on_change = controller.sharing_changed
    # Before any job is added: jobs come only from the job watch, which starts below.
    listener.bind(controller.specs.get, controller.status.refresh_soon, controller.status.note_missed)
    health = None
    if cfg.health_port:
        health = HealthServer(
            backend,
            lambda: scheduler.started,
            lambda: {
                "instance": instance_id,
                "jobs": len(scheduler.jobs),
                "storeNotSharedWith": sorted(sharing.strangers),
            },
            cfg.health_port,
        )
        await health.start()
    try:
        await _until_store_ready(scheduler, clock)
    except BaseException:
        if health is not None:
            await health.stop()
        raise
    gc.freeze()  # what start-up made stays; the collector no longer looks at it (see _tune_gc)
    try:
        await sharing.note()  # in the store before any claim: no replica may see us at work unnoted
    except StoreError as exc:
        log.warning("noting this replica in the store failed (tried again at each check): %s", exc)
    pod_watch.start()
    run_cache.start()
    job_watch = JobWatch(kube, job_handler(controller), cfg.namespaces)
    job_watch.start()
    sharing.start()
    shared.start()
    resync = asyncio.create_task(controller.resync(), name="anarchon-resync")
    stop = cfg.stop_flag or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "instance %s on store %s, watching %s on %s (credentials: %s)",
        instance_id,
        backend.capabilities.name,
        ",".join(cfg.namespaces) or "all namespaces",
        kube.endpoint.server,
        kube.endpoint.source,
    )
    try:
        await stop.wait()
        log.info("stopping: handing running attempts over")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        # No job is added or changed from here on (a job added while the scheduler stops would
        # start claiming again). Then, at once: stop claiming and release the leases of running
        # attempts, their Pods left running, so that a backup adopts each at its next check
        # instead of waiting for the lease to run out.
        await job_watch.stop()
        resync.cancel()
        await sharing.stop()
        await shared.stop()
        await scheduler.stop(handover=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(controller.status.flush(), FLUSH_S)  # what the job's status still lacks
        await pod_watch.stop()
        await run_cache.stop()
        if health is not None:
            await health.stop()
        await backend.close()
        await kube.close()


async def _until_store_ready(scheduler: Scheduler, clock: Clock) -> None:
    """Wait for the store rather than crash-loop when it is not up yet."""

    def failed(exc: BaseException, wait_ms: int | None) -> None:
        name = scheduler.backend.capabilities.name
        log.warning("store %s not ready: %s; retrying in %.1fs", name, exc, (wait_ms or 0) / 1000)

    await retry(scheduler.start, clock=clock, transient=lambda _: True, on_error=failed, delays=STORE_WAIT.delays())
