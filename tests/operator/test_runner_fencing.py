"""PodRunner's fencing around the Pod launch, against the real API server.

A runner can be frozen (GC pause, SIGSTOP) at any point; these tests put the freeze at the
two places where a second Pod of the run could appear, by scripting what ``ctx.confirm()``
(the heartbeat that tells an attempt it still holds the lease) answers. Everything else is
real: the AnarchonJob, the AnarchonRun with its attempt guard, the Pods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from anarchon.engine import RunContext, RunInterrupted
from anarchon.kube import runs
from anarchon.kube.client import Kube
from anarchon.kube.events import EventPoster
from anarchon.kube.pods import pods_of_run
from anarchon.kube.runner import PodRunner
from anarchon.kube.spec import JobSpec, parse_job, run_name

from .conftest import Cluster, job_manifest

SLOT = 1_800_000_000_000


@pytest.fixture
def spec(cluster: Cluster) -> Iterator[JobSpec]:
    cluster.apply(job_manifest("fenced", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "-1"}))
    yield parse_job(cluster.get("anarchonjob", "fenced"))


def attempt(n: int, *answers: bool) -> RunContext:
    """Attempt ``n`` whose successive confirm() calls answer ``answers`` (then False)."""
    ctx = RunContext(job="fenced", slot=SLOT, attempt=n, token=f"t{n}", instance=f"runner-{n}")
    script = iter(answers)

    async def confirm() -> bool:
        return next(script, False)

    ctx.confirm = confirm
    return ctx


async def test_fenced_right_after_the_launch_deletes_its_own_pod(kube: Kube, spec: JobSpec) -> None:
    runner = PodRunner(kube, EventPoster(kube), lambda: spec)
    with pytest.raises(RunInterrupted, match="fenced"):  # never a normal return: that would read as success
        await asyncio.wait_for(runner(attempt(1, True)), 30)  # holds the lease before the launch, lost it right after
    pods = await pods_of_run(kube, spec.namespace, run_name(spec.name, SLOT))
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    assert live == [], [p["metadata"]["name"] for p in live]


async def test_an_attempt_whose_run_a_later_attempt_owns_launches_nothing(kube: Kube, spec: JobSpec) -> None:
    name = run_name(spec.name, SLOT)
    await runs.ensure_run(kube, spec, SLOT, "Manual")
    assert await runs.update_status(
        kube, spec.namespace, name, 2, lambda s: runs.start_attempt(s, attempt=2, instance="backup", pod="p-a2")
    )
    runner = PodRunner(kube, EventPoster(kube), lambda: spec)
    # The store has not told attempt 1 yet (its confirms pass), but the run object has.
    with pytest.raises(RunInterrupted, match="later attempt"):
        await asyncio.wait_for(runner(attempt(1, True, True, True)), 30)
    assert await pods_of_run(kube, spec.namespace, name) == []
