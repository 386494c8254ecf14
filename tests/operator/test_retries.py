"""Retries after a failed Pod (``spec.retries``), against the real API server with KWOK Pods.

The KWOK stages fail a Pod whose template says ``anarchon.test/exit-code``; with
``anarchon.test/fail-tries: N`` only the Pods of the first N tries fail (they read the Pod's
``anarchon.io/try`` label), so a test can have a workload that fails, fails, then succeeds.
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from anarchon.kube.api.client import Kube
from anarchon.kube.job.spec import JobSpec, parse_job, pod_name, run_name
from anarchon.kube.report.kube_events import EventPoster
from anarchon.kube.run import record as runs
from anarchon.kube.run import runstatus
from anarchon.kube.run.pods import build_pod, create_pod
from anarchon.kube.run.replaced import end_replaced
from anarchon.kube.run.runner import PodRunner
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.runs import SLOT, attempt
from tests.harness.until import until


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _pods_by_try(cluster: Cluster, run: str) -> dict[int, dict[str, Any]]:
    pods = cluster.pods(f"anarchon.io/run={run}")
    by_try: dict[int, dict[str, Any]] = {}
    for pod in pods:
        n = int(pod["metadata"]["labels"]["anarchon.io/try"])
        assert n not in by_try, f"two Pods of try {n}: {[p['metadata']['name'] for p in pods]}"
        by_try[n] = pod
    return by_try


def _finished_at(pod: dict[str, Any]) -> datetime:
    return _t(pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])


def _ended(cluster: Cluster, job: str) -> dict[str, Any]:
    return dict(
        until(
            f"the run of {job} to end",
            lambda: [r for r in cluster.runs(job) if (r.get("status") or {}).get("finishTime")],
            timeout=120,
        )[0]
    )


def test_fail_fail_succeed_ends_succeeded_after_three_tries_with_growing_backoff(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    cluster.apply(
        job_manifest(
            "flaky",
            every="1h",
            suspend=True,
            retries={"limit": 3, "backoff": "3s", "maxBackoff": "6s"},
            # Bounds one try, not the run: the tries and backoffs together take well over 6 s.
            timeout="6s",
            annotations={
                "anarchon.test/exit-code": "3",
                "anarchon.test/fail-tries": "2",
                "anarchon.test/run-seconds": "0.5",
            },
        )
    )
    cluster.trigger_running("flaky")
    run = _ended(cluster, "flaky")
    name, status = run["metadata"]["name"], run["status"]
    assert status["phase"] == "Succeeded", status
    assert (status["try"], status["attempt"], status["podName"]) == (3, 1, pod_name(name, 3))
    assert "nextTryTime" not in status
    assert [(t["try"], t["podName"], t["outcome"]) for t in status["tries"]] == [
        (1, name, "Failed"),
        (2, f"{name}-r1", "Failed"),
        (3, f"{name}-r2", "Succeeded"),
    ]
    assert "exited with code 3" in status["tries"][0]["message"]
    pods = _pods_by_try(cluster, name)
    assert sorted(pods) == [1, 2, 3]
    assert [pods[n]["status"]["phase"] for n in (1, 2, 3)] == ["Failed", "Failed", "Succeeded"]
    # Each try's Pod is created only after the one before it ended, and after the backoff:
    # 3 s, then 6 s (timestamps are whole seconds, so a second of slack).
    gaps = [(_t(pods[n + 1]["metadata"]["creationTimestamp"]) - _finished_at(pods[n])).total_seconds() for n in (1, 2)]
    assert gaps[0] >= 2 and gaps[1] >= 5, gaps
    assert gaps[1] > gaps[0], f"the backoff doubles: {gaps}"
    total = (_finished_at(pods[3]) - _t(pods[1]["metadata"]["creationTimestamp"])).total_seconds()
    assert total > 6, f"the run took {total} s: the timeout was not put to the test"
    # Repeats of an Event are aggregated (count), as Kubernetes does: two failed tries count 2.
    until(
        "a TryFailed Event per failed try",
        lambda: sum(int(e.get("count") or 1) for e in cluster.events("TryFailed")) == 2,
        timeout=30,
    )


def test_the_last_failed_try_fails_the_run(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    cluster.apply(
        job_manifest(
            "broken",
            every="1h",
            suspend=True,
            retries={"limit": 1, "backoff": "1s"},
            annotations={"anarchon.test/exit-code": "3", "anarchon.test/run-seconds": "0.5"},
        )
    )
    cluster.trigger_running("broken")
    run = _ended(cluster, "broken")
    name, status = run["metadata"]["name"], run["status"]
    assert status["phase"] == "Failed", status
    assert status["message"] == "failed after 2 tries: container main exited with code 3 (Error)", status
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Failed"), (2, "Failed")]
    assert sorted(_pods_by_try(cluster, name)) == [1, 2], "no third Pod past the limit"
    until(
        "the RunFailed Event",
        lambda: any("failed after 2 tries" in e["message"] for e in cluster.events("RunFailed")),
        timeout=30,
    )
    time.sleep(3)  # longer than the next backoff would be: nothing more is launched
    assert sorted(_pods_by_try(cluster, name)) == [1, 2]


def test_a_backup_launches_the_next_try_after_the_runner_died_in_the_backoff(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(
        job_manifest(
            "again",
            every="1h",
            suspend=True,
            retries={"limit": 2, "backoff": "10s"},
            annotations={
                "anarchon.test/exit-code": "3",
                "anarchon.test/fail-tries": "1",
                "anarchon.test/run-seconds": "0.5",
            },
        )
    )
    cluster.trigger_running("again")
    waiting = until(
        "the backoff after the first try",
        lambda: [r for r in cluster.runs("again") if (r.get("status") or {}).get("nextTryTime")],
        timeout=60,
    )[0]
    name, runner = waiting["metadata"]["name"], waiting["status"]["instance"]
    assert waiting["status"]["try"] == 2 and waiting["status"]["phase"] == "Running"
    replicas.kill(runner, signal.SIGKILL)
    next_try_at = _t(waiting["status"]["nextTryTime"])

    run = _ended(cluster, "again")
    status = run["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 2 and status["instance"] != runner, "a backup took the run over"
    assert status["try"] == 2, "the backup went on with the second try, not from the first"
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Failed"), (2, "Succeeded")]
    pods = _pods_by_try(cluster, name)
    assert sorted(pods) == [1, 2], "the failed try was not launched again, nor the next one twice"
    second = pods[2]
    assert second["metadata"]["name"] == f"{name}-r1"
    assert second["metadata"]["labels"]["anarchon.io/attempt"] == "2", "launched by the backup"
    # The backup kept the backoff the dead runner had started, not a new one from zero.
    started = _t(second["metadata"]["creationTimestamp"])
    assert started >= next_try_at, (started, next_try_at)
    assert (started - next_try_at).total_seconds() < 10, "the backup waited a second full backoff"


def test_a_runner_stopped_in_the_backoff_hands_the_next_try_over(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    """SIGTERM (a rolling update) during a backoff: the run is handed over at once, without using
    up an attempt, and the backup launches the next try when the backoff ends."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(
        job_manifest(
            "rolled",
            every="1h",
            suspend=True,
            maxAttempts=1,
            retries={"limit": 1, "backoff": "8s"},
            annotations={
                "anarchon.test/exit-code": "3",
                "anarchon.test/fail-tries": "1",
                "anarchon.test/run-seconds": "0.5",
            },
        )
    )
    cluster.trigger_running("rolled")
    waiting = until(
        "the backoff after the first try",
        lambda: [r for r in cluster.runs("rolled") if (r.get("status") or {}).get("nextTryTime")],
        timeout=60,
    )[0]
    name, runner = waiting["metadata"]["name"], waiting["status"]["instance"]
    replicas.kill(runner, signal.SIGTERM)
    next_try_at = _t(waiting["status"]["nextTryTime"])

    status = _ended(cluster, "rolled")["status"]
    assert status["phase"] == "Succeeded", status  # maxAttempts 1: the hand-over did not count
    assert (status["attempt"], status["try"]) == (2, 2) and status["instance"] != runner, status
    pods = _pods_by_try(cluster, name)
    assert sorted(pods) == [1, 2]
    assert _t(pods[2]["metadata"]["creationTimestamp"]) >= next_try_at


