"""Least privilege: the chart's exact ClusterRole / Roles, bound to a ServiceAccount on a real API
server, allow everything the operator does and nothing else; and the real operator, authenticated
with that ServiceAccount's token, runs jobs with them.

Access is checked with SelfSubjectAccessReviews sent with the ServiceAccount's own token (what
``kubectl auth can-i`` does), plus real requests that must succeed or get 403.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane

from tests.chart.chartlib import Manifest, manifests, operator_process, render
from tests.harness.until import until

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

# (verb, group, resource, subresource): what the operator does in a watched namespace.
NEEDED_IN_NAMESPACE = [
    *[(v, "anarchon.io", "anarchonjobs", "") for v in ("get", "list", "watch", "patch")],
    *[(v, "anarchon.io", "anarchonjobs", "status") for v in ("get", "patch", "update")],
    *[
        (v, "anarchon.io", "anarchonruns", "")
        for v in ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
    ],
    *[(v, "anarchon.io", "anarchonruns", "status") for v in ("get", "patch", "update")],
    *[(v, "", "pods", "") for v in ("get", "list", "watch", "create", "patch", "delete")],
    ("create", "", "events", ""),
    ("patch", "", "events", ""),
    ("create", "events.k8s.io", "events", ""),
    ("patch", "events.k8s.io", "events", ""),
]


# What the operator must never be able to do.
FORBIDDEN_IN_NAMESPACE = [
    ("get", "", "secrets", ""),
    ("list", "", "secrets", ""),
    ("get", "", "configmaps", ""),
    ("create", "", "pods", "exec"),
    ("create", "", "pods", "attach"),
    ("create", "", "pods", "portforward"),
    ("get", "", "pods", "log"),
    ("update", "", "pods", ""),
    ("create", "", "pods", "eviction"),
    ("create", "", "serviceaccounts", "token"),
    ("create", "", "services", ""),
    ("create", "apps", "deployments", ""),
    ("create", "batch", "jobs", ""),
    ("create", "batch", "cronjobs", ""),
    ("create", "anarchon.io", "anarchonjobs", ""),
    ("update", "anarchon.io", "anarchonjobs", ""),
    ("delete", "anarchon.io", "anarchonjobs", ""),
    ("create", "coordination.k8s.io", "leases", ""),
    ("create", "rbac.authorization.k8s.io", "rolebindings", ""),
    ("delete", "", "events", ""),
]
FORBIDDEN_CLUSTER = [
    ("create", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("update", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("delete", "", "namespaces", ""),
    ("get", "", "nodes", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
    # The operator watches its own resources across namespaces; it needs no scan of CRDs or namespaces.
    *[(v, "apiextensions.k8s.io", "customresourcedefinitions", "") for v in ("get", "list", "watch")],
    ("list", "", "namespaces", ""),
    ("watch", "", "namespaces", ""),
]


@dataclass
class Installed:
    """The chart's RBAC objects applied to the control plane, and a token of its ServiceAccount."""

    cp: ControlPlane
    release_ns: str
    service_account: str
    token: str
    kubeconfig: Path

    def can(self, verb: str, group: str, resource: str, subresource: str = "", namespace: str = "") -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace,
                }
            },
        }
        out = self.cp.api("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, token=self.token)
        return bool(out["status"]["allowed"])

    def status_of(self, method: str, path: str, body: Any = None) -> int:
        """HTTP status of one request made with the ServiceAccount's token."""
        try:
            self.cp.api(method, path, body, token=self.token)
        except urllib.error.HTTPError as e:
            return e.code
        return 200


def install_rbac(cp: ControlPlane, release_ns: str, release: str, values: dict[str, Any]) -> Installed:
    docs: list[Manifest] = [
        d for d in manifests(render(values, namespace=release_ns, release=release).stdout) if d["kind"] in RBAC_KINDS
    ]
    assert {d["kind"] for d in docs} >= {"ServiceAccount"}
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    sa = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    token = cp.service_account_token(release_ns, sa, create=False)
    return Installed(cp, release_ns, sa, token, cp.token_kubeconfig(f"{release}-sa", token))


def make_namespace(cp: ControlPlane, name: str) -> str:
    cp.kubectl("create", "namespace", name, check=False)
    until(
        f"the default ServiceAccount in {name}",
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
    )
    return name


@pytest.fixture(scope="module")
def cluster_wide(crds_installed: ControlPlane) -> Installed:
    ns = make_namespace(crds_installed, "rbac-cw-system")
    return install_rbac(crds_installed, ns, "cw", {})


@pytest.fixture(scope="module")
def namespaced(crds_installed: ControlPlane) -> Installed:
    ns = make_namespace(crds_installed, "rbac-ns-system")
    for n in ("rbac-watched", "rbac-other"):
        make_namespace(crds_installed, n)
    return install_rbac(crds_installed, ns, "nsd", {"watchNamespaces": ["rbac-watched"]})


# --------------------------------------------------------------------------------- access reviews


def _id(x: tuple[str, str, str, str]) -> str:
    verb, group, resource, sub = x
    return f"{verb}-{resource}{'.' + group if group else ''}{'/' + sub if sub else ''}"


@pytest.mark.parametrize("access", NEEDED_IN_NAMESPACE, ids=_id)
def test_cluster_wide_allows_what_the_operator_needs(
    cluster_wide: Installed, access: tuple[str, str, str, str]
) -> None:
    verb, group, resource, sub = access
    assert cluster_wide.can(verb, group, resource, sub, "default")
    assert cluster_wide.can(verb, group, resource, sub, "")  # and at cluster scope (across namespaces)


@pytest.mark.parametrize("access", FORBIDDEN_IN_NAMESPACE + FORBIDDEN_CLUSTER, ids=_id)
def test_cluster_wide_denies_the_rest(cluster_wide: Installed, access: tuple[str, str, str, str]) -> None:
    verb, group, resource, sub = access
    ns = "" if (access in FORBIDDEN_CLUSTER) else "default"
    assert not cluster_wide.can(verb, group, resource, sub, ns)


@pytest.mark.parametrize("access", NEEDED_IN_NAMESPACE, ids=_id)
def test_namespaced_allows_only_in_watched_namespace(namespaced: Installed, access: tuple[str, str, str, str]) -> None:
    verb, group, resource, sub = access
    assert namespaced.can(verb, group, resource, sub, "rbac-watched")
    assert not namespaced.can(verb, group, resource, sub, "rbac-other")
    assert not namespaced.can(verb, group, resource, sub, "")  # no cluster-wide list/watch
    assert not namespaced.can(verb, group, resource, sub, namespaced.release_ns)


@pytest.mark.parametrize("access", FORBIDDEN_CLUSTER, ids=_id)
def test_namespaced_has_nothing_cluster_scoped(namespaced: Installed, access: tuple[str, str, str, str]) -> None:
    assert not namespaced.can(*access, "")


@pytest.mark.parametrize("access", FORBIDDEN_IN_NAMESPACE, ids=_id)
def test_namespaced_denies_the_rest(namespaced: Installed, access: tuple[str, str, str, str]) -> None:
    assert not namespaced.can(*access, "rbac-watched")


def test_kubectl_auth_can_i_as_the_service_account(cluster_wide: Installed) -> None:
    """The same answers through impersonation, as an operator of the cluster would check by hand."""
    who = f"system:serviceaccount:{cluster_wide.release_ns}:{cluster_wide.service_account}"

    def can_i(*args: str) -> bool:
        res = cluster_wide.cp.kubectl("auth", "can-i", *args, f"--as={who}", check=False)
        assert res.stdout.strip() in ("yes", "no"), res.stderr
        return res.stdout.strip() == "yes"

    assert can_i("watch", "anarchonjobs.anarchon.io", "--all-namespaces")
    assert can_i("patch", "anarchonruns.anarchon.io", "--subresource=status", "-n", "default")
    assert can_i("create", "pods", "-n", "default")
    assert not can_i("get", "secrets", "-n", "default")
    assert not can_i("create", "pods", "--subresource=exec", "-n", "default")
    assert not can_i("create", "deployments.apps", "-n", "default")


# ------------------------------------------------------------------------------ real requests


def test_real_requests_with_the_token(cluster_wide: Installed) -> None:
    ns = make_namespace(cluster_wide.cp, "rbac-requests")
    s = cluster_wide.status_of
    assert s("GET", "/apis/anarchon.io/v1alpha1/anarchonjobs") == 200  # all namespaces
    assert s("GET", "/api/v1/namespaces") == 403  # no scan of namespaces: the watches span them all
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rbac-probe"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}], "restartPolicy": "Never"},
    }
    assert s("POST", f"/api/v1/namespaces/{ns}/pods", pod) == 200
    assert s("DELETE", f"/api/v1/namespaces/{ns}/pods/rbac-probe") == 200
    run = {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonRun",
        "metadata": {"name": "probe-1"},
        "spec": {"job": "probe", "slot": 1000},
    }
    assert s("POST", f"/apis/anarchon.io/v1alpha1/namespaces/{ns}/anarchonruns", run) == 200
    assert (
        s(
            "PATCH",
            f"/apis/anarchon.io/v1alpha1/namespaces/{ns}/anarchonruns/probe-1/status",
            {"status": {"phase": "Claimed"}},
        )
        == 200
    )
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "probe.1"},
        "involvedObject": {"kind": "AnarchonRun", "name": "probe-1", "namespace": ns},
        "reason": "Probe",
        "message": "rbac test",
        "type": "Normal",
    }
    assert s("POST", f"/api/v1/namespaces/{ns}/events", event) == 200
    assert s("DELETE", f"/apis/anarchon.io/v1alpha1/namespaces/{ns}/anarchonruns/probe-1") == 200
    # And what it may not do.
    assert s("GET", f"/api/v1/namespaces/{ns}/secrets") == 403
    assert s("GET", "/api/v1/nodes") == 403
    job = {"apiVersion": "anarchon.io/v1alpha1", "kind": "AnarchonJob", "metadata": {"name": "x"}, "spec": {}}
    assert s("POST", f"/apis/anarchon.io/v1alpha1/namespaces/{ns}/anarchonjobs", job) == 403
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}
    assert s("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deploy) == 403


# --------------------------------------------------------------------------- the real operator


JOB = """
apiVersion: anarchon.io/v1alpha1
kind: AnarchonJob
metadata:
  name: rbac-tick
spec:
  every: 2s
  jitter: 100ms
  template:
    metadata:
      annotations:
        anarchon.test/run-seconds: "0.5"
    spec:
      containers:
        - name: c
          image: busybox:1.36
"""


def wait_for_succeeded_runs(
    cp: ControlPlane, ns: str, count: int, proc: subprocess.Popen[bytes], log: Path
) -> list[Any]:
    def succeeded() -> list[Any]:
        assert proc.poll() is None, f"operator exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
        out = cp.kubectl("get", "anarchonruns", "-n", ns, "-o", "json").stdout
        runs = [r for r in json.loads(out)["items"] if r.get("status", {}).get("phase") == "Succeeded"]
        return runs if len(runs) >= count else []

    return until(f"{count} runs to succeed", succeeded, detail=lambda: log.read_text()[-4000:])


def assert_no_forbidden(log: Path) -> None:
    text = log.read_text()
    # "403" as a word only: a log line's timestamp ends in milliseconds (",403" failed CI once).
    bad = [line for line in text.splitlines() if re.search(r"(?<![,\d])403\b", line) or "orbidden" in line]
    assert not bad, "the operator hit RBAC denials:\n" + "\n".join(bad[:20])


def test_operator_runs_jobs_with_cluster_wide_rbac(cluster_wide: Installed, tmp_path: Path) -> None:
    cp = cluster_wide.cp
    ns = make_namespace(cp, "rbac-op-cw")
    cp.kubectl("apply", "-n", ns, "-f", "-", input=JOB)
    log = tmp_path / "operator.log"
    with operator_process(
        cluster_wide.kubeconfig, log, "--all-namespaces", f"--store=sqlite:///{tmp_path}/a.db", "--instance-id=rbac-cw"
    ) as proc:
        runs = wait_for_succeeded_runs(cp, ns, 2, proc, log)
        assert {r["status"]["instance"] for r in runs} == {"rbac-cw"}
        job = json.loads(cp.kubectl("get", "anarchonjob", "rbac-tick", "-n", ns, "-o", "json").stdout)
        assert job["status"].get("lastScheduleTime"), job["status"]
        cp.kubectl("delete", "anarchonjob", "rbac-tick", "-n", ns)
    assert_no_forbidden(log)


def test_operator_runs_jobs_with_namespaced_rbac(namespaced: Installed, tmp_path: Path) -> None:
    cp = namespaced.cp
    ns = "rbac-watched"
    cp.kubectl("apply", "-n", ns, "-f", "-", input=JOB)
    log = tmp_path / "operator.log"
    with operator_process(
        namespaced.kubeconfig, log, f"--namespace={ns}", f"--store=sqlite:///{tmp_path}/n.db", "--instance-id=rbac-ns"
    ) as proc:
        runs = wait_for_succeeded_runs(cp, ns, 2, proc, log)
        assert {r["status"]["instance"] for r in runs} == {"rbac-ns"}
        cp.kubectl("delete", "anarchonjob", "rbac-tick", "-n", ns)
    assert_no_forbidden(log)
