"""Tests of the test control plane itself: the behaviours the operator's tests rely on.

Each test checks one promise of e2e/controlplane (real API semantics, scheduling onto
KWOK nodes, the Pod lifecycle annotations, watches, RBAC, garbage collection), so that
an operator test failing later is not a harness problem in disguise. Real time is used
with generous bounds: a 2-core CI machine shared with other suites can be slow.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane
from kubernetes_asyncio import client, config, watch

from tests.harness.until import until

TIMEOUT = 60.0
CONTROLPLANE_PY = Path(__file__).resolve().parents[2] / "e2e" / "controlplane" / "controlplane.py"


def pod_manifest(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A plain Pod without nodeName: the scheduler must place it on a KWOK node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", "exit 0"]}],
        },
    }


def get_json(cp: ControlPlane, *args: str) -> Any:
    return json.loads(cp.kubectl("get", *args, "-o", "json").stdout)


def create(cp: ControlPlane, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = cp.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(obj)).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    """The Pod, or None once it is gone (read with the stdlib client: polling kubectl costs a process each time)."""
    try:
        result: dict[str, Any] = cp.api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    return result


def phase_is(cp: ControlPlane, namespace: str, name: str, phase: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        p = pod(cp, namespace, name)
        return p if p is not None and p.get("status", {}).get("phase") == phase else None

    return check


def test_readyz_and_nodes(control_plane: ControlPlane) -> None:
    """/readyz is ok and the fake nodes are Ready, schedulable and managed by KWOK.

    The optional real node (tainted, checked by tests/operator/test_real_node.py) is there
    too once a test of the session has asked for it; it is the one node beside KWOK's.
    """
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    real = control_plane.real_node.name if control_plane.real_node is not None else None
    everything = get_json(control_plane, "nodes")["items"]
    expected = [*control_plane.nodes, *([real] if real else [])]
    assert sorted(n["metadata"]["name"] for n in everything) == sorted(expected)
    nodes = [n for n in everything if n["metadata"]["name"] != real]
    for n in nodes:
        ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", n["status"]["conditions"]
        assert not n["spec"].get("taints"), n["spec"]
    assert control_plane.version_info["kubernetes"].startswith("v1.")


def test_namespace_create(control_plane: ControlPlane) -> None:
    name = f"ns-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    try:
        assert get_json(control_plane, "namespace", name)["status"]["phase"] == "Active"
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false")


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.harness.anarchon.test"},
    "spec": {
        "group": "harness.anarchon.test",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_with_status_subresource(control_plane: ControlPlane, namespace: str) -> None:
    """Status is written only through /status, and spec updates do not touch it (real subresource semantics)."""
    cp = control_plane
    cp.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.harness.anarchon.test")
    widget = {"apiVersion": "harness.anarchon.test/v1", "kind": "Widget", "metadata": {"name": "w1"}}
    widget["spec"] = {"size": 1}
    widget["status"] = {"phase": "ignored-on-create"}
    until("Widget kind served", lambda: cp.kubectl("get", "widgets", "-n", namespace, check=False).returncode == 0)
    created = create(cp, namespace, widget)
    assert "status" not in created or created["status"] == {}, created

    cp.kubectl(
        "patch", "widget", "w1", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Ready"}}),
    )  # fmt: skip
    # A patch of the main resource must not change status.
    cp.kubectl(
        "patch", "widget", "w1", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"size": 2}, "status": {"phase": "Overwritten"}}),
    )  # fmt: skip
    got = get_json(cp, "widget", "w1", "-n", namespace)
    assert got["spec"] == {"size": 2}
    assert got["status"] == {"phase": "Ready"}
    assert got["metadata"]["generation"] == 2  # status writes do not bump generation


def test_pod_is_scheduled_and_succeeds(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    t0 = time.monotonic()
    create(cp, namespace, pod_manifest("ok", {"anarchon.test/run-seconds": "1"}))
    done = until("pod ok Succeeded", phase_is(cp, namespace, "ok", "Succeeded"))
    elapsed = time.monotonic() - t0
    assert done["spec"]["nodeName"] in cp.nodes
    (status,) = done["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["state"]["terminated"]["reason"] == "Completed"
    assert "running" not in status["state"]
    assert done["status"]["podIP"]
    assert elapsed >= 1.0, elapsed


def test_pod_made_to_fail_with_exit_code(control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    create(cp, namespace, pod_manifest("bad", {"anarchon.test/exit-code": "3", "anarchon.test/run-seconds": "0.5"}))
    failed = until("pod bad Failed", phase_is(cp, namespace, "bad", "Failed"))
    (status,) = failed["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 3
    assert status["state"]["terminated"]["reason"] == "Error"


def test_run_seconds_keeps_pod_running(control_plane: ControlPlane, namespace: str) -> None:
    """A Pod with run-seconds N is Running for about N seconds before it succeeds."""
    cp = control_plane
    create(cp, namespace, pod_manifest("slow", {"anarchon.test/run-seconds": "4"}))
    until("pod slow Running", phase_is(cp, namespace, "slow", "Running"))
    done = until("pod slow Succeeded", phase_is(cp, namespace, "slow", "Succeeded"))
    # Judged on the status timestamps (whole seconds), not on when this test happened to look.
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    started = datetime.fromisoformat(terminated["startedAt"])
    finished = datetime.fromisoformat(terminated["finishedAt"])
    assert timedelta(seconds=3) <= finished - started <= timedelta(seconds=30), terminated


def test_watch_sees_pending_running_succeeded(control_plane: ControlPlane, namespace: str) -> None:
    """A watch (kubernetes_asyncio, as the operator uses) sees the default lifecycle's phases in order."""

    async def run() -> list[str]:
        api = await config.new_client_from_config(config_file=str(control_plane.kubeconfig))
        async with api:
            v1 = client.CoreV1Api(api)
            listed = await v1.list_namespaced_pod(namespace)
            body = pod_manifest("watched")  # no annotations: the default lifecycle
            # The generated client serialises a plain dict body as-is; its stubs only name the model.
            await v1.create_namespaced_pod(namespace, body)  # type: ignore[arg-type]
            phases: list[str] = []
            w = watch.Watch()
            async with w.stream(
                v1.list_namespaced_pod,
                namespace,
                field_selector="metadata.name=watched",
                resource_version=listed.metadata.resource_version,
                timeout_seconds=int(TIMEOUT),
            ) as stream:
                async for event in stream:
                    phase = event["object"].status.phase
                    if not phases or phases[-1] != phase:
                        phases.append(phase)
                    if phase in ("Succeeded", "Failed"):
                        break
            return phases

    phases = asyncio.run(asyncio.wait_for(run(), TIMEOUT + 10))
    assert phases == ["Pending", "Running", "Succeeded"]