async def _first_try_failed(cluster: Cluster, kube: Kube, job: str) -> tuple[JobSpec, dict[str, Any]]:
    """What attempt 1 of a run leaves when it dies as its first try's Pod fails: the run, its try 1
    Running, and that try's Pod, Failed. Later tries of the job succeed."""
    cluster.apply(
        job_manifest(
            job,
            every="1h",
            suspend=True,
            retries={"limit": 2, "backoff": "1s"},
            annotations={
                "anarchon.test/exit-code": "3",
                "anarchon.test/fail-tries": "1",
                "anarchon.test/run-seconds": "0.5",
            },
        )
    )
    spec = parse_job(cluster.get("anarchonjob", job))
    name = run_name(spec.name, SLOT)
    run = await runs.ensure_run(kube, spec, SLOT, "Manual")
    await runs.update_status(
        kube, spec.namespace, name, 1, lambda s: runstatus.start_attempt(s, attempt=1, instance="dead", pod=name)
    )
    body = build_pod(
        spec, run=name, pod=name, slot=SLOT, attempt=1, try_number=1, instance="dead", run_uid=run["metadata"]["uid"]
    )
    first, _ = await create_pod(kube, body)
    await asyncio.to_thread(
        until,
        "try 1's Pod to fail",
        lambda: (cluster.get("pod", name) or {}).get("status", {}).get("phase") == "Failed",
        timeout=30,
    )
    return spec, first


