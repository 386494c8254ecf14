"""The operator end to end: 3 replicas (OS processes), the real apiserver with KWOK, real stores."""

from __future__ import annotations

import signal
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until


def test_one_pod_per_slot_over_many_slots(cluster: Cluster, replicas_factory, store: str) -> None:
    replicas: Replicas = replicas_factory(store)
    for i in range(3):
        replicas.start(f"replica-{i}")
    period_ms = 2000
    cluster.apply(job_manifest("tick", every="2s", successfulRunsHistoryLimit=50))
    until("8 successful runs", lambda: cluster.phases("tick")["Succeeded"] >= 8, timeout=120)
    runs = cluster.runs("tick")
    # No slot lost: every 2s slot from the first run up to the newest finished one has its run
    # (Succeeded or Skipped, no history limit prunes them here). Newer slots may still be claiming.
    newest = max(int(r["spec"]["slot"]) for r in runs if (r.get("status") or {}).get("phase") == "Succeeded")
    slots = [int(r["spec"]["slot"]) for r in runs if int(r["spec"]["slot"]) <= newest]
    gaps = [(a, b) for a, b in pairwise(slots) if b - a != period_ms]
    assert not gaps, f"slots not {period_ms} ms apart (lost or doubled): {gaps}"
    pods = cluster.pods("anarchon.io/job=tick")
    per_run = Counter(p["metadata"]["labels"]["anarchon.io/run"] for p in pods)
    assert per_run and max(per_run.values()) == 1, per_run
    for run in runs:
        status = run.get("status") or {}
        if status.get("phase") == "Succeeded":
            assert status["attempt"] == 1
            assert status["instance"].startswith("replica-")
            assert status["podName"] == run["metadata"]["name"]
    instances = {(r.get("status") or {}).get("instance") for r in runs} - {None}
    assert len(instances) >= 2, f"runs should spread over replicas, got {instances}"
    job = cluster.get("anarchonjob", "tick")
    assert job["status"]["lastSuccessfulTime"]
    assert job["status"]["nextScheduleTime"]
    ready = {c["type"]: c["status"] for c in job["status"]["conditions"]}
    assert ready == {"Ready": "True", "Invalid": "False"}
    pod = pods[0]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["annotations"]["anarchon.io/scheduled-at"].endswith("Z")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "AnarchonRun"


def test_killed_runner_pod_is_adopted_not_relaunched(cluster: Cluster, replicas_factory, store: str) -> None:
    replicas: Replicas = replicas_factory(store)
    for i in range(3):
        replicas.start(f"replica-{i}")
    cluster.apply(job_manifest("long", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "20"}))
    run = cluster.trigger_running("long")
    runner = run["status"]["instance"]
    replicas.kill(runner, signal.SIGKILL)
    killed_at = time.monotonic()
    taken = until(
        "attempt 2 by a backup",
        lambda: [r for r in cluster.runs("long") if (r.get("status") or {}).get("attempt", 0) >= 2],
        timeout=60,
    )[0]
    assert time.monotonic() - killed_at < 4 + 2 * 1 + 10  # lease + 2 heartbeats + generous slack
    assert taken["status"]["instance"] != runner
    assert taken["status"]["podName"] == run["status"]["podName"], "the living Pod must be adopted"
    pods = cluster.pods(f"anarchon.io/run={run['metadata']['name']}")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    until("the adopted run to succeed", lambda: cluster.phases("long")["Succeeded"] == 1, timeout=60)
    # Events are posted best effort, after the status write: on a loaded machine one may come late.
    until("the Adopted Event", lambda: cluster.events("Adopted"), timeout=30)


def test_deleted_pod_is_relaunched_as_next_attempt(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(job_manifest("vanish", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "6"}))
    run = cluster.trigger_running("vanish")
    first_pod = run["status"]["podName"]
    cluster.kubectl("delete", "pod", first_pod, "--wait=false")
    second = until(
        "attempt 2",
        lambda: [r for r in cluster.runs("vanish") if (r.get("status") or {}).get("attempt", 0) >= 2],
        timeout=60,
    )[0]
    assert second["status"]["podName"] == run["metadata"]["name"], "the run's one Pod name, launched again"
    until("attempt 2 to succeed", lambda: cluster.phases("vanish")["Succeeded"] == 1, timeout=60)
    final = cluster.runs("vanish")[0]["status"]
    assert [a["outcome"] for a in final["attempts"]] == ["Interrupted", "Succeeded"]


