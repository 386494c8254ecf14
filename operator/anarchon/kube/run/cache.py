"""Every AnarchonRun of the replica's scope, kept by one watch: a job's runs read with no request.

A job's status refresh (when a run starts or ends) and its periodic resync need all of the
job's runs. A LIST by label selector makes the API server scan every AnarchonRun of the
namespace: with N jobs that is N scans per refresh round, N² work. One watch per replica
costs the server nothing per read.

What is read here may be a moment old, which every reader tolerates: the status is rewritten
at the next run's start or end, history limits only ever delete runs that are over (an older
copy can only keep a run one round longer), and mending asks the store before it writes.
One case would not be tolerated: a refresh right after our own write must see it, or the
job's active runs would lag until the run's end. So a runner hands what it wrote to
:meth:`RunCache.wrote`, and that copy is read instead until the watch delivers that very
version (events of an older one may still be on their way: the watch delivers an object's
changes in order, so only equality is checked, never which version is newer).

The watch also tells which replicas are at work: every write of a run's status names its
replica (``status.instance``), so :meth:`RunCache.heard_from` says when a replica last wrote
one. Another replica's skip is left to it while it is heard from (see :mod:`.listener`). And
only a replica itself adds an attempt naming it to a run (or ends a run Skipped in its name),
each time after its store let it claim or take over the run: :meth:`RunCache.acted` says
when the watch last delivered such a change by each replica (see :mod:`..job.sharing`).

The watch also brings a cancel (:data:`..constants.ANNOTATION_CANCEL`) to the runner of the run:
it registers for the run's :class:`CancelWake` (:meth:`RunCache.cancels`) while its attempt runs,
and the watch sets it as soon as it delivers the annotated object, or lists it after a break.

Held per object: metadata, spec and status, without managedFields (most of an object's size).
Until the first listing (or while the watch is down) :meth:`RunCache.runs_of` answers None and
the caller lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ...engine import RunState
from ..api.client import Kube
from ..api.watching import ScopedWatch, registered
from ..constants import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, RUNS
from .record import Cancel, cancel_of
from .runstatus import RunStatus

Key = tuple[str, str]  # namespace, name

#: How long our own write is read instead of the watch's copy at most. The watch delivers it
#: within milliseconds; the bound is for the write whose event came before :meth:`RunCache.wrote`
#: was called and was followed by another's write: never read a copy older than the watch's for long.
WRITTEN_FOR_S = 10.0
#: How long a deletion seen by the watch is remembered: longer than mending looks back (see
#: :data:`.mend.MISSING_LOOK_BACK_MS`), so that a run deleted by hand or by the history limits
#: is not written again from its store record. Pruned once more than DELETED_KEPT are held.
DELETED_FOR_S = 600.0
DELETED_KEPT = 10_000
#: Replicas whose last act is remembered at most (each rolling restart brings new ids): the
#: one seen at work longest ago is forgotten first.
ACTED_KEPT = 1_000


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _job(obj: dict[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB, ""))


def _actors(old: dict[str, Any] | None, new: dict[str, Any]) -> set[str]:
    """The replicas that acted in this change of a run: each attempt added names its own replica,
    and a run that became Skipped names the replica that skipped it."""
    before, after = RunStatus.of((old or {}).get("status")), RunStatus.of(new.get("status"))
    known = {(a.attempt, a.instance) for a in before.attempts}
    actors = {a.instance for a in after.attempts if a.instance and (a.attempt, a.instance) not in known}
    if after.phase is RunState.SKIPPED and before.phase is not RunState.SKIPPED and after.instance:
        actors.add(after.instance)
    return actors


class CancelWake(asyncio.Event):
    """Set once someone asked for the run to stop, with what they asked (:attr:`cancel`)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancel: Cancel | None = None

    def asked(self, run: dict[str, Any] | None) -> None:
        """Set it if ``run`` (the run's object, as last read or delivered) carries a cancel."""
        if not self.is_set() and (cancel := cancel_of(run)) is not None:
            self.cancel = cancel
            self.set()


