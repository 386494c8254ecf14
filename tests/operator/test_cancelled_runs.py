"""A cancel (the annotation ``anarchon.io/cancel`` on an AnarchonRun, what ``anarchon cancel`` sets)
against the real control plane: the run's Pod goes, nothing more is launched, the run ends Cancelled.

The first test runs real replicas (short leases, so that a few of them pass in seconds); the
others run one attempt in-process, through the API fault proxy, with a run cache of their own
to bring them the cancel, as a replica's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import RunCancelled
from anarchon.kube.api.client import Kube
from anarchon.kube.job.spec import JobSpec, parse_job, run_name
from anarchon.kube.report.kube_events import EventPoster
from anarchon.kube.run.cache import RunCache
from anarchon.kube.run.runner import PodRunner
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.runs import RUN_STATUS, SLOT, YES, attempt
from tests.harness.until import until

FAST = {"heartbeat": "500ms", "lease": "1500ms", "jitter": "0s", "every": "1h", "suspend": True}
LEASE_S = 1.5


def _status(cluster: Cluster, run: str) -> dict[str, Any]:
    return dict((cluster.get("anarchonrun", run) or {}).get("status") or {})


def _pods(cluster: Cluster, run: str) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.pods(f"anarchon.io/run={run}")]


def _cancelled(cluster: Cluster, run: str) -> dict[str, Any]:
    return dict(
        until(
            f"run {run} to end Cancelled",
            lambda: (s := _status(cluster, run)).get("phase") == "Cancelled" and s,
            timeout=60,
        )
    )


def _cancel(cluster: Cluster, run: str, reason: str, by: str | None = None) -> None:
    """What a kubectl-only user (or GitOps) does; ``anarchon cancel`` adds who asked."""
    extra = [f"anarchon.io/cancel-by={by}"] if by else []
    cluster.kubectl("annotate", "anarchonrun", run, f"anarchon.io/cancel={reason}", *extra)


def test_a_cancelled_run_stops_and_no_replica_launches_it_again(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    """A live Pod is deleted and its run ends Cancelled, although its runner is SIGKILLed right
    after the cancel (the backup that takes the run over honours it); a run in its retry backoff,
    cancelled while no replica runs, ends Cancelled by the first replica that takes it over,
    without its next try. Nothing is launched for either run afterwards."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for name in ("r0", "r1"):
        replicas.start(name)
    cluster.apply(job_manifest("long", annotations={"anarchon.test/run-seconds": "-1"}, **FAST))
    failing = {"anarchon.test/exit-code": "3", "anarchon.test/run-seconds": "0.3"}
    cluster.apply(
        job_manifest("backoff", retries={"limit": 2, "backoff": "1h", "maxBackoff": "1h"}, annotations=failing, **FAST)
    )
    long = cluster.trigger_running("long")["metadata"]["name"]
    backoff = cluster.trigger_running("backoff")["metadata"]["name"]
    until("the backoff after try 1", lambda: _status(cluster, backoff).get("nextTryTime"), timeout=60)

    owner = _status(cluster, long)["instance"]
    _cancel(cluster, long, "wrong input", by="alice")
    replicas.kill(owner)
    status = _cancelled(cluster, long)
    assert status["message"] == "cancelled by alice: wrong input"
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Cancelled")]
    assert status.get("finishTime")
    until(f"the Pod of {long} to be gone", lambda: not _pods(cluster, long), timeout=30)

    # Every replica down: the cancel waits on the run's object for the next one.
    survivor = next(r for r in ("r0", "r1") if r != owner)
    replicas.kill(survivor)
    _cancel(cluster, backoff, "")
    time.sleep(LEASE_S)
    assert _status(cluster, backoff)["phase"] == "Running", "nobody ran it meanwhile"
    replicas.start("r2")
    status = _cancelled(cluster, backoff)
    assert status["message"] == "cancelled"
    assert status["instance"] == "r2" and "nextTryTime" not in status
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Failed")], "try 2 never ran"
    assert status["try"] == 1

    time.sleep(3 * LEASE_S)  # a backup would have taken a run over, or its next try started, by now
    assert _pods(cluster, long) == []
    assert _pods(cluster, backoff) == [backoff], "only the failed first try's Pod"
    assert _status(cluster, long)["phase"] == _status(cluster, backoff)["phase"] == "Cancelled"
    events = cluster.events("Cancelled")
    on_runs = {e["involvedObject"]["name"] for e in events if e["involvedObject"]["kind"] == "AnarchonRun"}
    on_jobs = {e["involvedObject"]["name"] for e in events if e["involvedObject"]["kind"] == "AnarchonJob"}
    assert on_runs == {long, backoff} and on_jobs == {"long", "backoff"}
    assert any(e["message"] == "cancelled by alice: wrong input" for e in events)


