"""One watch per replica on the Pods Anarchon launched, to wake runners when their Pod changes.

Without it every runner reads its Pod every second: 500 running runs make 500 GETs a second
against the API server, and a finished Pod is seen up to a second late. With it a runner
sleeps until the watch says its Pod changed, and reads it then (plus a slow resync, so a
missed event can only delay, never lose, an outcome).

Only the fact of a change is taken from the watch, never the Pod itself: the runner reads
the Pod it acts on, so the watch needs no cache and can be dropped and restarted at any
time. The watch is server-side filtered by label (kopf cannot do that, and would otherwise
hold every Pod of the cluster in memory). While it is down, runners fall back to polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any, cast

import aiohttp

from .client import ApiException, Kube
from .constants import LABEL_MANAGED_BY, MANAGED_BY

log = logging.getLogger("anarchon.kube.podwatch")

Key = tuple[str, str]


class PodWatch:
    """Wakes whoever registered interest in a Pod when the API server reports a change to it."""

    def __init__(
        self,
        kube: Kube,
        namespaces: Sequence[str] = (),
        *,
        selector: str = f"{LABEL_MANAGED_BY}={MANAGED_BY}",
        server_timeout_s: int = 300,
    ) -> None:
        self.kube = kube
        self.selector = selector
        self.server_timeout_s = server_timeout_s
        self._scopes = list(namespaces) or [""]  # "": every namespace
        self._watching = dict.fromkeys(self._scopes, False)
        self._waiters: dict[Key, set[asyncio.Event]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def healthy(self) -> bool:
        """True while every watched scope has a live watch: runners may then sleep long."""
        return bool(self._tasks) and all(self._watching.values())

    def start(self) -> None:
        for scope in self._scopes:
            self._tasks.append(asyncio.create_task(self._run(scope), name=f"anarchon-podwatch:{scope or '*'}"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @contextlib.contextmanager
    def interest(self, namespace: str, name: str) -> Iterator[asyncio.Event]:
        """An Event set at the next change of the Pod. Enter it *before* reading the Pod, so
        a change between the read and the wait is not lost."""
        event = asyncio.Event()
        key = (namespace, name)
        self._waiters.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    # -- the watch -------------------------------------------------------------------------------

    def _wake(self, key: Key) -> None:
        for event in self._waiters.get(key, ()):
            event.set()

    def _wake_scope(self, scope: str) -> None:
        """Anything may have changed while the watch was down: everyone in the scope rereads."""
        for (namespace, _), events in self._waiters.items():
            if not scope or namespace == scope:
                for event in events:
                    event.set()

    async def _run(self, scope: str) -> None:
        delay = 0.5
        while True:
            try:
                version = await self._list(scope)
                self._watching[scope] = True
                self._wake_scope(scope)
                delay = 0.5
                await self._watch(scope, version)  # returns when the version is too old: list again
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watching Pods in %s failed (%s); runners poll until it is back", scope or "*", exc)
                self._watching[scope] = False
                self._wake_scope(scope)  # sleepers chose a long wait while the watch was up
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            finally:
                self._watching[scope] = False

    async def _list(self, scope: str) -> str:
        core = self.kube.core
        if scope:
            listing = await core.list_namespaced_pod(scope, label_selector=self.selector, limit=1)
        else:
            listing = await core.list_pod_for_all_namespaces(label_selector=self.selector, limit=1)
        return str(listing.metadata.resource_version)

    async def _watch(self, scope: str, version: str) -> None:
        core = self.kube.core
        while True:
            options: dict[str, Any] = {
                "label_selector": self.selector,
                "watch": True,
                "allow_watch_bookmarks": True,
                "resource_version": version,
                "timeout_seconds": self.server_timeout_s,
                "_preload_content": False,
                "_request_timeout": self.server_timeout_s + 30,
            }
            # Without preloading, the client hands back the raw aiohttp response to stream from.
            if scope:
                raw: Any = await core.list_namespaced_pod(scope, **options)
            else:
                raw = await core.list_pod_for_all_namespaces(**options)
            response = cast(aiohttp.ClientResponse, raw)
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            return  # our version is too old for the server: list again
                        raise ApiException(status=obj.get("code"), reason=str(obj.get("message")))
                    meta = obj.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self._wake((str(meta.get("namespace")), str(meta.get("name"))))
            finally:
                response.release()


def interest_in(
    watch: PodWatch | None, namespace: str, name: str
) -> contextlib.AbstractContextManager[asyncio.Event | None]:
    """:meth:`PodWatch.interest`, or None (nothing will wake you) when there is no watch."""
    return contextlib.nullcontext() if watch is None else watch.interest(namespace, name)


async def wait_for_change(
    watch: PodWatch | None, changed: asyncio.Event | None, stop: asyncio.Event, *, poll_s: float, resync_s: float
) -> None:
    """Sleep until ``stop`` is set, the Pod ``changed``, or it is time to read it anyway.

    That time is ``resync_s`` while the watch is live (a missed event then only delays an
    outcome), ``poll_s`` otherwise (no watch, or it is down: plain polling).
    """
    watched = changed is not None and watch is not None and watch.healthy
    waits = [asyncio.ensure_future(stop.wait())]
    if changed is not None:
        waits.append(asyncio.ensure_future(changed.wait()))
    try:
        await asyncio.wait(waits, timeout=resync_s if watched else poll_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