class RunCache(ScopedWatch):
    """The AnarchonRuns of every watched namespace, by job."""

    what = "AnarchonRuns"
    resource = RUNS

    def __init__(self, kube: Kube, namespaces: Sequence[str] = (), *, server_timeout_s: int = 300) -> None:
        super().__init__(kube, namespaces, server_timeout_s=server_timeout_s)
        self.selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        self._runs: dict[Key, dict[str, Any]] = {}
        #: (namespace, job) -> names of its runs, so a job's runs are found without a scan.
        self._by_job: dict[Key, set[str]] = {}
        #: Our own writes the watch has not delivered yet, and when: read instead of the cached copy.
        self._written: dict[Key, tuple[dict[str, Any], float]] = {}
        #: (namespace, run name) -> when the watch saw it deleted (history limits, kubectl delete):
        #: mending must not write such a run again. Kept DELETED_FOR_S.
        self._deleted: dict[Key, float] = {}
        #: instance id -> when the watch last delivered a run whose status names it (a listing
        #: does not count: it shows what was written, not that its writer is still there).
        self._heard: dict[str, float] = {}
        #: instance id -> when the watch last delivered an attempt it added, or a slot it skipped.
        self._acted: dict[str, float] = {}
        #: (namespace, run name) -> the wakes of the attempts running it here (see :meth:`cancels`).
        self._cancels: dict[Key, set[CancelWake]] = {}

    def runs_of(self, namespace: str, job: str) -> list[dict[str, Any]] | None:
        """The job's runs by slot, as the watch last delivered them (and our newer writes);
        None while the cache is not live (not listed yet, or the watch is down)."""
        if not self.healthy:
            return None
        found = []
        now = time.monotonic()
        for name in list(self._by_job.get((namespace, job), ())):
            key = (namespace, name)
            written = self._written.get(key)
            if written is not None and now - written[1] > WRITTEN_FOR_S:
                del self._written[key]
                written = None
            obj = written[0] if written is not None else self._runs.get(key)
            if obj is not None:
                found.append(obj)
        found.sort(key=lambda r: int((r.get("spec") or {}).get("slot") or 0))
        return found

    @contextlib.contextmanager
    def cancels(self, namespace: str, name: str) -> Iterator[CancelWake]:
        """While within, the run's :class:`CancelWake`: set when its object carries a cancel,
        now (as the cache has it) or as soon as the watch delivers it."""
        key = (namespace, name)
        with registered(self._cancels, key, CancelWake()) as wake:
            written = self._written.get(key)
            wake.asked(written[0] if written is not None else self._runs.get(key))
            yield wake

    def wrote(self, obj: dict[str, Any]) -> None:
        """Our own write (a create's or update's reply): read it until the watch delivers it."""
        key = _key(obj)
        if not self.healthy:
            return  # nobody reads the cache, and the next listing has it
        if (cached := self._runs.get(key)) is not None and _version(cached) == _version(obj):
            return  # delivered already
        self._written[key] = (_slim(obj), time.monotonic())
        self._index(key, _job(obj))

    # -- the watch -------------------------------------------------------------------------------

    def _listed(self, scope: str, items: list[dict[str, Any]]) -> None:
        for key in [k for k in self._runs if not scope or k[0] == scope]:
            self._drop(key)
        for key in [k for k in self._written if not scope or k[0] == scope]:
            del self._written[key]  # the listing is at least as new as any write before it
        for obj in items:
            self._put(obj)

    def seen(self, namespace: str, name: str) -> bool | None:
        """Whether the run ``name`` exists, or the watch saw it deleted lately; None while the
        cache is not live (then nobody here knows)."""
        if not self.healthy:
            return None
        key = (namespace, name)
        return key in self._runs or key in self._written or key in self._deleted

    def deleted(self, namespace: str, name: str) -> bool:
        """Whether the watch saw the run ``name`` deleted lately (then it was not lost: leave it gone)."""
        return (namespace, name) in self._deleted

    def heard_from(self, instance: str) -> float | None:
        """When (``time.monotonic()``) the watch last delivered a run written by ``instance``
        (its status names it); None if never since this replica started."""
        return self._heard.get(instance)

    def acted(self) -> dict[str, float]:
        """Each replica seen at work, and when (``time.monotonic()``) the watch last delivered an
        attempt it started or a slot it skipped; not what a listing shows (that was written
        before, maybe long ago)."""
        return dict(self._acted)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        if kind == "DELETED":
            self._drop(key)
            now = time.monotonic()
            self._deleted[key] = now
            if len(self._deleted) > DELETED_KEPT:
                self._deleted = {k: t for k, t in self._deleted.items() if now - t <= DELETED_FOR_S}
            return
        written = self._written.get(key)
        if written is not None and _version(written[0]) == _version(obj):
            del self._written[key]  # delivered: from now on the watch's copy is as new
        now = time.monotonic()
        if instance := RunStatus.of(obj.get("status")).instance:
            self._heard[instance] = now
        for actor in _actors(self._runs.get(key), obj):
            self._acted.pop(actor, None)  # to the end: the dict is kept in the order of last acts
            self._acted[actor] = now
            if len(self._acted) > ACTED_KEPT:
                del self._acted[next(iter(self._acted))]
        self._put(obj)

    def _put(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        self._runs[key] = _slim(obj)
        self._index(key, _job(obj))
        for wake in self._cancels.get(key, ()):
            wake.asked(obj)

    def _index(self, key: Key, job: str) -> None:
        self._by_job.setdefault((key[0], job), set()).add(key[1])

    def _drop(self, key: Key) -> None:
        obj = self._runs.pop(key, None)
        written = self._written.pop(key, None)
        for held in (obj, written[0] if written is not None else None):
            if held is not None and (names := self._by_job.get((key[0], _job(held)))) is not None:
                names.discard(key[1])
                if not names:
                    del self._by_job[(key[0], _job(held))]