# -- one attempt in-process, through the API fault proxy ----------------------------------------------


def _job(cluster: Cluster, run_seconds: str) -> JobSpec:
    cluster.apply(
        job_manifest("in-process", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": run_seconds})
    )
    return parse_job(cluster.get("anarchonjob", "in-process"))


@contextlib.asynccontextmanager
async def _attempt(kube: Kube, cluster: Cluster, spec: JobSpec) -> AsyncIterator[asyncio.Task[None]]:
    """Attempt 1 of the job's run, followed by a runner whose run cache watches the namespace;
    yielded once its Pod runs."""
    cache = RunCache(kube, [spec.namespace])
    cache.start()
    try:
        runner = PodRunner(kube, EventPoster(kube), lambda: spec, cancels=cache.cancels, poll_s=0.2)
        task = asyncio.create_task(runner(attempt(1, *YES)))
        try:
            name = run_name(spec.name, SLOT)
            running = lambda: _status(cluster, name).get("phase") == "Running" and _pods(cluster, name)  # noqa: E731
            await asyncio.to_thread(until, "the Pod", running, timeout=30)
            assert cache.healthy
            yield task
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    finally:
        await cache.stop()


async def test_a_cancel_lands_through_api_faults(cluster: Cluster, proxy: ApiFaultProxy, through_proxy: Kube) -> None:
    """The Pod's delete meets 503s and the run's final write a lost reply and a 500: both are
    retried as every other write is, and the run ends Cancelled with its Pod gone."""
    spec = _job(cluster, "-1")
    name = run_name(spec.name, SLOT)
    async with _attempt(through_proxy, cluster, spec) as task:
        faults = [
            proxy.add(Fault("status", code=503, verb="delete", resource="pods", times=2)),
            proxy.add(Fault("lost_reply", verb="update", times=1, **RUN_STATUS)),
            proxy.add(Fault("status", code=500, verb="update", times=1, **RUN_STATUS)),
        ]
        _cancel(cluster, name, "maintenance", by="bob")
        with pytest.raises(RunCancelled, match=r"^cancelled by bob: maintenance$"):
            await asyncio.wait_for(task, 60)
    assert [f.fired for f in faults] == [2, 1, 1]
    status = _status(cluster, name)
    assert (status["phase"], status["message"]) == ("Cancelled", "cancelled by bob: maintenance")
    assert _pods(cluster, name) == []


async def test_a_pod_that_succeeds_before_its_delete_lands_gives_the_run_its_outcome(
    cluster: Cluster, proxy: ApiFaultProxy, through_proxy: Kube
) -> None:
    """The cancel races the Pod's own end: its delete reaches the API server (held up 4 s) after
    the Pod Succeeded. The delete is made on the Pod as it was read, so it is refused, and the
    run ends as its Pod did: Succeeded, not Cancelled."""
    spec = _job(cluster, "2")
    name = run_name(spec.name, SLOT)
    async with _attempt(through_proxy, cluster, spec) as task:
        late = proxy.add(Fault("latency", verb="delete", resource="pods", seconds=4, times=1))
        _cancel(cluster, name, "too late")
        await asyncio.wait_for(task, 60)
    assert late.fired == 1, "the runner tried to stop the Pod"
    status = _status(cluster, name)
    assert (status["phase"], status["message"]) == ("Succeeded", "the Pod succeeded")
    (pod,) = cluster.pods(f"anarchon.io/run={name}")
    assert pod["status"]["phase"] == "Succeeded" and not pod["metadata"].get("deletionTimestamp")
