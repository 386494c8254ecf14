"""Manual runs: trigger requests on an AnarchonJob, each run once, none lost.

A request is an annotation whose value names a slot (an RFC3339 time, ms since the epoch, or
``now``), of one of two kinds:

* ``anarchon.io/trigger``: one request, as ``kubectl annotate`` (or a manifest) sets it. Once
  handled, its value is written to ``anarchon.io/trigger-handled`` and the request left in place:
  a manifest that carries it (GitOps) puts it back at every sync, and it must not run again,
  even once its run has left the store's history. A new value is a new request.
* ``anarchon.io/trigger.<id>``: one of a queue. ``anarchon trigger`` adds one under a new id each
  time (:func:`request_trigger`), onto the version of the job it read (409: read again), so no
  request overwrites another, whoever writes and whether replicas are up or not, and the
  queue's bound (:data:`.constants.MAX_PENDING_TRIGGERS`) holds against racing writers. Once
  handled, it is removed.

Every replica handles every request it sees: it claims the slot in the store like a scheduled
one, so exactly one replica runs it, then marks or removes the request, onto the version of the
job whose value it handled (a kubectl user may have set a new request under the same key
meanwhile: 409, read again). Claim first, settle after: whatever fails between the two (the replica dies, the
write fails, or succeeds with its reply lost), the request is still pending or already
settled, and its next handling (by any replica) finds the slot decided in the store (taken)
and only settles it. So the slot's record must outlive the pending request: the store's
pruning keeps the slots of pending requests (:meth:`Triggers.pending_slots`). Two requests for
the same slot are one run.

``now`` is fixed before anything claims it: the first replica to see it replaces it with its
clock's time (onto the version it read: one replica wins, the others read what it wrote);
otherwise each replica would claim a slot of its own.

Every such write is a JSON merge patch carrying the resourceVersion it was computed from
(:func:`update_annotations`), not a JSON patch whose ``test`` checks the value: the API server
compares that value with its own encoding of the object, which escapes ``&``, ``<`` and ``>``,
so a test of a value holding one of them never passed.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final

from ...engine import ConfigError, Scheduler
from ...engine.limits import MAX_SLOT_MS, MIN_SLOT_MS
from ..api.client import ApiException, Kube, call, path
from ..constants import (
    ANNOTATION_TRIGGER,
    ANNOTATION_TRIGGER_HANDLED,
    ANNOTATION_TRIGGER_REQUEST,
    JOBS,
    MAX_PENDING_TRIGGERS,
    MERGE,
)
from ..report.kube_events import EventPoster
from .spec import JobSpec, run_name, slot_time

_DIGITS = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The value that asks for a run at the time a replica first sees it.
NOW: Final = "now"
#: Tries of a conditional write that keeps meeting another writer's change (each one is read
#: again first): past them the write gives up for now.
WRITE_TRIES: Final = 10

#: A job's trigger requests: annotation key -> value.
Requests = dict[str, str]
#: What to write to a job's annotations, given them as they are: key -> value (None: remove
#: it); None or empty when nothing is left to write.
Change = Callable[[Mapping[str, Any]], dict[str, str | None] | None]


def parse_trigger(value: str) -> int | None:
    """The slot a trigger annotation names: ms since the epoch, or an RFC3339 time; None if neither.

    Only ASCII digits count as a number (``"²"`` and other Unicode digits pass ``str.isdigit``),
    and only slots every store can hold (:data:`~anarchon.engine.limits.MAX_SLOT_MS`, the end
    of year 9999): anything else is refused here, with an Event, rather than failing in the
    store on every event (PostgreSQL: bigint out of range; SQLite: OverflowError).
    """
    value = value.strip()
    if _DIGITS.fullmatch(value):
        # A bound on the length first: int() of thousands of digits is slow, then refused.
        slot = int(value) if len(value) <= len(str(MAX_SLOT_MS)) else MAX_SLOT_MS + 1
    else:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            slot = (parsed - _EPOCH) // timedelta(milliseconds=1)
        except (ValueError, OverflowError):
            return None
    return slot if MIN_SLOT_MS <= slot <= MAX_SLOT_MS else None


def pending_requests(annotations: Mapping[str, Any]) -> Requests:
    """The job's trigger requests not handled yet, by annotation key."""
    handled = annotations.get(ANNOTATION_TRIGGER_HANDLED)
    return {
        key: str(value)
        for key, value in annotations.items()
        if (key == ANNOTATION_TRIGGER and value != handled) or key.startswith(ANNOTATION_TRIGGER_REQUEST)
    }


