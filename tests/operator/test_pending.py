"""A Pod stuck Pending: the run says why (reason, condition, Event), and pendingTimeout bounds it.

The Pods ask for a node label no KWOK node has, so the real kube-scheduler leaves them
Pending with PodScheduled=False, reason Unschedulable, as on a full or mislabelled cluster.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until

SLOT = 1_800_000_000_000


def _stuck_job(name: str, selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    body = job_manifest(name, suspend=True, **spec)
    body["spec"]["template"]["spec"]["nodeSelector"] = selector
    return body


def _run(cluster: Cluster, job: str) -> dict[str, Any]:
    runs = cluster.runs(job)
    return dict(runs[0]) if runs else {}


def _condition(run: dict[str, Any]) -> dict[str, Any]:
    conditions = (run.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodPending"), {})


def test_a_pod_stuck_pending_is_shown_then_failed_at_pending_timeout(
    cluster: Cluster, replicas_factory, tmp_path: Path
) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    cluster.apply(_stuck_job("stuck", {"anarchon.test/pool": "nowhere"}, pendingTimeout="8s"))
    until("the job's status", lambda: cluster.get("anarchonjob", "stuck").get("status"), timeout=60)
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", "stuck", f"anarchon.io/trigger={SLOT}")

    run = until(
        "the run to say why its Pod waits",
        lambda: (r := _run(cluster, "stuck")) and (r.get("status") or {}).get("reason") and r,
        timeout=30,
    )
    status = run["status"]
    assert status["phase"] == "Running" and status["reason"] == "Unschedulable", status
    assert "Pending" in status["message"] and "node" in status["message"], status
    cond = _condition(run)
    assert cond["status"] == "True" and cond["reason"] == "Unschedulable", cond
    assert any("Unschedulable" in e["message"] for e in cluster.events("PodPending"))
    pod = status["podName"]
    assert cluster.get("pod", pod)["status"]["phase"] == "Pending"

    run = until(
        "the run to fail at pendingTimeout",
        lambda: (r := _run(cluster, "stuck")) and (r.get("status") or {}).get("phase") == "Failed" and r,
        timeout=60,
    )
    status = run["status"]
    assert status["reason"] == "PendingTimeout", status
    assert "stayed Pending longer than pendingTimeout (8s)" in status["message"], status
    assert "Unschedulable" in status["message"], status
    assert status["attempt"] == 1 and status["finishTime"], status  # a failure, not an interruption: no retry
    assert _condition(run)["status"] == "False" and _condition(run)["reason"] == "PendingTimeout"
    started = time.time()
    until("the stuck Pod to be deleted", lambda: cluster.get("pod", pod) is None, timeout=30)
    assert time.time() - started < 30
    assert any("pendingTimeout" in e["message"] for e in cluster.events("PendingTimeout"))
    time.sleep(3)
    assert len(cluster.pods("anarchon.io/job=stuck")) == 0, "no new attempt after a PendingTimeout"
    assert _run(cluster, "stuck")["status"]["phase"] == "Failed"


def test_a_pod_that_gets_a_node_clears_its_pending_reason(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    """No pendingTimeout: the run waits as long as its Pod (Running, reason shown), and once a
    node fits, the reason goes, the condition turns False and the run succeeds."""
    pool = f"p{uuid.uuid4().hex[:8]}"
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("replica-0")
    cluster.apply(_stuck_job("late", {"anarchon.test/pool": pool}))
    until("the job's status", lambda: cluster.get("anarchonjob", "late").get("status"), timeout=60)
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", "late", f"anarchon.io/trigger={SLOT}")
    until(
        "the run to say its Pod is unschedulable",
        lambda: (_run(cluster, "late").get("status") or {}).get("reason") == "Unschedulable",
        timeout=30,
    )
    try:
        cluster.kubectl("label", "node", "kwok-node-0", f"anarchon.test/pool={pool}")
        run = until(
            "the run to succeed once a node fits",
            lambda: (r := _run(cluster, "late")) and (r.get("status") or {}).get("phase") == "Succeeded" and r,
            timeout=90,
        )
    finally:
        cluster.kubectl("label", "node", "kwok-node-0", "anarchon.test/pool-", check=False)
    assert "reason" not in run["status"], run["status"]
    assert _condition(run)["status"] == "False", _condition(run)
