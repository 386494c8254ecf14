"""PodRunner's fencing around the Pod launch, against the real API server.

A runner can be frozen (GC pause, SIGSTOP) at any point; these tests put the freeze at the
two places where a second Pod of the run could appear, by scripting what ``ctx.confirm()``
(the heartbeat that tells an attempt it still holds the lease) answers. Everything else is
real: the AnarchonJob, the AnarchonRun with its attempt guard, the Pods.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest

from anarchon.engine import RunInterrupted
from anarchon.engine.attempt import ENDED
from anarchon.kube.api.client import Kube, path
from anarchon.kube.constants import RUNS
from anarchon.kube.job.spec import JobSpec, parse_job, run_name
from anarchon.kube.report.kube_events import EventPoster
from anarchon.kube.run import record as runs
from anarchon.kube.run import runstatus
from anarchon.kube.run.pods import pods_of_run
from anarchon.kube.run.runner import PodRunner
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.runs import SLOT, attempt


@pytest.fixture
def spec(cluster: Cluster) -> Iterator[JobSpec]:
    cluster.apply(job_manifest("fenced", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "-1"}))
    yield parse_job(cluster.get("anarchonjob", "fenced"))


async def _live(kube: Kube, spec: JobSpec) -> list[str]:
    pods = await pods_of_run(kube, spec.namespace, run_name(spec.name, SLOT))
    return [p["metadata"]["name"] for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


async def test_fenced_right_after_the_launch_leaves_the_pod_to_the_attempt_that_holds_the_run(
    kube: Kube, spec: JobSpec
) -> None:
    """The run's one Pod is the backup's to adopt: deleting it would only waste the work done.

    (With one Pod name per run, no second Pod can be started beside it.)
    """
    runner = PodRunner(kube, EventPoster(kube), lambda: spec)
    with pytest.raises(RunInterrupted, match="fenced"):  # never a normal return: that would read as success
        await asyncio.wait_for(runner(attempt(1, True)), 30)  # holds the lease before the launch, lost it right after
    assert await _live(kube, spec) == [run_name(spec.name, SLOT)]
    backup = asyncio.create_task(PodRunner(kube, EventPoster(kube), lambda: spec)(attempt(2, *([True] * 50))))
    await asyncio.sleep(2)
    assert await _live(kube, spec) == [run_name(spec.name, SLOT)], "adopted, never launched beside"
    backup.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await backup


async def test_a_pod_launched_as_the_run_ended_in_the_store_is_deleted(kube: Kube, spec: JobSpec) -> None:
    """Given up (or ended) while this attempt was launching: nobody would follow its Pod, so it goes."""
    ctx = attempt(1, True)
    script = ctx.confirm

    async def confirm() -> bool:
        if await script():
            return True
        ctx.request_stop(ENDED)  # what the engine says when the store shows the run over
        return False

    ctx.confirm = confirm
    with pytest.raises(RunInterrupted, match="ended"):
        await asyncio.wait_for(PodRunner(kube, EventPoster(kube), lambda: spec)(ctx), 30)
    assert await _live(kube, spec) == []


async def test_an_attempt_whose_run_a_later_attempt_owns_launches_nothing(kube: Kube, spec: JobSpec) -> None:
    name = run_name(spec.name, SLOT)
    await runs.ensure_run(kube, spec, SLOT, "Manual")
    assert await runs.update_status(
        kube, spec.namespace, name, 2, lambda s: runstatus.start_attempt(s, attempt=2, instance="backup", pod="p-a2")
    )
    runner = PodRunner(kube, EventPoster(kube), lambda: spec)
    # The run object counts more attempts than attempt 1: it asks the store, which refuses it
    # (a later attempt holds the run). Only a store that lost its state would confirm it, and
    # then it would go on as attempt 3 (test_a_store_that_lost_its_state_numbers_...).
    with pytest.raises(RunInterrupted, match="fenced"):
        await asyncio.wait_for(runner(attempt(1)), 30)
    assert await pods_of_run(kube, spec.namespace, name) == []


async def test_a_store_that_lost_its_state_numbers_the_attempt_above_the_run_objects(kube: Kube, spec: JobSpec) -> None:
    """The store confirms attempt 1 (it counts from 1 again after losing its state) of a run whose
    object says attempt 2: the attempt goes on as 3, so the object's guard takes its writes."""
    name = run_name(spec.name, SLOT)
    await runs.ensure_run(kube, spec, SLOT, "Manual")
    assert await runs.update_status(
        kube, spec.namespace, name, 2, lambda s: runstatus.start_attempt(s, attempt=2, instance="gone", pod=name)
    )
    ctx = attempt(1, *([True] * 50))
    task = asyncio.create_task(PodRunner(kube, EventPoster(kube), lambda: spec)(ctx))
    try:
        for _ in range(100):
            status = (await kube.request("GET", path(RUNS, spec.namespace, name))).get("status") or {}
            if status.get("instance") == ctx.instance:
                break
            await asyncio.sleep(0.1)
        assert ctx.attempt == 3 and status["attempt"] == 3, status
        assert [a["attempt"] for a in status["attempts"]] == [2, 3]
        assert await _live(kube, spec) == [name], "the try's one Pod, launched by attempt 3"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
