"""What the page shows, kept live: the AnarchonJobs, AnarchonRuns and Events in scope.

Each is one list-then-watch loop of the operator's own (:class:`anarchon.kube.api.watching.ScopedWatch`),
with the user's credentials: a page is drawn from memory, never from a request per view, and an
open page hears of a change through :meth:`Model.subscribe` (the server turns it into a
server-sent event). A change is named by *topics* (``jobs`` when a job comes or goes,
``job:NS/NAME``, ``run:NS/NAME``, ``runs:NS/JOB``, ``events:NS/JOB``, ``*`` after a listing), so
that a page, or one row of it, refreshes only for what it shows.

What is kept of each object is what the pages read, worked out once per version of it rather
than at each request: a job's :class:`JobFacts`, a run's record (:func:`run_view`), an Event's
fields. Listings are read a page at a time, each page reduced so before the next is read: the
API server's whole answer (all of 10,000 runs, say) is never held at once.

What the user may not list or watch is kept as the API server's own message (:attr:`Model.errors`),
shown on every page, rather than an empty table that says nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..cli.records import job_record, run_record
from ..engine.schedule import Schedule
from ..kube.api.client import ApiException, Kube, path
from ..kube.api.watching import ScopedWatch
from ..kube.constants import JOB_KIND, JOBS, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, RUNS
from ..kube.job.spec import SpecError, parse_job
from .words import in_words

Key = tuple[str, str]
#: The last changes kept for a page that connects after it was drawn (:meth:`Model.since`).
CHANGES_KEPT = 1000
#: What is kept of an object (:class:`Watched`).
V = TypeVar("V")
#: A retry's Pod is ``<run>-r<n>`` (:func:`anarchon.kube.job.spec.pod_name`).
_RETRY_POD = re.compile(r"-r[0-9]+$")
#: A run's Pod: ``<job>-<slot in s or ms>``, then ``-r<n>`` for a retry (:func:`anarchon.kube.job.spec.run_name`).
_RUN_POD = re.compile(r"-[0-9]{1,13}(-r[0-9]+)?$")
#: The fields of an Event the run's story shows.
_EVENT_FIELDS = (
    "involvedObject",
    "reason",
    "message",
    "type",
    "count",
    "firstTimestamp",
    "lastTimestamp",
    "eventTime",
    "source",
    "reportingController",
)


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def job_of(run: dict[str, Any]) -> str:
    return str(((run.get("metadata") or {}).get("labels") or {}).get(LABEL_JOB) or (run.get("spec") or {}).get("job"))


def run_of_pod(pod: str) -> str:
    """The run a Pod belongs to: its own name, less a retry's ``-r<n>``."""
    return _RETRY_POD.sub("", pod)


def event_view(event: dict[str, Any]) -> dict[str, Any]:
    """What the run's story shows of an Event."""
    return {k: event.get(k) for k in _EVENT_FIELDS}


def run_view(run: dict[str, Any]) -> dict[str, Any]:
    """What the pages show of a run: its record (:func:`anarchon.cli.records.run_record`), its
    job, and the Pod its status names."""
    return run_record(run) | {"job": job_of(run), "podName": (run.get("status") or {}).get("podName")}


@dataclass(frozen=True)
class JobFacts:
    """What the pages show of a job that follows from its object alone."""

    #: :func:`anarchon.cli.records.job_record`, less ``nextScheduleTime``: that moves with the
    #: clock (the pages ask the ``schedule`` for the next times at each request).
    record: dict[str, Any]
    #: The schedule in words, and the schedule; None if the spec is invalid.
    words: str | None
    schedule: Schedule | None
    #: Ready, Suspended, or Invalid with the reason.
    ready: str
    #: Its windows of missed slots (``status.missed``).
    missed: list[dict[str, Any]]

    @property
    def namespace(self) -> str:
        return str(self.record["namespace"])

    @property
    def name(self) -> str:
        return str(self.record["name"])


def _ready(job: dict[str, Any], record: dict[str, Any]) -> str:
    """Ready, Suspended, or Invalid with the reason: the operator's conditions, else what the spec says."""
    if record["problems"]:
        return "Invalid: " + "; ".join(record["problems"])
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []}
    invalid, ready = conditions.get("Invalid"), conditions.get("Ready")
    if invalid and invalid.get("status") == "True":
        return f"Invalid: {invalid.get('message')}"
    if ready is None:
        return "Unknown: no replica has written the job's status"
    if ready.get("status") == "True":
        return "Ready"
    return f"{ready.get('reason')}: {ready.get('message')}"


