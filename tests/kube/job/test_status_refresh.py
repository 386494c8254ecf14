"""JobStatus.refresh_soon: one refresh for a run's start and end, made soon after the end.

No cluster: the refresh itself is replaced by a recorder (what it writes is tests/operator's).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import Scheduler
from anarchon.engine.backends import from_url
from anarchon.kube.api.client import Kube
from anarchon.kube.api.kubeconfig import Endpoint
from anarchon.kube.job import status as status_module
from anarchon.kube.job.spec import JobSpec, parse_job
from anarchon.kube.job.status import JobStatus
from anarchon.kube.report.kube_events import EventPoster

START_S, END_S = 2.0, 0.2  # the waits after a run's start and end, shortened


@pytest.fixture
async def status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[JobStatus, list[float]]]:
    monkeypatch.setattr(status_module, "REFRESH_AFTER_START_S", START_S)
    monkeypatch.setattr(status_module, "REFRESH_AFTER_END_S", END_S)
    kube = Kube(Endpoint("http://127.0.0.1:9"))
    job_status = JobStatus(kube, Scheduler(from_url(f"sqlite://{tmp_path / 's.db'}")), EventPoster(kube))
    made: list[float] = []

    async def refresh(spec: JobSpec) -> None:
        made.append(asyncio.get_running_loop().time())

    job_status.refresh = refresh  # type: ignore[method-assign]
    yield job_status, made
    await kube.close()


def _spec(name: str) -> JobSpec:
    body = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "generation": 1},
        "spec": {"every": "1h", "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }
    return parse_job(body)


async def test_a_short_runs_start_and_end_make_one_refresh_soon_after_the_end(
    status: tuple[JobStatus, list[float]],
) -> None:
    job_status, made = status
    loop = asyncio.get_running_loop()
    await job_status.refresh_soon(_spec("a"), ended=False)
    await asyncio.sleep(0.3)
    ended = loop.time()
    await job_status.refresh_soon(_spec("a"), ended=True)
    await asyncio.sleep(START_S + 0.5)
    assert len(made) == 1, "one refresh for the start and the end"
    assert END_S - 0.05 <= made[0] - ended < START_S - 0.3, "made after the end's wait, not the start's"


async def test_a_long_runs_start_is_refreshed_on_its_own_and_jobs_do_not_share_a_wait(
    status: tuple[JobStatus, list[float]],
) -> None:
    job_status, made = status
    await job_status.refresh_soon(_spec("a"), ended=False)
    await job_status.refresh_soon(_spec("b"), ended=True)
    await asyncio.sleep(START_S + 0.5)
    assert len(made) == 2, "b's end did not wait for a's start, nor did it make a's"
    await job_status.refresh_soon(_spec("a"), ended=True)
    await asyncio.sleep(END_S + 0.5)
    assert len(made) == 3


async def test_a_stopping_replica_makes_the_waiting_refreshes_at_once(status: tuple[JobStatus, list[float]]) -> None:
    job_status, made = status
    await job_status.refresh_soon(_spec("a"), ended=False)
    await job_status.refresh_soon(_spec("b"), ended=False)
    await asyncio.wait_for(job_status.flush(), 1.0)
    assert len(made) == 2


async def test_a_next_slot_just_passed_is_left_to_the_runs_refresh(tmp_path: Path) -> None:
    """Each replica comes to ``valid`` at every status write of the job; one that finds the next
    slot passed writes the new one. Just after a slot, the refresh that slot's run asks for
    writes it anyway: before, every replica raced it there too (one write and two 409s), a
    third more job status writes per run in test_api_cost under CI's load. A next slot passed
    for longer (nothing ran here: a missed slot, a quiet job) is still written."""
    kube = Kube(Endpoint("http://127.0.0.1:9"))
    scheduler = Scheduler(from_url(f"sqlite://{tmp_path / 's.db'}"))
    job_status = JobStatus(kube, scheduler, EventPoster(kube))
    patches: list[dict[str, Any]] = []

    async def recording_patch(namespace: str, name: str, status: dict[str, Any], **_: Any) -> bool:
        """Stands in for the API server's answer: this test is about which writes are asked for."""
        patches.append(status)
        return True

    kube.patch_job_status = recording_patch  # type: ignore[method-assign]
    spec = _spec("next")
    try:
        await job_status.valid(spec, {})  # a new job: conditions, schedule, next slot
        shown = dict(patches.pop())
        now = scheduler.clock.now_ms()
        await job_status.valid(spec, {**shown, "nextSlot": now - 1_000})
        assert patches == [], "a next slot passed a second ago is the run's refresh to write"
        await job_status.valid(spec, {**shown, "nextSlot": now - 60_000})
        assert [set(p) for p in patches] == [{"nextSlot", "nextScheduleTime"}], patches
    finally:
        await kube.close()
