"""Operator policies end to end: overlap, suspend, catch-up, fencing, history, time zones, metrics."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from anarchon.kube.job.spec import run_name
from anarchon.kube.job.triggers import pending_requests
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.controlplane import REPO
from tests.harness.until import until
from tests.servers.redis import RedisServer, free_port


def _live_pods(cluster: Cluster, job: str) -> list[dict]:
    return [
        p
        for p in cluster.pods(f"anarchon.io/job={job}")
        if p["status"].get("phase") in ("Pending", "Running") and not p["metadata"].get("deletionTimestamp")
    ]


def test_overlap_skip_records_skipped_runs(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(
        job_manifest(
            "skipper", every="2s", annotations={"anarchon.test/run-seconds": "5"}, successfulRunsHistoryLimit=20
        )
    )
    max_live = 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and cluster.phases("skipper")["Skipped"] < 2:
        max_live = max(max_live, len(_live_pods(cluster, "skipper")))
        time.sleep(0.5)
    phases = cluster.phases("skipper")
    assert phases["Skipped"] >= 2, phases
    assert max_live <= 1
    skipped = next(r for r in cluster.runs("skipper") if (r.get("status") or {}).get("phase") == "Skipped")
    assert "still active" in skipped["status"]["message"]
    assert cluster.events("Skipped")


def test_overlap_allow_runs_side_by_side(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    cluster.apply(job_manifest("together", every="2s", overlap="Allow", annotations={"anarchon.test/run-seconds": "6"}))
    until("two runs at once", lambda: len(_live_pods(cluster, "together")) >= 2, timeout=90)
    assert cluster.phases("together")["Skipped"] == 0


def test_overlap_replace_stops_the_older_run(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(
        job_manifest(
            "replacer",
            every="3s",
            overlap="Replace",
            annotations={"anarchon.test/run-seconds": "-1"},
            failedRunsHistoryLimit=10,
        )
    )

    def replaced() -> list[dict]:
        return [
            r
            for r in cluster.runs("replacer")
            if (r.get("status") or {}).get("phase") == "Interrupted" and "replaced" in r["status"].get("message", "")
        ]

    until("two replaced runs", lambda: len(replaced()) >= 2, timeout=90)
    time.sleep(2)
    assert len(_live_pods(cluster, "replacer")) <= 1
    assert cluster.events("Replaced")


def test_suspend_and_resume(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    cluster.apply(job_manifest("sleepy", every="1s", suspend=True))
    time.sleep(8)
    assert cluster.runs("sleepy") == []
    job = cluster.get("anarchonjob", "sleepy")
    ready = next(c for c in job["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Suspended")
    cluster.kubectl("patch", "anarchonjob", "sleepy", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    until("runs after resume", lambda: cluster.phases("sleepy")["Succeeded"] >= 2, timeout=60)


def test_catch_up_after_every_replica_was_down(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    replicas.start("replica-1")
    cluster.apply(
        # Allow: a run handed over at the SIGTERM may still be active when the catch-up claims.
        job_manifest(
            "catcher",
            every="3s",
            overlap="Allow",
            catchUp={"policy": "All", "window": "1h"},
            successfulRunsHistoryLimit=50,
        )
    )
    until("a first run", lambda: cluster.phases("catcher")["Succeeded"] >= 1, timeout=60)
    until(
        "no run in flight",
        lambda: not [r for r in cluster.runs("catcher") if (r.get("status") or {}).get("phase") == "Running"],
        timeout=30,
    )
    replicas.kill("replica-0", signal.SIGTERM)
    replicas.kill("replica-1", signal.SIGTERM)
    down_from = max(int(r["spec"]["slot"]) for r in cluster.runs("catcher"))
    time.sleep(10)  # 3 or more slots pass with nobody up
    restarted_ms = int(time.time() * 1000)
    replicas.start("replica-2")
    until(
        "the missed slots to be caught up",
        lambda: (
            len(
                [
                    r
                    for r in cluster.runs("catcher")
                    if int(r["spec"]["slot"]) > down_from and (r.get("status") or {}).get("phase") == "Succeeded"
                ]
            )
            >= 3
        ),
        timeout=90,
    )
    slots = sorted(int(r["spec"]["slot"]) for r in cluster.runs("catcher"))
    assert all(b - a == 3000 for a, b in itertools.pairwise(slots)), "every slot once, none lost"
    # The missed ones (those due before the new replica was up, which is a little after
    # `restarted_ms`) say so; every later one is an ordinary scheduled run.
    trigger = {int(r["spec"]["slot"]): r["spec"]["trigger"] for r in cluster.runs("catcher")}
    caught_up = sorted(s for s, t in trigger.items() if t == "CatchUp")
    assert len(caught_up) >= 3 and caught_up[0] > down_from and caught_up[-1] < restarted_ms + 10_000, caught_up
    assert all(t == "Schedule" for s, t in trigger.items() if s > caught_up[-1]), trigger


def test_frozen_runner_is_fenced_and_the_pod_adopted(cluster: Cluster, replicas_factory, store: str) -> None:
    replicas: Replicas = replicas_factory(store)
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(job_manifest("frozen", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "25"}))
    run = cluster.trigger_running("frozen")
    runner = run["status"]["instance"]
    replicas.kill(runner, signal.SIGSTOP)
    taken = until(
        "attempt 2",
        lambda: [r for r in cluster.runs("frozen") if (r.get("status") or {}).get("attempt", 0) >= 2],
        timeout=60,
    )[0]
    assert taken["status"]["podName"] == run["status"]["podName"]
    replicas.kill(runner, signal.SIGCONT)
    until("the woken runner to be fenced", lambda: "fenced" in replicas.log(runner), timeout=30)
    until("the run to succeed", lambda: cluster.phases("frozen")["Succeeded"] == 1, timeout=60)
    final = cluster.runs("frozen")[0]["status"]
    assert final["attempt"] == 2 and final["instance"] != runner
    assert len(cluster.pods(f"anarchon.io/run={run['metadata']['name']}")) == 1


def test_history_limits_delete_old_runs_and_pods(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    cluster.apply(job_manifest("short", every="1s", successfulRunsHistoryLimit=2, failedRunsHistoryLimit=0))
    until("runs", lambda: cluster.phases("short")["Succeeded"] >= 2, timeout=60)
    time.sleep(8)  # about 8 runs more: without the limits, 10 Succeeded
    # The limit, plus one finishing right now; the status refresh that enforces it gathers a
    # job's changes for a second after a run ended (status.REFRESH_AFTER_END_S).
    until("the history at its limit", lambda: cluster.phases("short")["Succeeded"] <= 3, timeout=30)
    job = cluster.get("anarchonjob", "short")
    assert job["status"]["lastSuccessfulTime"]
    until(
        "old Pods to be garbage-collected with their runs",
        lambda: len(cluster.pods("anarchon.io/job=short")) <= 4,
        timeout=60,
    )


def test_cron_with_time_zone(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    cluster.apply(job_manifest("zoned", every=None, cron="*/3 * * * * *", tz="Asia/Kolkata"))
    until("cron runs", lambda: cluster.phases("zoned")["Succeeded"] >= 2, timeout=60)
    slots = [int(r["spec"]["slot"]) for r in cluster.runs("zoned")]
    assert all(s % 3000 == 0 for s in slots)
    job = cluster.get("anarchonjob", "zoned")
    assert job["status"]["nextScheduleTime"].endswith("Z")
    assert job["status"]["schedule"] == "*/3 * * * * * Asia/Kolkata"
    # Seconds do not depend on the zone; 08:00 does: the next one is 08:00 in Kolkata (02:30 UTC).
    cluster.apply(job_manifest("morning", every=None, cron="0 8 * * *", tz="Asia/Kolkata"))
    status = until(
        "the next 08:00",
        lambda: (
            (cluster.get("anarchonjob", "morning").get("status") or {}).get("nextScheduleTime")
            and cluster.get("anarchonjob", "morning")["status"]
        ),
        timeout=60,
    )
    nxt = datetime.fromisoformat(status["nextScheduleTime"].replace("Z", "+00:00"))
    assert (nxt.hour, nxt.minute) == (2, 30) and status["schedule"] == "0 8 * * * Asia/Kolkata", status
    assert timedelta(0) < nxt - datetime.now(UTC) <= timedelta(days=1)
    table = cluster.kubectl("get", "anarchonjob", "morning").stdout
    assert "0 8 * * * Asia/Kolkata" in table, table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as rsp:
            return rsp.status, json.loads(rsp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_metrics_liveness_and_readiness_endpoints(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    metrics, health = _free_port(), _free_port()
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("metrics-0", "--metrics-port", str(metrics), "--health-port", str(health))
    cluster.apply(job_manifest("measured", every="1s"))
    until("runs", lambda: cluster.phases("measured")["Succeeded"] >= 2, timeout=60)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as rsp:
            return str(rsp.read().decode())

    text = until("metrics", lambda: "anarchon_runs_total" in (t := scrape()) and t, timeout=30)
    assert 'anarchon_claims_total{result="won"}' in text
    assert "anarchon_slot_claim_skew_seconds_bucket" in text
    assert 'anarchon_runs_total{outcome="Succeeded"}' in text
    assert "anarchon_pod_watch_up 1.0" in text
    launched = [line for line in text.splitlines() if line.startswith("anarchon_job_pod_delay_seconds_count{")]
    assert launched and float(launched[0].split()[1]) >= 2, launched  # one per first-attempt Pod
    assert "anarchon_runs_given_up_total 0.0" in text
    info = {"instance": "metrics-0", "jobs": 1, "storeNotSharedWith": []}  # no replica outside its store
    assert _get(health, "/healthz") == (200, {"alive": True, **info})
    assert _get(health, "/readyz") == (200, {"ready": True, "store": "sqlite", **info})


def test_replica_without_its_store_is_alive_but_not_ready(cluster: Cluster, replicas_factory) -> None:
    """No crash loop while the store is away: alive (retrying), not ready, ready once it is up."""
    health = _free_port()
    store = RedisServer(port=free_port())  # not started yet: connections are refused
    replicas: Replicas = replicas_factory(store.url)
    proc = replicas.start("waiting-0", "--health-port", str(health))
    try:
        status, body = until("the readiness endpoint", lambda: _answer(health, "/readyz"), timeout=60)
        assert status == 503 and body["ready"] is False and body["store"] == "redis", body
        assert "refused" in body["error"].lower() or "connect" in body["error"].lower(), body
        assert _get(health, "/healthz")[0] == 200
        time.sleep(3)
        assert proc.poll() is None, "the replica must wait for its store, not exit"
        assert _get(health, "/readyz")[0] == 503
        store.start()
        until("ready once the store is up", lambda: _get(health, "/readyz")[0] == 200, timeout=60)
        cluster.apply(job_manifest("late", every="1s"))
        until("runs once ready", lambda: cluster.phases("late")["Succeeded"] >= 1, timeout=60)
    finally:
        replicas.stop_all()
        store.stop()


def _answer(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    """The endpoint's answer, or None while nothing listens yet."""
    try:
        return _get(port, path)
    except OSError:
        return None