def test_run_whose_pod_is_lost_more_often_than_max_attempts_ends_interrupted(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    """maxAttempts bounds launches of the Pod: every Pod vanishes, so after 2 launches the third
    attempt gives the run up (Interrupted) instead of launching again."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for i in range(2):
        replicas.start(f"replica-{i}")
    every_pod_vanishes = {"anarchon.test/vanish-seconds": "2"}
    cluster.apply(job_manifest("doomed", every="1h", suspend=True, maxAttempts=2, annotations=every_pod_vanishes))
    run = cluster.trigger_running("doomed")
    final = until(
        "the run to end once its launches are used up",
        lambda: [r["status"] for r in cluster.runs("doomed") if (r.get("status") or {}).get("finishTime")],
        timeout=90,
    )[0]
    assert final["phase"] == "Interrupted", final
    assert final["attempt"] == 3
    assert [a["outcome"] for a in final["attempts"]] == ["Interrupted", "Interrupted", "Interrupted"]
    assert [a.get("launched", False) for a in final["attempts"]] == [True, True, False]
    assert final["message"].startswith("gave up: its Pod was launched 2 times (maxAttempts 2): Pod "), final["message"]
    assert cluster.events("RunInterrupted")
    time.sleep(3)  # a third launch would have come by now: there is none
    assert [r["status"]["attempt"] for r in cluster.runs("doomed")] == [3]
    assert not cluster.pods(f"anarchon.io/run={run['metadata']['name']}")


def test_failed_pod_fails_the_run(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    cluster.apply(job_manifest("bad", every="1h", suspend=True, annotations={"anarchon.test/exit-code": "3"}))
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", "bad", "anarchon.io/trigger=1800000000000")
    until("the run to fail", lambda: cluster.phases("bad")["Failed"] == 1, timeout=60)
    status = cluster.runs("bad")[0]["status"]
    assert "code 3" in status["message"]
    assert status["attempt"] == 1
    assert cluster.events("RunFailed")


def test_invalid_spec_gets_condition_and_event_and_others_keep_running(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    cluster.apply(job_manifest("good", every="2s"))
    # The CRD rejects most bad input at admission; an unknown time zone gets past its pattern.
    cluster.apply(job_manifest("badzone", every=None, cron="0 8 * * *", tz="Mars/Olympus_Mons"))
    # So does a cron with valid characters that matches no date (it used to kill the slot loop).
    cluster.apply(job_manifest("feb30", every=None, cron="0 0 30 2 *"))

    def invalid(name: str) -> bool:
        job = cluster.get("anarchonjob", name)
        conds = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or []}
        return "Invalid" in conds and conds["Invalid"]["status"] == "True"

    for name, expected in (("badzone", "Mars/Olympus_Mons"), ("feb30", "spec.cron: '0 0 30 2 *' never fires")):
        until(f"the Invalid condition of {name}", lambda name=name: invalid(name), timeout=60)
        job = cluster.get("anarchonjob", name)
        cond = next(c for c in job["status"]["conditions"] if c["type"] == "Invalid")
        assert expected in cond["message"]
    assert cluster.events("InvalidSpec")
    until("the good job to keep running", lambda: cluster.phases("good")["Succeeded"] >= 2, timeout=120)
    assert replicas.procs["replica-0"].poll() is None


def test_claim_only_store_runs_allow_jobs_and_refuses_lease_policies(
    cluster: Cluster, replicas_factory, redis_url: str
) -> None:
    replicas: Replicas = replicas_factory(redis_url.replace("redis://", "redis+script://", 1))
    for i in range(2):
        replicas.start(f"replica-{i}")
    cluster.apply(job_manifest("plain", every="2s", overlap="Allow", maxAttempts=1))
    cluster.apply(job_manifest("defaults", every="2s"))  # overlap Skip, maxAttempts 3: need a lease

    def refused() -> str:
        job = cluster.get("anarchonjob", "defaults")
        conds = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or []}
        return conds.get("Invalid", {}).get("message", "") if conds.get("Invalid", {}).get("status") == "True" else ""

    message = until("the claim-only refusal", refused, timeout=60)
    assert "claim-only" in message and "overlap=Skip" in message
    until("runs on a claim-only store", lambda: cluster.phases("plain")["Succeeded"] >= 3, timeout=90)
    pods = cluster.pods("anarchon.io/job=plain")
    per_run = Counter(p["metadata"]["labels"]["anarchon.io/run"] for p in pods)
    assert max(per_run.values()) == 1
    assert cluster.runs("defaults") == []
