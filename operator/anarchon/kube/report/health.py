"""Liveness and readiness endpoints, served from the start of the process.

Both answer before the store is reachable, and differ on purpose:

- ``/healthz`` (liveness) is 200 whenever the event loop answers. A replica waiting for its
  store is alive and retrying; restarting it would not bring the store back, and
  Kubernetes restarting it over and over would only turn an outage into a crash loop.
- ``/readyz`` (readiness) is 200 only once the scheduler has started on its store and while
  the store answers a ping. An unready replica claims nothing, so ``kubectl get pods`` shows
  at once which replicas take part.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ...engine import Store

log = logging.getLogger("anarchon.kube")

PING_TIMEOUT_S = 3.0


class HealthServer:
    def __init__(
        self,
        backend: Store,
        started: Callable[[], bool],
        describe: Callable[[], dict[str, Any]],
        port: int,
        host: str = "0.0.0.0",
    ) -> None:
        self.backend = backend
        self.started = started
        self.describe = describe
        self.port = port
        self.host = host
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._live)
        app.router.add_get("/readyz", self._ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("health endpoints on %s:%d (/healthz, /readyz)", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _live(self, _: web.Request) -> web.Response:
        return _json(200, {"alive": True, **self.describe()})

    async def _ready(self, _: web.Request) -> web.Response:
        store = self.backend.capabilities.name
        try:
            await asyncio.wait_for(self.backend.ping(), PING_TIMEOUT_S)
        except Exception as exc:  # a probe answers 503 for any failure, never 500
            reason = str(exc) or f"no answer within {PING_TIMEOUT_S:g}s"
            return _json(503, {"ready": False, "store": store, "error": reason, **self.describe()})
        if not self.started():
            reason = "the store answers; setting it up"
            return _json(503, {"ready": False, "store": store, "error": reason, **self.describe()})
        return _json(200, {"ready": True, "store": store, **self.describe()})


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")