def _anarchon(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{REPO / 'operator'}:{REPO}", "PATH": "/usr/bin:/bin"}  # no kubectl needed
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_trigger_runs_once_even_after_a_restart(
    cluster: Cluster, replicas_factory, control_plane, namespace: str, tmp_path: Path
) -> None:
    """A handled trigger request is removed from the job: a replica started later does not run it
    again, even once its run has left the history (the store then has no record of that slot)."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    # Allow: with Skip, a manual run due while a scheduled one is active would be Skipped.
    cluster.apply(job_manifest("once", every="1s", overlap="Allow", successfulRunsHistoryLimit=1))
    until("scheduled runs", lambda: cluster.phases("once")["Succeeded"] >= 1, timeout=60)
    kubeconfig = str(control_plane.kubeconfig)
    missing = _anarchon("trigger", "nosuchjob", "-n", namespace, "--kubeconfig", kubeconfig)
    assert missing.returncode == 1 and "no AnarchonJob 'nosuchjob'" in missing.stderr, missing

    slot = int(time.time()) * 1000 + 500  # off the 1 s grid: only the trigger has this slot
    done = _anarchon("trigger", "once", "-n", namespace, "--kubeconfig", kubeconfig, "--at", str(slot))
    assert done.returncode == 0, done.stderr
    manual = run_name("once", slot)

    def names() -> list[str]:
        return [r["metadata"]["name"] for r in cluster.runs("once")]

    # Its AnarchonRun may be gone again within a second (history limit 1): the log is the record.
    succeeded = f"@{slot} attempt 1: Succeeded"
    until("the triggered run to succeed", lambda: succeeded in replicas.log("replica-0"), timeout=60)
    assert pending_requests(cluster.get("anarchonjob", "once")["metadata"]["annotations"]) == {}
    until("the history limit to delete the manual run", lambda: manual not in names(), timeout=60)

    replicas.kill("replica-0")
    replicas.start("replica-1")
    until(
        "runs by the new replica",
        lambda: any((r.get("status") or {}).get("instance") == "replica-1" for r in cluster.runs("once")),
        timeout=60,
    )
    time.sleep(3)
    assert f"@{slot} attempt" not in replicas.log("replica-1"), "the old trigger ran again after the restart"
    assert manual not in names()