def job_facts(job: dict[str, Any]) -> JobFacts:
    record = job_record(job, time.time_ns() // 1_000_000)
    del record["nextScheduleTime"]
    try:
        schedule: Schedule | None = parse_job(job).schedule
    except SpecError:
        schedule = None
    words = None if schedule is None else in_words(schedule)
    missed = list((job.get("status") or {}).get("missed") or [])
    return JobFacts(record, words, schedule, _ready(job, record), missed)


class Watched(ScopedWatch, Generic[V]):
    """The objects of one resource in scope, kept as ``view(obj)``, by (namespace, name); each
    change told to ``changed`` with its topics."""

    #: Objects per request of a listing.
    page_size = 500

    def __init__(
        self,
        kube: Kube,
        namespaces: Sequence[str],
        *,
        resource: str,
        what: str,
        view: Callable[[dict[str, Any]], V],
        topics: Callable[[str, dict[str, Any]], Iterable[str]],
        changed: Callable[[set[str]], None],
        selector: str | None = None,
        keep: Callable[[dict[str, Any]], bool] = lambda _: True,
        group: Callable[[dict[str, Any]], Key] = key_of,
    ) -> None:
        super().__init__(kube, namespaces)
        self.resource, self.what, self.selector = resource, what, selector
        self.objects: dict[Key, V] = {}
        #: The keys of the objects by ``group(obj)`` (the runs of a job), found without a scan.
        self.groups: dict[Key, set[Key]] = {}
        self._group_of: dict[Key, Key] = {}
        #: Per scope ("" for every namespace), why it cannot be listed: the API server's words.
        self.errors: dict[str, str] = {}
        self._view, self._topics, self._changed, self._keep, self._group = view, topics, changed, keep, group
        #: Set once every scope's first list answered (with its objects or a refusal).
        self.answered = asyncio.Event()
        self._unanswered = set(namespaces) or {""}

    def _answer(self, scope: str) -> None:
        self._unanswered.discard(scope)
        if not self._unanswered:
            self.answered.set()

    def group(self, key: Key) -> list[V]:
        return [self.objects[k] for k in self.groups.get(key, ())]

    def _put(self, kept: dict[str, Any]) -> None:
        key, group = kept["key"], kept["group"]
        self._drop(key)
        self.objects[key], self._group_of[key] = kept["view"], group
        self.groups.setdefault(group, set()).add(key)

    def _drop(self, key: Key) -> None:
        self.objects.pop(key, None)
        group = self._group_of.pop(key, None)
        if group is not None and (keys := self.groups.get(group)) is not None:
            keys.discard(key)
            if not keys:
                del self.groups[group]

    def _kept(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What is kept of ``obj``: its key, its group's, its view."""
        return {"key": key_of(obj), "group": self._group(obj), "view": self._view(obj)}

    async def _list(self, scope: str) -> tuple[list[dict[str, Any]], str]:
        from ..cli.common import api_failure

        try:
            found = await self._pages(scope)
        except ApiException as exc:
            self.errors[scope] = str(await api_failure(self.kube, exc))
            self._answer(scope)
            self._changed({"*"})
            raise
        except Exception as exc:
            self.errors[scope] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._answer(scope)
            self._changed({"*"})
            raise
        self.errors.pop(scope, None)
        return found

    async def _pages(self, scope: str) -> tuple[list[dict[str, Any]], str]:
        """What is kept (:meth:`_kept`) of the scope's objects, read a page at a time, and the
        listing's resourceVersion."""
        params: dict[str, Any] = {"labelSelector": self.selector, "limit": self.page_size}
        kept: list[dict[str, Any]] = []
        while True:
            listing = await self.kube.request("GET", path(self.resource, scope or None), params=params)
            kept += [self._kept(obj) for obj in listing.get("items") or [] if self._keep(obj)]
            del listing["items"]
            if not (token := listing["metadata"].get("continue")):
                return kept, str(listing["metadata"]["resourceVersion"])
            params["continue"] = token

    def _listed(self, scope: str, items: list[dict[str, Any]]) -> None:
        for key in [k for k in self.objects if not scope or k[0] == scope]:
            self._drop(key)
        for kept in items:
            self._put(kept)
        self._answer(scope)
        self._changed({"*"})

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if not self._keep(obj):
            return
        if kind == "DELETED":
            self._drop(key_of(obj))
        else:
            self._put(self._kept(obj))
        self._changed(set(self._topics(kind, obj)))


@dataclass(eq=False)
class Subscription:
    """The topics changed since the subscriber last took them, and a flag raised at each change."""

    pending: set[str] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def next(self, settle_s: float) -> set[str]:
        """Wait for a change, and ``settle_s`` more for those that come with it; every topic
        changed since the last call."""
        await self.wake.wait()
        await asyncio.sleep(settle_s)
        self.wake.clear()
        taken, self.pending = self.pending, set()
        return taken


def _job_topics(kind: str, job: dict[str, Any]) -> Iterable[str]:
    """``job:NS/NAME``; and ``jobs`` when the job came or went: the rows of the jobs page."""
    namespace, name = key_of(job)
    return (f"job:{namespace}/{name}", *(["jobs"] if kind != "MODIFIED" else []))


def _run_topics(_: str, run: dict[str, Any]) -> Iterable[str]:
    namespace, name = key_of(run)
    return (f"run:{namespace}/{name}", f"runs:{namespace}/{job_of(run)}")


def _event_topics(_: str, event: dict[str, Any]) -> Iterable[str]:
    about = event.get("involvedObject") or {}
    namespace = str(about.get("namespace") or key_of(event)[0])
    if about.get("kind") == JOB_KIND:
        return (f"events:{namespace}/{about.get('name')}",)
    return (f"run:{namespace}/{run_of_pod(str(about.get('name') or ''))}",)


def _our_event(event: dict[str, Any]) -> bool:
    """An Event on an AnarchonJob (the operator's), or on a run's Pod (the scheduler's, the
    kubelet's): the other Pods' Events of a namespace, or of a cluster with ``-A``, are not kept."""
    about = event.get("involvedObject") or {}
    if about.get("kind") == JOB_KIND:
        return True
    return about.get("kind") == "Pod" and bool(_RUN_POD.search(str(about.get("name") or "")))


class Model:
    """The jobs, runs and Events of ``namespaces`` (every namespace if empty), live."""

    def __init__(self, kube: Kube, namespaces: Sequence[str]) -> None:
        self.namespaces = list(namespaces)
        self._subscribers: set[Subscription] = set()
        #: How many changes were published: a page says which it was drawn after (:meth:`since`).
        self.version = 0
        self._recent: deque[tuple[int, set[str]]] = deque(maxlen=CHANGES_KEPT)
        watch = functools.partial(Watched, kube, namespaces, changed=self.publish)
        self.jobs = watch(resource=JOBS, what="AnarchonJobs", view=job_facts, topics=_job_topics)
        self.runs = watch(
            resource=RUNS,
            what="AnarchonRuns",
            view=run_view,
            topics=_run_topics,
            selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
            group=lambda run: (key_of(run)[0], job_of(run)),
        )
        self.events = watch(
            resource="events",
            what="Events",
            view=event_view,
            topics=_event_topics,
            keep=_our_event,
            group=lambda event: (key_of(event)[0], str((event.get("involvedObject") or {}).get("name") or "")),
        )
        self._watches = (self.jobs, self.runs, self.events)

    def start(self) -> None:
        for watch in self._watches:
            watch.start()

    async def stop(self) -> None:
        for watch in self._watches:
            await watch.stop()

    async def answered(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the first lists of jobs and runs: a page served before
        them would call a job that exists "not found"."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(self.jobs.answered.wait(), self.runs.answered.wait()), timeout_s)

    # -- changes ---------------------------------------------------------------------------------

    def publish(self, topics: set[str]) -> None:
        self.version += 1
        self._recent.append((self.version, topics))
        for sub in self._subscribers:
            sub.pending |= topics
            sub.wake.set()

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    def since(self, version: int) -> set[str]:
        """The topics changed after :attr:`version` was ``version``: what a page drawn then and
        listening only now has missed (``*``, all, if that is further back than is kept)."""
        if version >= self.version:
            return set()
        if not self._recent or self._recent[0][0] > version + 1:
            return {"*"}
        return set().union(*(topics for v, topics in self._recent if v > version))

    # -- reads -----------------------------------------------------------------------------------

    @property
    def errors(self) -> list[str]:
        """Why some of what the page should show cannot be read: one line per resource and scope."""
        return [
            f"{watch.what} in {scope or 'every namespace'}: {text}"
            for watch in self._watches
            for scope, text in sorted(watch.errors.items())
        ]

    def job_list(self) -> list[JobFacts]:
        return [self.jobs.objects[k] for k in sorted(self.jobs.objects)]

    def job(self, namespace: str, name: str) -> JobFacts | None:
        return self.jobs.objects.get((namespace, name))

    def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The run's :func:`run_view`."""
        return self.runs.objects.get((namespace, name))

    def runs_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The job's kept runs (:func:`run_view`), by slot."""
        found = self.runs.group((namespace, job))
        found.sort(key=lambda r: int(r["slot"]))
        return found

    def events_of_run(self, namespace: str, job: str, run: str, pods: Iterable[str]) -> list[dict[str, Any]]:
        """The Events of a run: the job's that name it (the operator's messages say ``run <name>``)
        and those of its Pods, oldest first."""
        names = re.compile(rf"\brun {re.escape(run)}(?![\w-])")
        found = [
            e
            for e in self.events.group((namespace, job))
            if (e.get("involvedObject") or {}).get("kind") == JOB_KIND and names.search(str(e.get("message") or ""))
        ]
        for pod in pods:
            found += [
                e for e in self.events.group((namespace, pod)) if (e.get("involvedObject") or {}).get("kind") == "Pod"
            ]
        found.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or ""))
        return found
