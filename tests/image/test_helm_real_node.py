"""`helm install` of the chart with the image built by this suite, on the real node: the operator Pod
becomes Ready through the chart's own probes, with the chart's RBAC and security context, and runs an
AnarchonJob whose workload is a real container.

The cluster has no Pod network (host network only) and no kube-proxy: the chart's ``hostNetwork``
value, and ``operator.extraEnv`` pointing the in-cluster client at the API server on 127.0.0.1. One
replica: host-network replicas on one node would collide on their ports. The store is a real Redis on
127.0.0.1 (tests/servers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from controlplane import free_port
from realnode import REAL_NODE_LABEL, REAL_NODE_TAINT

from tests.chart.chartlib import CHART, helm
from tests.harness.cluster import Cluster, Replicas, real_job
from tests.harness.until import until


def chart_values(control_plane: Any, namespace: str, image: str, store_url: str) -> dict[str, Any]:
    """One host-network replica on the real node, watching ``namespace``, on the given store."""
    repository, tag = image.rsplit(":", 1)
    api = urlsplit(control_plane.server)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "replicaCount": 1,
        "podDisruptionBudget": {"enabled": False},
        "watchNamespaces": [namespace],
        "store": {"type": "redis", "url": store_url},
        "hostNetwork": True,
        "metrics": {"port": free_port()},
        "health": {"port": free_port()},
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
        "operator": {
            "extraEnv": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
            ]
        },
    }


def test_helm_install_runs_a_ready_operator_that_runs_real_containers(
    control_plane: Any, namespace: str, image_on_real_node: str, real_node: str, redis_url: str, tmp_path: Path
) -> None:
    values = chart_values(control_plane, namespace, image_on_real_node, redis_url)
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    kubeconfig = str(control_plane.kubeconfig)
    helm("install", "anarchon", str(CHART), "--kubeconfig", kubeconfig, "-n", namespace, "-f", str(values_file))
    cluster = Cluster(control_plane, namespace)
    try:
        # Ready through the chart's startup, liveness and readiness probes (the kubelet's own HTTP checks).
        rollout = cluster.kubectl("rollout", "status", "deployment/anarchon", "--timeout=240s", check=False)
        (pod,) = cluster.pods("app.kubernetes.io/name=anarchon")
        assert rollout.returncode == 0, f"{rollout.stderr}\n{json.dumps(pod.get('status'), indent=1)[-3000:]}"
        assert pod["spec"]["nodeName"] == control_plane.real_node.name
        (state,) = pod["status"]["containerStatuses"]
        assert state["ready"] and state["restartCount"] == 0, state

        # The installed operator runs jobs whose workloads are real containers (image: the stand-in base).
        cluster.apply(real_job("ok", real_node, "exit 0"))
        cluster.apply(real_job("three", real_node, "exit 3"))
        for job in ("ok", "three"):
            cluster.kubectl("annotate", "--overwrite", "anarchonjob", job, "anarchon.io/trigger=1800000000000")
        until("the exit-0 run to succeed", lambda: cluster.phases("ok")["Succeeded"] == 1, timeout=120)
        until("the exit-3 run to fail", lambda: cluster.phases("three")["Failed"] == 1, timeout=120)
        logs = cluster.kubectl("logs", pod["metadata"]["name"], check=False).stdout
        # The chart's RBAC is enough for all of it. (A 429 from a just-created CRD's storage may be retried.)
        assert "Forbidden" not in logs and "status=403" not in logs and "Traceback" not in logs, logs[-3000:]

        # An upgrade rolls the replica with the new values; it comes back Ready.
        helm("upgrade", "anarchon", str(CHART), "--kubeconfig", kubeconfig, "-n", namespace, "-f", str(values_file),
             "--set", "operator.logFormat=plain")  # fmt: skip
        rollout = cluster.kubectl("rollout", "status", "deployment/anarchon", "--timeout=240s", check=False)
        assert rollout.returncode == 0, rollout.stderr
        (pod,) = [
            p for p in cluster.pods("app.kubernetes.io/name=anarchon") if "deletionTimestamp" not in p["metadata"]
        ]
        assert "--log-format=plain" in pod["spec"]["containers"][0]["args"]
    finally:
        helm("uninstall", "anarchon", "--kubeconfig", kubeconfig, "-n", namespace, "--wait", check=False)
    # Nothing of the release is left, in the namespace or cluster-wide; the jobs (user data) stay.
    kinds = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,configmaps,secrets,pdb"
    # (The replica's Pod may still be handing over after SIGTERM: it goes within its grace period.)
    until(
        "every object of the release to be gone",
        lambda: not cluster.get(kinds, selector="app.kubernetes.io/instance=anarchon")["items"],
        timeout=90,
    )
    cluster_wide = control_plane.kubectl(
        "get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance=anarchon", "-o", "name"
    ).stdout
    assert not cluster_wide.strip(), cluster_wide
    assert {j["metadata"]["name"] for j in cluster.get("anarchonjobs")["items"]} == {"ok", "three"}


@pytest.mark.parametrize("how", ["kubectl delete pod", "kubectl rollout restart"])
def test_stopping_the_operator_pod_hands_its_running_run_to_another_replica(
    how: str,
    control_plane: Any,
    namespace: str,
    image_on_real_node: str,
    real_node: str,
    redis_url: str,
    tmp_path: Path,
) -> None:
    """The installed replica runs a long run and is stopped (its Pod deleted, or the Deployment
    restarted): the run is adopted (same workload Pod, still running its real container), not
    relaunched. The other replica is a process beside the installed one (a second host-network replica
    would collide with its ports)."""
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(chart_values(control_plane, namespace, image_on_real_node, redis_url)))
    kubeconfig = str(control_plane.kubeconfig)
    helm("install", "anarchon", str(CHART), "--kubeconfig", kubeconfig, "-n", namespace, "-f", str(values_file))
    cluster = Cluster(control_plane, namespace)
    beside = Replicas(control_plane, namespace, redis_url, tmp_path)
    try:
        rollout = cluster.kubectl("rollout", "status", "deployment/anarchon", "--timeout=240s", check=False)
        assert rollout.returncode == 0, rollout.stderr
        (operator_pod,) = cluster.pods("app.kubernetes.io/name=anarchon")
        cluster.apply(real_job("long", real_node, "sleep 25"))
        run = cluster.trigger_running("long")
        assert run["status"]["instance"] == operator_pod["metadata"]["name"]  # the only replica so far
        beside.start("beside-0")
        if how == "kubectl delete pod":
            cluster.kubectl("delete", "pod", operator_pod["metadata"]["name"], "--wait=false")
        else:
            cluster.kubectl("rollout", "restart", "deployment/anarchon")
        taken = until(
            "the run adopted by another replica",
            lambda: [r for r in cluster.runs("long") if (r.get("status") or {}).get("attempt", 0) >= 2],
            timeout=90,
        )[0]
        assert taken["status"]["instance"] != operator_pod["metadata"]["name"]
        assert taken["status"]["podName"] == run["status"]["podName"], "the running workload must be adopted"
        until("the adopted run to succeed", lambda: cluster.phases("long")["Succeeded"] == 1, timeout=90)
        (workload,) = cluster.pods(f"anarchon.io/run={run['metadata']['name']}")
        (state,) = workload["status"]["containerStatuses"]
        assert state["restartCount"] == 0 and state["state"]["terminated"]["exitCode"] == 0
        # The Deployment has its replica back (a new Pod; with the host network it may have had to wait
        # for the old one to free its ports).
        rollout = cluster.kubectl("rollout", "status", "deployment/anarchon", "--timeout=240s", check=False)
        assert rollout.returncode == 0, rollout.stderr
    finally:
        beside.stop_all()
        helm("uninstall", "anarchon", "--kubeconfig", kubeconfig, "-n", namespace, "--wait", check=False)
