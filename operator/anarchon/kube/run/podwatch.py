"""One watch per replica on the Pods Anarchon launched, to wake runners when their Pod changes.

Without it every runner reads its Pod every second: 500 running runs make 500 GETs a second
against the API server, and a finished Pod is seen up to a second late. With it a runner
sleeps until the watch says its Pod changed, and reads it then (plus a slow resync, so a
missed event can only delay, never lose, an outcome).

A wake-up carries the Pod as the event delivered it (:class:`PodChange`), so the runner
need not read it again: one GET when it starts following a Pod, then none per change. The
watch keeps no cache (only what it hands to the runners waiting on a Pod) and can be dropped
and restarted at any time; after a restart the runners read their Pods afresh. The watch is
server-side filtered by label (a watch without a selector would hold every Pod of the
cluster in memory). While it is down, runners fall back to polling.

Each replica watches only the Pods it follows: their :data:`.constants.LABEL_FOLLOWER` names it
(set at launch, moved by a runner that adopts a Pod): the Pod events are the largest a replica
decodes, and it would otherwise decode every replica's. A Pod whose label moved to another
replica leaves this watch with a DELETED event carrying its state before the move, as a
deletion would: so with a follower every DELETED only makes whoever waits on the Pod read it
afresh (a GET that answers 404 after a real deletion, rare while a runner follows its Pod). A
runner waits on the watch only for a Pod that carries its label (:meth:`PodWatch.covers`);
another it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from ..api.client import Kube
from ..api.watching import ScopedWatch, registered, uid_of
from ..constants import LABEL_FOLLOWER, LABEL_MANAGED_BY, MANAGED_BY
from .pods import follower_of

Key = tuple[str, str]


class PodChange(asyncio.Event):
    """Set at the next change of a Pod, with the Pod as the watch delivered it.

    ``delivered`` is True when :attr:`pod` holds the newest state the watch delivered (None:
    deleted). False when nothing was delivered, or the wake-up came from a watch restart
    (anything may have changed meanwhile): then whoever waited reads the Pod.

    The watch delivers every change in order, so a delivered state is never newer than the
    next one it will deliver: acting on it and waiting again misses nothing.

    ``uid`` is the uid of the Pod the change was about, also for a deletion: an earlier Pod of
    the same name (a lost Pod deleted before its try was launched again) is another Pod, and
    news of it, which a watch may deliver late, is no news of the one followed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pod: dict[str, Any] | None = None
        self.uid = ""
        self.delivered = False

    def deliver(self, pod: dict[str, Any] | None, uid: str) -> None:
        self.pod, self.uid, self.delivered = pod, uid, True
        self.set()

    def reread(self) -> None:
        self.pod, self.uid, self.delivered = None, "", False
        self.set()


class PodWatch(ScopedWatch):
    """Wakes whoever registered interest in a Pod when the API server reports a change to it."""

    what = "Pods"
    resource = "pods"
    list_limit = 1

    def __init__(
        self,
        kube: Kube,
        namespaces: Sequence[str] = (),
        *,
        follower: str | None = None,
        server_timeout_s: int = 300,
    ) -> None:
        """``follower``: this replica's :func:`.pods.follower_label`; None watches every Anarchon Pod."""
        super().__init__(kube, namespaces, server_timeout_s=server_timeout_s)
        self.follower = follower
        self.selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        if follower is not None:
            self.selector += f",{LABEL_FOLLOWER}={follower}"
        self._waiters: dict[Key, set[PodChange]] = {}

    def covers(self, pod: dict[str, Any] | None) -> bool:
        """Whether this watch delivers the changes of ``pod`` (it carries our follower label)."""
        return self.follower is None or follower_of(pod) == self.follower

    @contextlib.contextmanager
    def interest(self, namespace: str, name: str) -> Iterator[PodChange]:
        """An Event set at the next change of the Pod. Enter it *before* reading the Pod, so
        a change between the read and the wait is not lost."""
        with registered(self._waiters, (namespace, name), PodChange()) as event:
            yield event

    # -- the watch -------------------------------------------------------------------------------

    async def _list(self, scope: str) -> tuple[list[dict[str, Any]], str]:
        """Only the version: the Pods themselves are read by their runners."""
        _, version = await super()._list(scope)
        return [], version

    def _listed(self, scope: str, items: list[dict[str, Any]]) -> None:
        self._reread(scope)  # anything may have changed while nobody watched

    def _lost(self, scope: str) -> None:
        self._reread(scope)  # sleepers chose a long wait while the watch was up: they poll now

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        # Deleted, or relabelled for another replica (the event carries the Pod before the move).
        ambiguous = kind == "DELETED" and self.follower is not None
        for event in self._waiters.get((str(meta.get("namespace")), str(meta.get("name"))), ()):
            if ambiguous:
                event.reread()
            else:
                event.deliver(None if kind == "DELETED" else obj, uid_of(obj))

    def _reread(self, scope: str) -> None:
        """Everyone waiting on a Pod of the scope reads it afresh."""
        for (namespace, _), events in self._waiters.items():
            if not scope or namespace == scope:
                for event in events:
                    event.reread()


def interest_in(
    watch: PodWatch | None, namespace: str, name: str
) -> contextlib.AbstractContextManager[PodChange | None]:
    """:meth:`PodWatch.interest`, or None (nothing will wake you) when there is no watch."""
    return contextlib.nullcontext() if watch is None else watch.interest(namespace, name)


async def wait_for_change(
    watch: PodWatch | None,
    changed: asyncio.Event | None,
    stop: asyncio.Event,
    *,
    poll_s: float,
    resync_s: float,
    wake: asyncio.Event | None = None,
) -> None:
    """Sleep until ``stop`` is set, the Pod ``changed``, ``wake`` is set (a cancel), or it is time
    to read the Pod anyway.

    That time is ``resync_s`` while the watch is live (a missed event then only delays an
    outcome), ``poll_s`` otherwise (no watch, or it is down: plain polling).
    """
    watched = changed is not None and watch is not None and watch.healthy
    waits = [asyncio.ensure_future(stop.wait())]
    for event in (changed, wake):
        if event is not None:
            waits.append(asyncio.ensure_future(event.wait()))
    try:
        await asyncio.wait(waits, timeout=resync_s if watched else poll_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
