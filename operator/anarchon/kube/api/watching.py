"""List, then watch for ever: the loop shared by the replica's own watches (Pods, AnarchonRuns).

Every watch of a replica (AnarchonJobs, AnarchonRuns, Pods by a server-side label selector) is one
of these: reads that cost no request.
Each scope (a namespace, or "" for all) has one task: it lists, then watches from the
listing's version; a watch that ends is resumed from the last version seen; only when the
server no longer has that version (410 Gone) does it list again. Errors back off up to 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, TypeVar

import orjson

from ...engine import SystemClock
from ...engine.retry import Backoff, retry
from .client import ApiException, Kube, path

log = logging.getLogger("anarchon.kube.api.watching")

#: How a failed list or watch is tried again: within a second, then up to every 30 s.
WATCH_RETRY = Backoff(first_ms=500, max_ms=30_000)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T", bound=Hashable)


class ScopedWatch:
    """One list-then-watch loop per scope; subclasses say what to list and what an event means."""

    #: What is watched, for logs and task names.
    what = "objects"
    #: The resource (its URL path's plural) and the label selector the server filters it by.
    resource = ""
    selector: str | None = None
    #: Objects per listing at most (None: all); a subclass that needs only the version asks for 1.
    list_limit: int | None = None

    def __init__(self, kube: Kube, namespaces: Sequence[str] = (), *, server_timeout_s: int = 300) -> None:
        self.kube = kube
        self.server_timeout_s = server_timeout_s
        self._scopes = list(namespaces) or [""]  # "": every namespace
        self._watching = dict.fromkeys(self._scopes, False)
        self._tasks: list[asyncio.Task[None]] = []
        self._clock = SystemClock()

    @property
    def healthy(self) -> bool:
        """True while every scope has a live watch (listed, and watching since)."""
        return bool(self._tasks) and all(self._watching.values())

    def start(self) -> None:
        for scope in self._scopes:
            self._tasks.append(asyncio.create_task(self._run(scope), name=f"anarchon-watch:{self.what}:{scope or '*'}"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- what subclasses say ---------------------------------------------------------------------

    async def _list(self, scope: str) -> tuple[list[dict[str, Any]], str]:
        """The scope's objects (as API dicts) and the listing's resourceVersion."""
        params = {"labelSelector": self.selector, "limit": self.list_limit}
        listing = await self.kube.request("GET", path(self.resource, scope or None), params=params)
        return list(listing.get("items") or []), str(listing["metadata"]["resourceVersion"])

    def _listed(self, scope: str, items: list[dict[str, Any]]) -> None:
        """The scope was listed afresh (at start, or after the watch broke off): ``items`` is all of it."""

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED, with the object."""

    def _lost(self, scope: str) -> None:
        """The scope's watch failed: whatever was known of it may be stale until the next listing."""

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self, scope: str) -> None:
        delays = WATCH_RETRY.delays()

        async def session() -> None:
            try:
                items, version = await self._list(scope)
                self._listed(scope, items)
                self._watching[scope] = True
                delays.reset()  # listed: a failure from here on is a first one again
                await self._watch(scope, version)  # returns when the version is too old: list again
            finally:
                self._watching[scope] = False

        def failed(exc: BaseException, wait_ms: int | None) -> None:
            log.warning(
                "watching %s in %s failed (%s); retrying in %.1fs", self.what, scope or "*", exc, (wait_ms or 0) / 1000
            )
            self._lost(scope)

        while True:
            await retry(session, clock=self._clock, transient=lambda _: True, on_error=failed, delays=delays)

    async def _watch(self, scope: str, version: str) -> None:
        while True:
            params = {
                "watch": True,
                "allowWatchBookmarks": True,
                "resourceVersion": version,
                "timeoutSeconds": self.server_timeout_s,
                "labelSelector": self.selector,
            }
            response = await self.kube.stream(path(self.resource, scope or None), params, self.server_timeout_s + 30)
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            return  # our version is too old for the server: list again
                        raise ApiException.of(int(obj.get("code") or 0), str(obj.get("reason") or ""), line)
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self._event(str(event.get("type")), obj)
            finally:
                response.release()


@contextlib.contextmanager
def registered(table: dict[K, set[T]], key: K, item: T) -> Iterator[T]:
    """``item`` among ``table[key]`` while within: what a watch wakes when an object changes (the
    key leaves the table with its last item, so the table holds only what someone waits on)."""
    table.setdefault(key, set()).add(item)
    try:
        yield item
    finally:
        items = table.get(key)
        if items is not None:
            items.discard(item)
            if not items:
                del table[key]


def uid_of(obj: dict[str, Any] | None) -> str:
    """The object's uid ("" if it has none): what tells two objects of the same name apart."""
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")