def test_deleted_running_pod_vanishes(control_plane: ControlPlane, namespace: str) -> None:
    """run-seconds -1 runs until deleted; a normal delete (30s grace) completes at once."""
    cp = control_plane
    create(cp, namespace, pod_manifest("forever", {"anarchon.test/run-seconds": "-1"}))
    until("pod forever Running", phase_is(cp, namespace, "forever", "Running"))
    time.sleep(2.5)
    still = pod(cp, namespace, "forever")
    assert still is not None and still["status"]["phase"] == "Running"
    cp.kubectl("delete", "pod", "forever", "-n", namespace, "--wait=false")
    until("pod forever gone", lambda: pod(cp, namespace, "forever") is None, timeout=30)


def test_pod_vanishes_by_annotation(control_plane: ControlPlane, namespace: str) -> None:
    """vanish-seconds: the Pod is removed after running that long, with no terminal phase written."""
    cp = control_plane
    created = create(cp, namespace, pod_manifest("ghost", {"anarchon.test/vanish-seconds": "1"}))
    until("pod ghost Running", phase_is(cp, namespace, "ghost", "Running"))
    until("pod ghost gone", lambda: pod(cp, namespace, "ghost") is None, timeout=30)
    events = get_json(cp, "events", "-n", namespace, "--field-selector", "involvedObject.name=ghost")["items"]
    assert any(e["involvedObject"]["uid"] == created["metadata"]["uid"] for e in events)


