"""Kubernetes Events on AnarchonJobs: launches, skips, takeovers, adoptions, failures, bad specs.

Posted with the operator's own client, mostly from engine tasks, each post in one of the API
turns (:func:`.client.turn`): the engine's listener posts as background work. Posting is best
effort: an Event that cannot be posted is logged, never allowed to break a run.

Repeated Events are aggregated as Kubernetes' own components do (client-go's event
correlator): one Event object per involved object, reason, type and replica, whose ``count``
and ``lastTimestamp`` grow and whose message is the latest, instead of one object per slot. An
outage that misses every slot of every job then posts a handful of Events rather than
thousands, and ``kubectl describe`` shows ``(x120 over 20m)``. Unlike client-go, the message is
not part of the key: ours name the slot, so no two would ever match.

The Event's name is derived from that key, so a replica that restarts (same instance id) finds
and counts on its earlier Event instead of starting a second one. An Event the API server let
expire (its TTL, one hour by default) or that someone deleted is simply created again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..api.client import ApiException, Kube, path, turn
from ..constants import API_VERSION, JOB_KIND, MERGE
from ..job.spec import JobSpec

log = logging.getLogger("anarchon.kube.report.kube_events")

#: Events whose count and version this replica remembers, so that a repeat is a single patch.
#: One forgotten (many jobs, many reasons) costs a create answered AlreadyExists and a read;
#: with too few, nearly every Event is forgotten before its repeat (bench/README.md). About
#: 200 bytes each.
REMEMBERED = 16384


@dataclass
class _Seen:
    """What this replica last wrote to one Event: enough to patch it without reading it first."""

    count: int
    resource_version: str


@dataclass
class _Turn:
    """Posts of one Event take turns: two concurrent repeats must not both write count + 1."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class EventPoster:
    def __init__(self, kube: Kube, *, component: str = "anarchon", instance: str = "") -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._turns: dict[str, _Turn] = {}

    async def about(self, spec: JobSpec, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the AnarchonJob that ``spec`` was parsed from."""
        await self.post(
            namespace=spec.namespace, name=spec.name, uid=spec.uid, reason=reason, message=message, warning=warning
        )

    async def post(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        warning: bool = False,
        kind: str = JOB_KIND,
    ) -> None:
        event_type = "Warning" if warning else "Normal"
        key = "\0".join((kind, uid, name, reason, event_type, self.instance))
        event = f"{name}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        try:
            async with self._turn(event), turn():
                await self._post(namespace, event, name, uid, kind, reason, event_type, message[:1024])
        except Exception as exc:  # best effort by design
            log.warning("could not post event %s on %s/%s: %s", reason, namespace, name, exc)

    @contextlib.asynccontextmanager
    async def _turn(self, event: str) -> AsyncIterator[None]:
        turn = self._turns.setdefault(event, _Turn())
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[event]

    async def _post(
        self, namespace: str, event: str, name: str, uid: str, kind: str, reason: str, event_type: str, message: str
    ) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        seen = self._seen.pop(event, None)
        # At most: a patch refused (deleted, changed), a create refused (it is back), a patch.
        for _ in range(3):
            if seen is None:
                body = self._new(namespace, event, name, uid, kind, reason, event_type, message, now)
                try:
                    written = await self.kube.request("POST", path("events", namespace), body)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    # Ours from before a restart, or posted while we forgot it: count on it.
                    seen = await self._read(namespace, event)
                    continue
            else:
                patch = {
                    "metadata": {"resourceVersion": seen.resource_version},
                    "count": seen.count + 1,
                    "lastTimestamp": now,
                    "message": message,
                }
                try:
                    written = await self.kube.request(
                        "PATCH", path("events", namespace, event), patch, content_type=MERGE
                    )
                except ApiException as exc:
                    if exc.status == 404:
                        seen = None  # deleted, or expired: a new Event
                        continue
                    if exc.status != 409:
                        raise
                    seen = await self._read(namespace, event)  # changed by another writer: count on from it
                    continue
            self._remember(event, written)
            return
        raise RuntimeError(f"Event {namespace}/{event} kept changing under this replica's writes")

    async def _read(self, namespace: str, event: str) -> _Seen | None:
        try:
            current = await self.kube.request("GET", path("events", namespace, event))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return _seen(current)

    def _remember(self, event: str, written: dict[str, Any]) -> None:
        self._seen[event] = _seen(written)
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)

    def _new(
        self,
        namespace: str,
        event: str,
        name: str,
        uid: str,
        kind: str,
        reason: str,
        event_type: str,
        message: str,
        now: str,
    ) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event, "namespace": namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": kind,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message,
            "type": event_type,
            "source": {"component": self.component, "host": self.instance},
            "reportingComponent": self.component,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }


def _seen(event: dict[str, Any]) -> _Seen:
    return _Seen(int(event.get("count") or 1), str((event.get("metadata") or {}).get("resourceVersion") or ""))