async def test_a_failed_try_whose_runner_died_before_counting_it_is_retried_not_relaunched(
    cluster: Cluster, kube: Kube
) -> None:
    """The runner died between its Pod's failure and the status write that counts it: the run still
    says try 1 is Running. The next attempt finds try 1's Pod Failed: it counts it and goes on with
    try 2; it never launches try 1 again (its Pod keeps its uid)."""
    spec, first = await _first_try_failed(cluster, kube, "uncounted")
    name = run_name(spec.name, SLOT)
    ctx = attempt(2, *([True] * 50))
    await asyncio.wait_for(PodRunner(kube, EventPoster(kube), lambda: spec)(ctx), 60)  # returns: Succeeded

    status = cluster.get("anarchonrun", name)["status"]
    assert (status["phase"], status["try"], status["attempt"]) == ("Succeeded", 2, 2), status
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Failed"), (2, "Succeeded")]
    pods = _pods_by_try(cluster, name)
    assert sorted(pods) == [1, 2]
    assert pods[1]["metadata"]["uid"] == first["metadata"]["uid"], "try 1's Pod was launched again"
    assert pods[2]["metadata"]["name"] == f"{name}-r1"


async def test_a_run_replaced_in_its_backoff_is_interrupted_not_failed_by_its_earlier_try(
    cluster: Cluster, kube: Kube
) -> None:
    """Overlap Replace ends a run that waits out a backoff: its failed first try is not its outcome."""
    spec, _ = await _first_try_failed(cluster, kube, "replaced")
    name = run_name(spec.name, SLOT)
    at = datetime.now(UTC) + timedelta(seconds=30)
    await runs.update_status(
        kube,
        spec.namespace,
        name,
        1,
        lambda s: runstatus.try_failed(s, try_number=1, message="exit 3", next_try_at=at, next_pod=pod_name(name, 2)),
    )
    await end_replaced(kube, spec.namespace, name, [name], "replaced by the run of slot 1800000010000")

    status = cluster.get("anarchonrun", name)["status"]
    assert (status["phase"], status["message"]) == ("Interrupted", "replaced by the run of slot 1800000010000"), status
    assert [(t["try"], t["outcome"]) for t in status["tries"]] == [(1, "Failed")]
    assert sorted(_pods_by_try(cluster, name)) == [1], "no Pod of the next try"
