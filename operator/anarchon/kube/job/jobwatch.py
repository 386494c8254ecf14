"""The replica's watch on AnarchonJobs: each job's changes handed to the controller, one at a time.

Every replica handles every job (all are active), and writes nothing on the objects but their
status and the trigger requests it handled (marked or removed): no finalizers. So the watch needs no
more than the loop shared by the other watches (:mod:`.watching`) and, per job, one worker that
hands over the newest state of the job, never two at once for the same job: a job that changes
again while its last change is being handled is handled once more afterwards, with its newest
body (the ones in between are skipped: each body is the whole job, every pending trigger
request included, one annotation each: see :mod:`.triggers`). A change whose handling failed
is tried again, with a backoff, until it is done or a newer change of the job supersedes it.

A listing (at start, and after the watch broke off) hands over every job it holds, and a
deletion for each job this replica knew in the scope that is no longer there: deleted while
nobody watched.

Its cost per event is a JSON decode and a dict lookup: the replicas' own status writes (one or
two per run, see :mod:`.status`) wake every replica, and the controller only updates the job's
metrics from them (:meth:`.JobController.apply` parses nothing for a change of the status alone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...engine.retry import Backoff, retry
from ..api.client import Kube, transient
from ..api.watching import ScopedWatch, uid_of
from ..constants import JOBS

log = logging.getLogger("anarchon.kube.job.jobwatch")

#: How a change whose handling failed is tried again: within a second, then up to every minute.
RETRY = Backoff(first_ms=1_000, max_ms=60_000)

#: What the watch hands over: "ADDED", "MODIFIED" or "DELETED", and the job's body.
Handler = Callable[[str, dict[str, Any]], Awaitable[None]]


class JobWatch(ScopedWatch):
    """Hands every change of the AnarchonJobs in scope to ``handle``, one at a time per job."""

    what = "AnarchonJobs"
    resource = JOBS

    def __init__(
        self, kube: Kube, handle: Handler, namespaces: Sequence[str] = (), *, server_timeout_s: int = 300
    ) -> None:
        super().__init__(kube, namespaces, server_timeout_s=server_timeout_s)
        self.handle = handle
        #: The jobs this replica knows (by uid), to say which ones a listing lacks: only what
        #: names each (a deletion is handed over with it). Whole bodies, with their managed
        #: fields and last-applied annotation, would be most of a replica's memory.
        self._known: dict[str, dict[str, Any]] = {}
        #: Per job (uid), the newest change not handed over yet.
        self._pending: dict[str, tuple[str, dict[str, Any]]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}

    async def stop(self) -> None:
        await super().stop()
        workers, self._workers = list(self._workers.values()), {}
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def idle(self) -> None:
        """Wait until every change seen so far has been handled (for tests and a clean stop)."""
        while self._workers:
            await asyncio.gather(*list(self._workers.values()), return_exceptions=True)

    # -- the watch -------------------------------------------------------------------------------

    def _listed(self, scope: str, items: list[dict[str, Any]]) -> None:
        present = {uid_of(obj) for obj in items}
        gone = [
            body
            for uid, body in self._known.items()
            if uid not in present and (not scope or (body.get("metadata") or {}).get("namespace") == scope)
        ]
        for body in gone:
            self._event("DELETED", body)
        for obj in items:
            self._event("ADDED", obj)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        uid = uid_of(obj)
        if not uid:
            return
        if kind == "DELETED":
            self._known.pop(uid, None)
        elif uid not in self._known:
            meta = obj.get("metadata") or {}
            self._known[uid] = {"metadata": {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": uid}}
        self._pending[uid] = (kind, obj)
        if uid not in self._workers:
            self._workers[uid] = asyncio.create_task(self._work(uid), name=f"anarchon-job:{uid}")

    async def _work(self, uid: str) -> None:
        try:
            while (change := self._pending.pop(uid, None)) is not None:
                await self._handle(uid, *change)
        finally:
            self._workers.pop(uid, None)

    async def _handle(self, uid: str, kind: str, body: dict[str, Any]) -> None:
        """Hand one change over; one that fails is tried again (with a backoff), not left for a
        next change that may never come, until it is done or a newer change supersedes it."""
        meta = body.get("metadata") or {}
        what = f"{meta.get('namespace')}/{meta.get('name')}"

        async def once() -> None:
            await self.handle(kind, body)

        def failed(exc: BaseException, _wait_ms: int | None) -> None:
            # A bug (not the API server or the store failing) shows its traceback.
            log.warning(
                "handling %s failed (%s: %s); trying again", what, type(exc).__name__, exc, exc_info=not transient(exc)
            )

        try:
            await retry(
                once,
                clock=self._clock,
                transient=lambda _: uid not in self._pending,
                on_error=failed,
                delays=RETRY.delays(),
            )
        except Exception as exc:
            log.warning(
                "handling %s failed (%s: %s); its newer change is handled instead", what, type(exc).__name__, exc
            )
