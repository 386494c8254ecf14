"""JobController.apply on the bodies the job watch hands over (no cluster needed: nothing is written).

Every replica sees every status write of every replica (two per run). Such a change leaves the
spec and the trigger as they were: apply must not parse, reschedule or trigger for it.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import Scheduler
from anarchon.engine.backends import from_url
from anarchon.kube.api.client import Kube
from anarchon.kube.api.kubeconfig import Endpoint
from anarchon.kube.job import controller as controller_module
from anarchon.kube.job.controller import JobController
from anarchon.kube.job.spec import JobSpec, parse_job, schedule_column, slot_time
from anarchon.kube.job.status import _condition
from anarchon.kube.report.kube_events import EventPoster
from anarchon.kube.report.metrics import Metrics

HOUR_MS = 3_600_000


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[JobController]:
    kube = Kube(Endpoint("http://127.0.0.1:9"))  # never used: each body's status already says what apply would write
    scheduler = Scheduler(from_url(f"sqlite://{tmp_path / 'store.db'}"), instance_id="r0")
    yield JobController(kube, scheduler, EventPoster(kube), Metrics(scheduler.clock.now_ms))
    await scheduler.stop()
    await kube.close()


def _job(generation: int, now_ms: int, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonJob",
        "metadata": {"name": "quiet", "namespace": "ns", "uid": "u-1", "generation": generation},
        "spec": {
            "every": f"{generation}h",
            "suspend": True,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
        },
    }
    spec = parse_job(body)
    conditions = [
        _condition("Ready", False, "Suspended", f"suspended ({spec.schedule})", generation),
        _condition("Invalid", False, "Valid", "the spec is valid", generation),
    ]
    next_slot = spec.schedule.next_after(now_ms) + HOUR_MS  # in the future: nothing to write
    body["status"] = {
        "conditions": conditions,
        "nextSlot": next_slot,
        "nextScheduleTime": slot_time(next_slot),
        "schedule": schedule_column(spec.schedule),
        **status,
    }
    return body


async def test_a_status_only_change_is_not_parsed_again_but_a_new_generation_is(
    controller: JobController, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []

    def counting(body: dict[str, Any]) -> JobSpec:
        parsed.append(int(body["metadata"]["generation"]))
        return parse_job(body)

    monkeypatch.setattr(controller_module, "parse_job", counting)
    now = controller.scheduler.clock.now_ms()
    first = _job(1, now)
    first["metadata"]["resourceVersion"] = "1"
    await controller.apply(first)
    key = next(iter(controller.specs))
    for n in range(5):  # the replicas' own status writes: active runs, last times
        changed = copy.deepcopy(first)
        changed["metadata"]["resourceVersion"] = str(n + 2)
        changed["status"].update(activeCount=n % 2, lastScheduleTime=slot_time(now - n * 1000))
        await controller.apply(changed)
    assert parsed == [1], "a change of the status alone is handled without parsing the spec"
    assert controller.metrics.job_gauges.jobs[key].last_schedule_ms is not None, "the status reaches the metrics"
    await controller.apply(_job(2, now))
    assert parsed == [1, 2], "a new generation is a new spec"
    assert str(controller.specs[key].schedule) == str(parse_job(_job(2, now)).schedule)