def trigger_state(annotations: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What of a job's annotations its triggers' handling depends on: one value to compare."""
    keys = (ANNOTATION_TRIGGER, ANNOTATION_TRIGGER_HANDLED)
    return tuple(
        sorted((k, str(v)) for k, v in annotations.items() if k in keys or k.startswith(ANNOTATION_TRIGGER_REQUEST))
    )


class QueueFull(Exception):
    """The job holds :data:`.constants.MAX_PENDING_TRIGGERS` requests: no more is added."""

    def __init__(self, pending: int) -> None:
        super().__init__(f"{pending} requests pending")
        self.pending = pending


class Contended(Exception):
    """A conditional write met another writer's change at each of its :data:`WRITE_TRIES` tries."""


async def update_annotations(
    kube: Kube,
    namespace: str,
    name: str,
    change: Change,
    *,
    version: str | None = None,
    annotations: Mapping[str, Any] | None = None,
) -> tuple[str, dict[str, Any]] | None:
    """Write ``change(annotations)`` onto the version of the job it was computed from; the
    job's version and annotations then (as written, or as read when nothing was left to write),
    None if the job is gone.

    ``version`` and ``annotations``, when given, are what the caller last saw (a watch event),
    else the job is read. A 409 (someone wrote meanwhile, or our own write whose reply was lost,
    sent again) reads the job again and computes the change anew. Raises :class:`Contended`
    when every try met a newer version.
    """
    for _ in range(WRITE_TRIES):
        if version is None or annotations is None:
            try:
                meta = (await kube.get_job(namespace, name))["metadata"]
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            version, annotations = str(meta["resourceVersion"]), meta.get("annotations") or {}
        patch = change(annotations)
        if not patch:
            return version, dict(annotations)
        body = {"metadata": {"resourceVersion": version, "annotations": patch}}
        send = partial(kube.request, "PATCH", path(JOBS, namespace, name), body, content_type=MERGE)
        try:
            written = (await call(f"annotating job {namespace}/{name}", send))["metadata"]
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status != 409:
                raise
            version = None
            continue
        return str(written["resourceVersion"]), dict(written.get("annotations") or {})
    raise Contended(f"anarchonjob {namespace}/{name} changed under each of {WRITE_TRIES} tries to write it")


async def request_trigger(kube: Kube, namespace: str, name: str, at: str) -> str:
    """Add a request for a run at ``at`` to the job's queue; its annotation key.

    Written onto the version of the job it read, so that the bound holds against racing
    writers, and a write whose reply was lost is found on the next read rather than made twice.
    Raises :class:`QueueFull`, :class:`Contended`, and the API's 404 if there is no such job.
    """
    key = ANNOTATION_TRIGGER_REQUEST + secrets.token_hex(4)

    def add(annotations: Mapping[str, Any]) -> dict[str, str | None] | None:
        if annotations.get(key) == at:
            return None  # ours, written by a try whose reply was lost
        if (pending := len(pending_requests(annotations))) >= MAX_PENDING_TRIGGERS:
            raise QueueFull(pending)
        return {key: at}

    if await update_annotations(kube, namespace, name, add) is None:
        raise ApiException(404, "Not Found")  # as a read of the job would
    return key


def _order(request: tuple[str, str]) -> tuple[int, str]:
    """Requests are handled by slot (then key): the oldest first, as the schedule would have."""
    slot = parse_trigger(request[1])
    return (-1 if slot is None else slot, request[0])


class Triggers:
    """Handles the trigger requests of the jobs this replica serves: each claimed, then settled."""

    def __init__(self, kube: Kube, scheduler: Scheduler, events: EventPoster) -> None:
        self.kube = kube
        self.scheduler = scheduler
        self.events = events
        #: Per job (engine key), the requests (key, value) this replica has claimed or refused
        #: and not yet seen settled: a retry after a failed write, or an event that comes
        #: before our write shows, settles them without claiming again.
        self._decided: dict[str, set[tuple[str, str]]] = {}
        #: Per job, the slots of its pending requests: their store records must stay.
        self._slots: dict[str, list[int]] = {}

    def pending_slots(self, key: str) -> list[int]:
        """The slots the job's pending requests name, as last seen."""
        return self._slots.get(key, [])

    def forget(self, key: str) -> None:
        """The job is gone."""
        self._decided.pop(key, None)
        self._slots.pop(key, None)

    async def apply(self, spec: JobSpec, key: str, annotations: Mapping[str, Any], version: str | None) -> None:
        """Claim the slot of every request the job holds, then settle the requests.

        ``annotations`` are the job's at its resourceVersion ``version`` (a watch event's body).
        """
        requests = pending_requests(annotations)
        if not requests:
            self.forget(key)
            return
        decided = self._decided.setdefault(key, set())
        decided &= set(requests.items())
        at = slot_time(self.scheduler.clock.now_ms())

        def fix_now(annotations: Mapping[str, Any]) -> dict[str, str | None] | None:
            return {k: at for k, v in pending_requests(annotations).items() if v.strip() == NOW}

        fixed = await update_annotations(
            self.kube, spec.namespace, spec.name, fix_now, version=version, annotations=annotations
        )
        if fixed is None:
            return  # the job is gone
        version, annotations = fixed
        requests = pending_requests(annotations)
        self._slots[key] = sorted(s for v in requests.values() if (s := parse_trigger(v)) is not None)
        for request in sorted(requests.items(), key=_order):
            if request not in decided:
                await self._decide(spec, key, *request)
                decided.add(request)

        def settle(annotations: Mapping[str, Any]) -> dict[str, str | None] | None:
            """Mark ``anarchon.io/trigger`` handled, remove the queued requests: those decided,
            each only while it still has the value decided."""
            pending = pending_requests(annotations)
            patch: dict[str, str | None] = {}
            for k, v in decided:
                if pending.get(k) == v:
                    patch.update({ANNOTATION_TRIGGER_HANDLED: v} if k == ANNOTATION_TRIGGER else {k: None})
            return patch

        await update_annotations(self.kube, spec.namespace, spec.name, settle, version=version, annotations=annotations)

    async def _decide(self, spec: JobSpec, key: str, name: str, value: str) -> None:
        """Claim the request's slot (won or taken, the store has decided it), or refuse its value."""
        slot = parse_trigger(value)
        if slot is None:
            why = "is not a time between 1970 and 9999 (RFC3339, ms since the epoch, or now)"
            await self._refuse(spec, name, value, why)
            return
        try:
            result = await self.scheduler.trigger(key, slot)
        except ConfigError as exc:  # a slot the engine refuses is refused like a bad value: once
            await self._refuse(spec, name, value, f"was refused: {exc}")
            return
        if result.won:
            await self.events.about(
                spec,
                reason="Triggered",
                message=f"manual run {run_name(spec.name, slot)} claimed by {self.scheduler.instance_id}",
            )

    async def _refuse(self, spec: JobSpec, name: str, value: str, why: str) -> None:
        """A BadTrigger Event; the request is settled with the others, so later ones go on as usual."""
        shown = value if len(value) <= 60 else value[:57] + "..."
        await self.events.about(spec, reason="BadTrigger", message=f"annotation {name}={shown!r} {why}", warning=True)
