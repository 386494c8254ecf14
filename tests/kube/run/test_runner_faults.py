"""PodRunner under faults, against the real API server: only what a Pod did becomes the run's outcome.

As in test_runner_fencing.py (tests/harness/runs.py), the lease is scripted (what ``ctx.confirm()`` answers);
everything else is real: the AnarchonJob, the AnarchonRun, the Pods (KWOK).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from anarchon.engine import RunContext, RunInterrupted
from anarchon.kube.api import client as kube_client
from anarchon.kube.api.client import Kube, path
from anarchon.kube.job.spec import JobSpec, parse_job, run_name
from anarchon.kube.report.kube_events import EventPoster
from anarchon.kube.run.pods import pods_of_run
from anarchon.kube.run.podwatch import PodWatch
from anarchon.kube.run.runner import PodRunner
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.runs import SLOT, attempt
from tests.harness.until import until_async


@pytest.fixture
def spec(cluster: Cluster) -> Iterator[JobSpec]:
    cluster.apply(job_manifest("faulty", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "-1"}))
    yield parse_job(cluster.get("anarchonjob", "faulty"))


async def _pods(kube: Kube, spec: JobSpec) -> list[tuple[str, bool]]:
    """(name, being deleted) of every Pod of the run."""
    pods = await pods_of_run(kube, spec.namespace, run_name(spec.name, SLOT))
    return [(p["metadata"]["name"], bool(p["metadata"].get("deletionTimestamp"))) for p in pods]


async def _running(kube: Kube, spec: JobSpec, ctx: RunContext) -> asyncio.Task[None]:
    """Start attempt ``ctx`` and return once its Pod runs."""
    task = asyncio.create_task(PodRunner(kube, EventPoster(kube), lambda: spec)(ctx))

    async def started() -> bool:
        if task.done():
            task.result()
        return bool(await _pods(kube, spec))

    await until_async("the Pod", started, interval=0.1)
    return task


async def test_a_timeout_that_fires_after_a_freeze_leaves_the_adopted_pod_alone(kube: Kube, spec: JobSpec) -> None:
    """Frozen past its lease, the runner wakes to its timeout: it must not delete the Pod a backup adopted.

    Before, the timeout path deleted the Pod first and asked the store (confirm) after.
    """
    ctx = attempt(1, True, True)  # holds the lease for the launch; fenced by the time the timeout fires
    task = await _running(kube, spec, ctx)
    ctx.request_stop("timeout")
    with pytest.raises(RunInterrupted, match="fenced"):
        await asyncio.wait_for(task, 30)
    assert await _pods(kube, spec) == [(run_name(spec.name, SLOT), False)]


async def test_a_pod_being_deleted_is_followed_not_force_deleted_nor_launched_beside(kube: Kube, spec: JobSpec) -> None:
    """A Pod that is being deleted may still run (grace period, a partitioned node): no second Pod meanwhile.

    Before, a Pod with a deletionTimestamp counted as lost: the next attempt force-deleted it
    (grace 0) and launched its own at once.
    """
    first = await _running(kube, spec, attempt(1, *([True] * 5)))
    first.cancel()  # the runner dies; its Pod runs on
    with contextlib.suppress(asyncio.CancelledError):
        await first
    pod = run_name(spec.name, SLOT)
    hold = {"metadata": {"finalizers": ["anarchon.test/hold"]}}
    await kube.core.patch_namespaced_pod(pod, spec.namespace, hold)
    await kube.core.delete_namespaced_pod(pod, spec.namespace)
    try:
        second = asyncio.create_task(PodRunner(kube, EventPoster(kube), lambda: spec)(attempt(2, *([True] * 50))))
        await asyncio.sleep(3)
        assert not second.done(), "attempt 2 must follow the lingering Pod"
        assert await _pods(kube, spec) == [(pod, True)], "nothing may be launched beside a Pod still terminating"
    finally:
        await kube.core.patch_namespaced_pod(pod, spec.namespace, {"metadata": {"finalizers": None}})
    # Gone now: attempt 2 ends as interrupted, and the next attempt relaunches.
    with pytest.raises(RunInterrupted, match="gone"):
        await asyncio.wait_for(second, 30)


async def test_a_runner_told_its_run_was_replaced_deletes_its_pod_and_ends_the_run(
    kube: Kube, spec: JobSpec, cluster: Cluster
) -> None:
    """Overlap Replace: the old run's own runner cleans up too, should the new run's winner die first.

    Before, the old runner took the refusal for a plain fence and left its Pod running, and
    its AnarchonRun said Running for ever, if the winner did not get to it.
    """
    ctx = attempt(1, True, True)
    task = await _running(kube, spec, ctx)
    ctx.request_stop("replaced")  # what the engine says when the store shows the run replaced
    with pytest.raises(RunInterrupted, match="replaced"):
        await asyncio.wait_for(task, 30)
    assert all(deleting for _, deleting in await _pods(kube, spec)), "the replaced run's Pod must go"
    status = cluster.get("anarchonrun", run_name(spec.name, SLOT))["status"]
    assert status["phase"] == "Interrupted" and status["finishTime"], status
    assert "replaced" in status["message"]


async def test_a_replaced_runs_pod_is_deleted_without_a_grace_period(
    kube: Kube, spec: JobSpec, cluster: Cluster
) -> None:
    """The run is recorded Interrupted: its Pod must not go on to end Succeeded in a grace period.

    Before, the Pod was deleted gracefully (30 s): a workload finishing in that time ended
    Succeeded while its run said Interrupted (the chaos soak's referee caught it).
    """
    ctx = attempt(1, True, True)
    task = await _running(kube, spec, ctx)
    pod = run_name(spec.name, SLOT)
    hold = {"metadata": {"finalizers": ["anarchon.test/hold"]}}  # keeps the object, to read how it was deleted
    await kube.core.patch_namespaced_pod(pod, spec.namespace, hold)
    try:
        ctx.request_stop("replaced")
        with pytest.raises(RunInterrupted, match="replaced"):
            await asyncio.wait_for(task, 30)
        deleted = (await kube.core.read_namespaced_pod(pod, spec.namespace)).metadata
        assert deleted.deletion_timestamp and deleted.deletion_grace_period_seconds == 0
    finally:
        await kube.core.patch_namespaced_pod(pod, spec.namespace, {"metadata": {"finalizers": None}})


async def test_news_of_an_earlier_pod_of_the_same_name_is_not_taken_for_the_followed_pods(
    kube: Kube, spec: JobSpec
) -> None:
    """A lost Pod is deleted and its try launched again under the same name; the watch may deliver
    the old Pod's deletion after the new Pod's create. Taken for the new Pod's end, it ended the
    attempt as interrupted with its Pod running. The deletion is injected into the live watch
    here, as a late delivery would hand it over: the watch cannot be made to lag on cue."""
    watch = PodWatch(kube, [spec.namespace])
    watch.start()
    try:
        await until_async("the Pod watch", _healthy(watch), interval=0.1)
        runner = PodRunner(kube, EventPoster(kube), lambda: spec, pod_watch=watch)
        task = asyncio.create_task(runner(attempt(1, *([True] * 50))))
        pod = run_name(spec.name, SLOT)

        async def running() -> bool:
            if task.done():
                task.result()
            pods = await pods_of_run(kube, spec.namespace, run_name(spec.name, SLOT))
            return any((p.get("status") or {}).get("phase") == "Running" for p in pods)

        await until_async("the Pod running", running, interval=0.1)
        earlier = {"metadata": {"name": pod, "namespace": spec.namespace, "uid": "an-earlier-pod-of-this-name"}}
        watch._event("DELETED", earlier)
        await asyncio.sleep(2)
        assert not task.done(), "the attempt must go on following its Pod"
        assert await _pods(kube, spec) == [(pod, False)]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, RunInterrupted):
            await task
    finally:
        await watch.stop()


def _healthy(watch: PodWatch) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return watch.healthy

    return check


async def test_the_clock_woken_read_of_a_watched_pod_is_background_work(
    kube: Kube, spec: JobSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the Pod watch is up, the runner's resync read (woken by the clock, not by a change)
    waits behind every urgent request; once the watch is down, its reads are urgent again.

    At 3,000 jobs a minute these resyncs were 6 reads per run, queued with the requests that
    launch runs and write their ends, and made those late. Polling without a watch is how an
    outcome is seen at all: it must not wait behind background work. The priority is read where
    the client takes it, the context of the request (``client.background``).
    """
    pod = run_name(spec.name, SLOT)
    where = path("pods", spec.namespace, pod)
    reads: list[bool] = []  # each GET of the Pod: was it background work?
    send = kube.request

    async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method == "GET" and url == where:
            reads.append(kube_client._background.get())
        return await send(method, url, *args, **kwargs)

    monkeypatch.setattr(kube, "request", request)
    watch = PodWatch(kube, [spec.namespace])
    watch.start()
    task: asyncio.Task[None] | None = None
    try:
        await until_async("the Pod watch", _healthy(watch), interval=0.1)
        runner = PodRunner(kube, EventPoster(kube), lambda: spec, pod_watch=watch, poll_s=0.3, resync_s=0.3)
        task = asyncio.create_task(runner(attempt(1, *([True] * 50))))

        async def resynced() -> bool:
            if task.done():
                task.result()
            return len(reads) >= 4

        await until_async("the runner's resync reads", resynced, interval=0.1)
        assert all(reads), f"a clock-woken read while the watch is up must be background work: {reads}"
        watched = len(reads)
        await watch.stop()  # the runner polls now

        async def polled() -> bool:
            if task.done():
                task.result()
            return len(reads) >= watched + 2

        await until_async("the runner's polls", polled, interval=0.1)
        # The first read after the stop may be the resync it was already sleeping toward.
        assert not any(reads[watched + 1 :]), f"with the watch down, the Pod is polled as urgent work: {reads}"
        assert not task.done()
    finally:
        await watch.stop()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RunInterrupted):
                await task
