"""What the page shows, kept live: the AnarchonJobs, AnarchonRuns and Events in scope.

Each is one list-then-watch loop of the operator's own (:class:`anarchon.kube.watching.ScopedWatch`),
with the user's credentials: a page is drawn from memory, never from a request per view, and an
open page hears of a change through :meth:`Model.subscribe` (the server turns it into a
server-sent event). A change is named by *topics* (``jobs``, ``job:NS/NAME``, ``run:NS/NAME``,
``runs:NS/JOB``, ``events:NS/JOB``, ``*`` after a listing), so that a page refreshes only for
what it shows.

What the user may not list or watch is kept as the API server's own message (:attr:`Model.errors`),
shown on every page, rather than an empty table that says nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..kube.client import ApiException, Kube
from ..kube.constants import JOB_KIND, JOBS, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, RUNS
from ..kube.watching import ScopedWatch

Key = tuple[str, str]
#: The annotation kubectl apply leaves on an object: its whole last manifest, of no use here.
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
#: A retry's Pod is ``<run>-r<n>`` (:func:`anarchon.kube.spec.pod_name`).
_RETRY_POD = re.compile(r"-r[0-9]+$")
#: A run's Pod: ``<job>-<slot in s or ms>``, then ``-r<n>`` for a retry (:func:`anarchon.kube.spec.run_name`).
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


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what no page shows (managed fields, kubectl's last manifest): a tenth of its size."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    if _LAST_APPLIED in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != _LAST_APPLIED}
    if obj.get("kind") == "Event" or "involvedObject" in obj:
        return {"metadata": meta, **{k: obj.get(k) for k in _EVENT_FIELDS}}
    return {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


class Watched(ScopedWatch):
    """The objects of one resource in scope, slim, by (namespace, name); each change told to ``changed``
    with its topics."""

    def __init__(
        self,
        kube: Kube,
        namespaces: Sequence[str],
        *,
        resource: str,
        what: str,
        topics: Callable[[dict[str, Any]], Iterable[str]],
        changed: Callable[[set[str]], None],
        selector: str | None = None,
        keep: Callable[[dict[str, Any]], bool] = lambda _: True,
        group: Callable[[dict[str, Any]], Key] = key_of,
    ) -> None:
        super().__init__(kube, namespaces)
        self.resource, self.what, self.selector = resource, what, selector
        self.objects: dict[Key, dict[str, Any]] = {}
        #: The keys of the objects by ``group(obj)`` (the runs of a job), found without a scan.
        self.groups: dict[Key, set[Key]] = {}
        #: Per scope ("" for every namespace), why it cannot be listed: the API server's words.
        self.errors: dict[str, str] = {}
        self._topics, self._changed, self._keep, self._group = topics, changed, keep, group
        #: Set once every scope's first list answered (with its objects or a refusal).
        self.answered = asyncio.Event()
        self._unanswered = set(namespaces) or {""}

    def _answer(self, scope: str) -> None:
        self._unanswered.discard(scope)
        if not self._unanswered:
            self.answered.set()

    def group(self, key: Key) -> list[dict[str, Any]]:
        return [self.objects[k] for k in self.groups.get(key, ())]

    def _put(self, obj: dict[str, Any]) -> None:
        key = key_of(obj)
        self._drop(key)
        self.objects[key] = _slim(obj)
        self.groups.setdefault(self._group(obj), set()).add(key)

    def _drop(self, key: Key) -> None:
        old = self.objects.pop(key, None)
        if old is not None and (keys := self.groups.get(self._group(old))) is not None:
            keys.discard(key)
            if not keys:
                del self.groups[self._group(old)]

    async def _list(self, scope: str) -> tuple[list[dict[str, Any]], str]:
        from ..cli.common import api_failure

        try:
            found = await super()._list(scope)
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

    def _listed(self, scope: str, items: list[dict[str, Any]]) -> None:
        for key in [k for k in self.objects if not scope or k[0] == scope]:
            self._drop(key)
        for obj in items:
            if self._keep(obj):
                self._put(obj)
        self._answer(scope)
        self._changed({"*"})

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if not self._keep(obj):
            return
        if kind == "DELETED":
            self._drop(key_of(obj))
        else:
            self._put(obj)
        self._changed(set(self._topics(obj)))


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


def _job_topics(job: dict[str, Any]) -> Iterable[str]:
    namespace, name = key_of(job)
    return ("jobs", f"job:{namespace}/{name}")


def _run_topics(run: dict[str, Any]) -> Iterable[str]:
    namespace, name = key_of(run)
    return ("jobs", f"run:{namespace}/{name}", f"runs:{namespace}/{job_of(run)}")


def _event_topics(event: dict[str, Any]) -> Iterable[str]:
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
        self.jobs = Watched(
            kube, namespaces, resource=JOBS, what="AnarchonJobs", topics=_job_topics, changed=self.publish
        )
        self.runs = Watched(
            kube,
            namespaces,
            resource=RUNS,
            what="AnarchonRuns",
            topics=_run_topics,
            changed=self.publish,
            selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
            group=lambda run: (key_of(run)[0], job_of(run)),
        )
        self.events = Watched(
            kube,
            namespaces,
            resource="events",
            what="Events",
            topics=_event_topics,
            changed=self.publish,
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
        for sub in self._subscribers:
            sub.pending |= topics
            sub.wake.set()

    def subscribe(self) -> Subscription:
        sub = Subscription()
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    # -- reads -----------------------------------------------------------------------------------

    @property
    def errors(self) -> list[str]:
        """Why some of what the page should show cannot be read: one line per resource and scope."""
        return [
            f"{watch.what} in {scope or 'every namespace'}: {text}"
            for watch in self._watches
            for scope, text in sorted(watch.errors.items())
        ]

    def job_list(self) -> list[dict[str, Any]]:
        return [self.jobs.objects[k] for k in sorted(self.jobs.objects)]

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.jobs.objects.get((namespace, name))

    def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.runs.objects.get((namespace, name))

    def runs_of(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The job's kept runs, by slot."""
        found = self.runs.group((namespace, job))
        found.sort(key=lambda r: int((r.get("spec") or {}).get("slot") or 0))
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