def test_rbac_denies_least_privilege_user(control_plane: ControlPlane, namespace: str) -> None:
    """A static user with no bindings gets 403; a RoleBinding then allows exactly what it grants."""
    cp = control_plane
    alice = cp.user_kubeconfig("alice")
    denied = cp.kubectl("get", "pods", "-n", namespace, kubeconfig=alice, check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower(), denied.stderr
    with pytest.raises(urllib.error.HTTPError) as err:
        cp.api("GET", f"/api/v1/namespaces/{namespace}/pods", token=cp.user_tokens["alice"])
    assert err.value.code == 403

    cp.kubectl("create", "role", "pod-reader", "-n", namespace, "--verb=get,list", "--resource=pods")
    cp.kubectl("create", "rolebinding", "alice-reads", "-n", namespace, "--role=pod-reader", "--user=alice")
    until(
        "alice may list pods",
        lambda: cp.kubectl("get", "pods", "-n", namespace, kubeconfig=alice, check=False).returncode == 0,
    )
    still_denied = cp.kubectl("get", "secrets", "-n", namespace, kubeconfig=alice, check=False)
    assert "forbidden" in still_denied.stderr.lower(), still_denied.stderr


def test_service_account_token_and_rbac(control_plane: ControlPlane, namespace: str) -> None:
    """TokenRequest works (as for the in-cluster operator) and the SA is limited by RBAC."""
    cp = control_plane
    sa = cp.service_account_kubeconfig(namespace, "operator")
    who = cp.kubectl("auth", "whoami", "-o", "json", kubeconfig=sa, check=False)
    assert who.returncode == 0, who.stderr
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:operator"
    assert (
        cp.kubectl("auth", "can-i", "create", "pods", "-n", namespace, kubeconfig=sa, check=False).stdout.strip()
        == "no"
    )
    cp.kubectl("create", "role", "pod-maker", "-n", namespace, "--verb=create,get", "--resource=pods")
    cp.kubectl(
        "create", "rolebinding", "operator-makes-pods", "-n", namespace, "--role=pod-maker",
        f"--serviceaccount={namespace}:operator",
    )  # fmt: skip
    until(
        "operator SA may create pods",
        lambda: (
            cp.kubectl("auth", "can-i", "create", "pods", "-n", namespace, kubeconfig=sa, check=False).stdout.strip()
            == "yes"
        ),
    )


def test_garbage_collector_removes_owned_objects(control_plane: ControlPlane, namespace: str) -> None:
    """Deleting an owner makes kube-controller-manager's GC delete its dependents (history cleanup relies on it)."""
    cp = control_plane
    parent = create(cp, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "parent"}})
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "parent",
        "uid": parent["metadata"]["uid"],
    }
    child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "child", "ownerReferences": [owner]}}
    create(cp, namespace, child)
    orphan = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unowned"}}
    create(cp, namespace, orphan)
    cp.kubectl("delete", "configmap", "parent", "-n", namespace)

    def child_gone() -> bool:
        res = cp.kubectl("get", "configmap", "child", "-n", namespace, check=False)
        return res.returncode != 0 and "NotFound" in res.stderr

    until("child ConfigMap garbage-collected", child_gone)
    assert cp.kubectl("get", "configmap", "unowned", "-n", namespace, check=False).returncode == 0


def test_cli_up_prints_kubeconfig_and_tears_down_on_sigint(control_plane: ControlPlane, tmp_path: Path) -> None:
    """`controlplane.py up` (the by-hand debugging entry point) serves, then stops every child on Ctrl-C.

    Starts a second, independent control plane (own ports and run dir) next to the session one.
    """
    run_dir = tmp_path / "cp"
    proc = subprocess.Popen(
        [sys.executable, str(CONTROLPLANE_PY), "up", "--dir", str(run_dir), "--nodes", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # blocks until up (or the CLI exits and closes stdout)
        assert first.startswith("kubeconfig: "), first + (proc.stderr.read() if proc.stderr else "")
        kubeconfig = Path(first.removeprefix("kubeconfig: ").strip())
        assert proc.stdout.readline().strip() == f"export KUBECONFIG={kubeconfig}"
        nodes = control_plane.kubectl("get", "nodes", "-o", "name", kubeconfig=kubeconfig).stdout.split()
        assert nodes == ["node/kwok-node-0"]
        found = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
        pids = [int(p) for p in found if int(p) != proc.pid]
        assert len(pids) == 5, pids  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    assert rc == 0, proc.stderr.read() if proc.stderr else rc
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_job_completes_through_kwok_pods(control_plane: ControlPlane, namespace: str) -> None:
    """A Job's Pod (template annotations apply) succeeds and the Job controller marks the Job Complete."""
    cp = control_plane
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"anarchon.test/run-seconds": "0.5"}},
                "spec": pod_manifest("unused")["spec"],
            },
        },
    }
    create(cp, namespace, job)
    cp.kubectl("wait", "-n", namespace, "--for=condition=Complete", "--timeout=60s", "job/once")
    pods = get_json(cp, "pods", "-n", namespace, "-l", "job-name=once")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]


def test_start_retries_when_a_probed_port_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port taken between probe and bind (parallel sessions) costs a retry, not a failed session.

    The port chooser is steered to hand the API server a port that a listener already holds.
    """
    import controlplane as cp_module

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        probes: list[int] = []
        real_free_port = cp_module.free_port

        def steered() -> int:
            port = taken if len(probes) == 2 else real_free_port()  # etcd client, etcd peer, then apiserver
            probes.append(port)
            return port

        monkeypatch.setattr(cp_module, "free_port", steered)
        with ControlPlane(node_count=1, start_timeout=90) as second:
            assert probes[2] == taken
            assert not second.server.endswith(f":{taken}")
            nodes = second.kubectl("get", "nodes", "-o", "name").stdout.split()
            assert nodes == ["node/kwok-node-0"]
