"""AnarchonJobs whose Pods run real containers, on the real node (kubelet + containerd) instead of KWOK:
the exit code a container really returns decides the run's phase."""

from __future__ import annotations

from pathlib import Path

from realnode import NODE_NAME

from tests.harness.cluster import Cluster, Replicas, real_job
from tests.harness.until import until


def test_containers_really_run_and_their_exit_code_decides_the_run(
    cluster: Cluster, replicas_factory, real_node: str, tmp_path: Path
) -> None:
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    cluster.apply(real_job("ok", real_node, "echo hello from a real container; exit 0"))
    cluster.apply(real_job("three", real_node, "exit 3"))
    for job in ("ok", "three"):
        cluster.kubectl("annotate", "--overwrite", "anarchonjob", job, "anarchon.io/trigger=1800000000000")
    until("the exit-0 run to succeed", lambda: cluster.phases("ok")["Succeeded"] == 1, timeout=120)
    until("the exit-3 run to fail", lambda: cluster.phases("three")["Failed"] == 1, timeout=120)
    assert "code 3" in cluster.runs("three")[0]["status"]["message"]

    # The kubelet ran them, not KWOK: its node, its container IDs, the real exit codes and output.
    for job, code in (("ok", 0), ("three", 3)):
        run = cluster.runs(job)[0]["metadata"]["name"]
        (pod,) = cluster.pods(f"anarchon.io/run={run}")
        assert pod["spec"]["nodeName"] == NODE_NAME
        (state,) = pod["status"]["containerStatuses"]
        assert state["containerID"].startswith("containerd://")
        assert state["state"]["terminated"]["exitCode"] == code
    ok_pod = cluster.pods(f"anarchon.io/run={cluster.runs('ok')[0]['metadata']['name']}")[0]["metadata"]["name"]
    logs = cluster.kubectl("logs", ok_pod, check=False)
    assert "hello from a real container" in logs.stdout, logs.stderr


def test_an_image_that_does_not_exist_shows_on_the_run_and_fails_it_at_pending_timeout(
    cluster: Cluster, replicas_factory, real_node: str, tmp_path: Path
) -> None:
    """A real pull failure (the kubelet's ErrImagePull, then ImagePullBackOff), not a simulated one: the
    run says so while it waits, and pendingTimeout bounds the wait (a failure, no retry)."""
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-0")
    job = real_job("noimage", "anarchon-standin/does-not-exist:1", "exit 0")
    job["spec"]["pendingTimeout"] = "15s"
    cluster.apply(job)
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", "noimage", "anarchon.io/trigger=1800000000000")
    pull_failures = {"ErrImagePull", "ImagePullBackOff"}
    waiting = until(
        "the run to show the pull failure",
        lambda: [r for r in cluster.runs("noimage") if (r.get("status") or {}).get("reason") in pull_failures],
        timeout=60,
    )[0]["status"]
    assert waiting["phase"] == "Running" and "does-not-exist" in waiting["message"], waiting
    failed = until(
        "the run to fail at pendingTimeout",
        lambda: [r for r in cluster.runs("noimage") if (r.get("status") or {}).get("phase") == "Failed"],
        timeout=60,
    )[0]["status"]
    assert failed["reason"] == "PendingTimeout" and failed["attempt"] == 1, failed
    assert any(reason in failed["message"] for reason in pull_failures), failed
