"""Wiring: one process = one instance = kopf (watching, standalone) + the engine's Scheduler.

kopf is used only for what it is good at here: watching AnarchonJobs. Liveness and readiness
are served by :mod:`.health` from the first moment, before the store answers.
Its peering is off (every replica is active; the store picks one winner per slot), its
state-tracking handlers are unused (they would make replicas fight over annotations), and
its event posting is off (we post our own, from engine tasks outside handler contexts).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
from prometheus_client import start_http_server

from ..engine import Scheduler, SystemClock, default_instance_id, observed
from ..engine.backends import from_url
from .client import API_CONCURRENCY, Kube, connect
from .constants import GROUP, JOBS, VERSION
from .controller import JobController
from .events import EventPoster
from .health import HealthServer
from .listener import OperatorListener
from .metrics import Metrics
from .podwatch import PodWatch
from .runcache import RunCache

log = logging.getLogger("anarchon.kube")


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
    stop_flag: asyncio.Event | None = None


def build_registry(
    controller: JobController, scheduler: Scheduler, kube: Kube, *, namespaced: bool
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        """Give kopf the credentials our own client resolved (kubeconfig or in-cluster)."""
        cfg = kube.api.configuration
        keys: dict[str, str] = dict(cfg.api_key or {})
        bearer = keys.get("BearerToken") or keys.get("authorization") or ""
        scheme, _sep, token = bearer.partition(" ")
        return kopf.ConnectionInfo(
            server=str(cfg.host),
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            scheme=scheme or None,
            token=token or None,
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
        )

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True
        settings.posting.enabled = False
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 60
        # On SIGTERM kopf gives busy event handlers this long before it cancels them, and only
        # then runs the cleanup handler that hands running attempts over: its default (2 s)
        # would be most of the hand-over's time. A handler cut short is redone by whichever
        # replica gets the job's next event, as after a SIGKILL.
        settings.queueing.exit_timeout = 0.5
        if namespaced:
            settings.scanning.disabled = True

    @kopf.on.cleanup(registry=registry)
    async def hand_over(**_: Any) -> None:
        """On SIGTERM, before kopf cancels every task it did not start (our job loops among them).

        Stops claiming at once and releases the leases of running attempts, their Pods left
        running: a backup adopts each at its next check instead of waiting for the lease
        to run out.
        """
        log.info("stopping: handing running attempts over")
        await scheduler.stop(handover=True)

    @kopf.on.event(GROUP, VERSION, JOBS, registry=registry)
    async def job_event(**kwargs: Any) -> None:
        event: dict[str, Any] = kwargs["event"]
        body: kopf.Body = kwargs["body"]
        meta = body.get("metadata") or {}
        if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
            await controller.remove(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
            return None
        try:
            await controller.apply(dict(body))
        except Exception:  # one bad job must never take the operator down
            log.exception(
                "handling %s/%s failed; will retry on the next event", meta.get("namespace"), meta.get("name")
            )
        return None

    return registry


async def run_operator(cfg: OperatorConfig) -> None:
    """Run one replica until stopped.

    The store URL and the credentials are read first, before any port is opened: a URL that
    cannot work raises :class:`ConfigError`, missing credentials :class:`CredentialsError`,
    and the command line turns both into one line and exit code 2 rather than a crash loop.
    """
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
    instance_id = cfg.instance_id or default_instance_id()  # the Scheduler's own default
    events = EventPoster(kube, instance=cfg.instance_id)
    listener = OperatorListener(metrics, kube, events, instance_id=instance_id)
    scheduler = Scheduler(backend, instance_id=instance_id, listener=listener, clock=clock)
    pod_watch = PodWatch(kube, cfg.namespaces)
    metrics.pod_watch_up.set_function(lambda: float(pod_watch.healthy))
    run_cache = RunCache(kube, cfg.namespaces)
    controller = JobController(kube, scheduler, events, metrics, pod_watch, run_cache, resync_s=cfg.resync_s)
    # Before any job is added: jobs come only from kopf's watch events, which start below.
    listener.bind(controller.specs.get, controller.status.refresh)
    health = None
    if cfg.health_port:
        health = HealthServer(
            backend,
            lambda: scheduler.started,
            lambda: {"instance": cfg.instance_id, "jobs": len(scheduler.jobs)},
            cfg.health_port,
        )
        await health.start()
    try:
        await _until_store_ready(scheduler)
    except BaseException:
        if health is not None:
            await health.stop()
        raise
    pod_watch.start()
    run_cache.start()
    resync = asyncio.create_task(controller.resync(), name="anarchon-resync")
    registry = build_registry(controller, scheduler, kube, namespaced=bool(cfg.namespaces))
    log.info(
        "instance %s on store %s, watching %s",
        cfg.instance_id,
        backend.capabilities.name,
        ",".join(cfg.namespaces) or "all namespaces",
    )
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=not cfg.namespaces,
            namespaces=cfg.namespaces,
            stop_flag=cfg.stop_flag,
        )
    finally:
        resync.cancel()
        # Normally done already by the cleanup handler; here for a kopf that ended otherwise.
        await scheduler.stop(handover=True)
        await pod_watch.stop()
        await run_cache.stop()
        if health is not None:
            await health.stop()
        await backend.close()
        await kube.close()


async def _until_store_ready(scheduler: Scheduler) -> None:
    """Wait for the store rather than crash-loop when it is not up yet."""
    delay = 0.5
    while True:
        try:
            await scheduler.start()
            return
        except Exception as exc:
            log.warning("store %s not ready: %s; retrying in %.1fs", scheduler.backend.capabilities.name, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 15)
