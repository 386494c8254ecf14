"""A job's status write under API faults: the missed windows it carries are not lost.

``anarchon why`` reads missed slots from ``status.missed`` after the Missed Events fade, and
only the replica that saw the miss knows it: if its status write fails, the window must be
written again, not wait for the job's next run (an hourly or daily job's is far off).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from anarchon.engine import Scheduler
from anarchon.engine.backends import from_url
from anarchon.kube.api import client as kube_client
from anarchon.kube.api.client import Kube
from anarchon.kube.job.spec import parse_job
from anarchon.kube.job.status import JobStatus
from anarchon.kube.report.kube_events import EventPoster
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until_async

HOUR = 3_600_000
SLOTS = [1_800_000_000_000 + k * HOUR for k in range(3)]
JOB_STATUS = {"resource": "anarchonjobs", "subresource": "status", "verb": "patch"}


def _missed(cluster: Cluster) -> list[dict[str, Any]]:
    return list((cluster.get("anarchonjob", "hourly").get("status") or {}).get("missed") or [])


async def _windows(cluster: Cluster) -> list[dict[str, Any]]:
    """The job's missed windows once it has some (read off the event loop: the writer runs on it)."""
    windows: list[dict[str, Any]] = await until_async(
        "the missed window in the job's status", lambda: asyncio.to_thread(_missed, cluster), interval=0.2
    )
    return windows


async def test_a_missed_window_whose_status_write_failed_is_written_again(
    cluster: Cluster,
    proxy: ApiFaultProxy,
    through_proxy: Kube,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server refuses the job's status writes past the client's retries (shortened here
    from a minute), then answers again: the window is in the status soon after, with no run and
    no other change of the job. On main it waited for the job's next refresh."""
    monkeypatch.setattr(kube_client, "RETRY_FOR_MS", 2_000)
    cluster.apply(job_manifest("hourly", every="1h", suspend=True))
    spec = parse_job(cluster.get("anarchonjob", "hourly"))
    scheduler = Scheduler(from_url(f"sqlite://{tmp_path / 's.db'}"))
    status = JobStatus(through_proxy, scheduler, EventPoster(through_proxy))
    outage = proxy.add(Fault("status", code=503, times=1_000, **JOB_STATUS))
    try:
        with caplog.at_level(logging.WARNING, logger="anarchon"):
            await status.note_missed(spec, SLOTS, "missed while no instance ran: catch-up policy None runs 0 of 3")
            await until_async("the refresh to give up", lambda: "status refresh of" in caplog.text, timeout=60)
        assert "status refresh of" in caplog.text and outage.fired >= 2, "the write was tried, refused, given up"
        proxy.remove(outage)
        (window,) = await _windows(cluster)
        assert (window["count"], window["reason"]) == (3, "NoReplica"), window
    finally:
        await status.flush()
        await scheduler.backend.close()


async def test_a_missed_windows_write_whose_reply_was_lost_is_written_once(
    cluster: Cluster, proxy: ApiFaultProxy, through_proxy: Kube, tmp_path: Path
) -> None:
    cluster.apply(job_manifest("hourly", every="1h", suspend=True))
    spec = parse_job(cluster.get("anarchonjob", "hourly"))
    scheduler = Scheduler(from_url(f"sqlite://{tmp_path / 's.db'}"))
    status = JobStatus(through_proxy, scheduler, EventPoster(through_proxy))
    lost = proxy.add(Fault("lost_reply", times=1, **JOB_STATUS))
    try:
        await status.note_missed(spec, SLOTS, "missed while no instance ran: catch-up policy None runs 0 of 3")
        (window,) = await _windows(cluster)
        assert lost.fired == 1
        assert window["count"] == 3, window
    finally:
        await status.flush()
        await scheduler.backend.close()
