"""The Helm chart: lint, render in every mode, the invariants of what it renders, the CRDs it ships,
offline schema validation (kubeconform) and server-side dry-run on a real API server."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane

from tests.chart.chartlib import (
    CHART,
    CRDS,
    Manifest,
    container,
    env_of,
    find,
    helm,
    kubeconform,
    manifests,
    one,
    render,
    rendered,
)

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    **{p.name.removesuffix("-values.yaml"): yaml.safe_load(p.read_text()) for p in CI_VALUES},
}


def test_ci_values_cover_the_modes() -> None:
    assert set(VARIANTS) >= {
        *("default", "namespaced", "bundled-redis", "bundled-redis-ephemeral", "existing-secret", "sqlite"),
    }


# ------------------------------------------------------------------------------------------- lint


def test_helm_lint_strict_with_defaults() -> None:
    res = helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout, res.stdout


@pytest.mark.parametrize("values_file", CI_VALUES, ids=lambda p: p.name)
def test_helm_lint_strict_with_ci_values(values_file: Path) -> None:
    res = helm("lint", "--strict", str(CHART), "--values", str(values_file))
    assert "0 chart(s) failed" in res.stdout, res.stdout


# ----------------------------------------------------------------------------------- CRDs: one source


def test_chart_crds_are_byte_identical_to_crds_dir() -> None:
    """crds/ is the source of truth; the chart carries a copy (helm does not follow symlinks out of a chart).

    To update: cp crds/*.yaml charts/anarchon/crds/
    """
    ours = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    source = sorted(p.name for p in CRDS.glob("*.yaml"))
    assert ours == source, "charts/anarchon/crds/ must hold exactly the files of crds/"
    for name in source:
        assert (CHART / "crds" / name).read_bytes() == (CRDS / name).read_bytes(), (
            f"charts/anarchon/crds/{name} differs from crds/{name}: run cp crds/*.yaml charts/anarchon/crds/"
        )


def test_package_carries_crds_and_schema_but_not_ci_values(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("anarchon-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {
        "anarchon/Chart.yaml",
        "anarchon/values.yaml",
        "anarchon/values.schema.json",
        "anarchon/templates/NOTES.txt",
        "anarchon/crds/anarchonjobs.anarchon.io.yaml",
        "anarchon/crds/anarchonruns.anarchon.io.yaml",
        "anarchon/dashboards/anarchon.json",
    } <= names
    assert not [n for n in names if n.startswith("anarchon/ci/")]


def test_include_crds_renders_them() -> None:
    docs = rendered(include_crds=True)
    names = {d["metadata"]["name"] for d in find(docs, "CustomResourceDefinition")}
    assert names == {"anarchonjobs.anarchon.io", "anarchonruns.anarchon.io"}


# ------------------------------------------------------------------------------------------- defaults


def test_defaults_three_replicas_spread_over_nodes() -> None:
    docs = rendered()
    dep = one(docs, "Deployment", "anarchon")
    assert dep["spec"]["replicas"] == 3
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget", "anarchon")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    # Rolling update one at a time, never more pods than replicas (each extra replica is one more contender).
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}


def test_hard_anti_affinity() -> None:
    dep = one(rendered({"podAntiAffinity": "hard"}), "Deployment")
    anti = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(anti) == ["requiredDuringSchedulingIgnoredDuringExecution"]


def test_cluster_name_leads_the_instance_ids() -> None:
    """``clusterName`` becomes ``--cluster-name`` (jobs shared between clusters need it: docs/multicluster.md)."""
    c = container(one(rendered({"clusterName": "europe-west"}), "Deployment"))
    assert "--cluster-name=europe-west" in c["args"]


def test_security_context_read_only_root_and_writable_volumes() -> None:
    dep = one(rendered(), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(dep)
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", "/var/lib/anarchon": "data"}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols["tmp"] and "emptyDir" in vols["data"]


def test_operator_command_ports_probes_and_identity() -> None:
    dep = one(rendered(), "Deployment")
    c = container(dep)
    assert "command" not in c, "the image's ENTRYPOINT is `anarchon`"
    assert c["args"][0] == "operator"
    assert "--all-namespaces" in c["args"]
    assert "--metrics-port=8080" in c["args"] and "--health-port=8081" in c["args"]
    assert "--log-format=json" in c["args"]
    assert "--resync=30s" in c["args"]
    assert "--store-check=10s" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--cluster-name")]  # none unless clusterName is set
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    env = env_of(c)
    # The instance id of each replica is its pod name.
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert c["image"] == "ghcr.io/anarchon/anarchon:0.1.0"


def test_default_store_is_url_from_existing_secret() -> None:
    env = env_of(container(one(rendered(), "Deployment")))
    assert env["ANARCHON_STORE"] == {"secretKeyRef": {"name": "anarchon-store", "key": "url"}}
    assert "ANARCHON_STORE_PASSWORD" not in env


def test_metrics_service_and_service_monitor() -> None:
    docs = rendered()
    svc = one(docs, "Service", "anarchon-metrics")
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"},
        {"name": "health", "port": 8081, "targetPort": "health", "protocol": "TCP"},
    ]
    assert svc["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert not find(docs, "ServiceMonitor")
    docs = rendered(VARIANTS["existing-secret"])
    sm = one(docs, "ServiceMonitor", "anarchon")
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


# ----------------------------------------------------------------------------------------------- RBAC


def _rules(role: Manifest) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault((g, res), set()).update(r["verbs"])
    return out


NAMESPACED_RULES = {
    ("anarchon.io", "anarchonjobs"): {"get", "list", "watch", "patch"},
    ("anarchon.io", "anarchonjobs/status"): {"get", "patch", "update"},
    ("anarchon.io", "anarchonruns"): {
        *("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"),
    },
    ("anarchon.io", "anarchonruns/status"): {"get", "patch", "update"},
    ("", "pods"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}


def test_cluster_wide_rbac_is_exactly_what_the_operator_needs() -> None:
    docs = rendered()
    role = one(docs, "ClusterRole", "anarchon")
    assert _rules(role) == NAMESPACED_RULES  # granted across namespaces; no scan of CRDs or namespaces
    binding = one(docs, "ClusterRoleBinding", "anarchon")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "anarchon"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "anarchon", "namespace": "anarchon-system"}]
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    assert all("*" not in verbs for verbs in _rules(role).values())


def test_namespaced_mode_has_no_cluster_scoped_rbac() -> None:
    docs = rendered(VARIANTS["namespaced"])
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    roles = find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for r in roles:
        assert _rules(r) == NAMESPACED_RULES
    bindings = find(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "anarchon", "namespace": "anarchon-system"}]
    c = container(one(docs, "Deployment"))
    assert "--all-namespaces" not in c["args"]
    assert [a for a in c["args"] if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert env_of(c)["ANARCHON_STORE"] == {"secretKeyRef": {"name": "anarchon-postgres", "key": "dsn"}}


def test_rbac_create_false_renders_no_rbac() -> None:
    docs = rendered({"rbac": {"create": False}})
    assert not [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]


# ---------------------------------------------------------------------------------------------- stores


def test_bundled_redis() -> None:
    docs = rendered(VARIANTS["bundled-redis"])
    redis = one(docs, "Deployment", "anarchon-redis")
    secret = one(docs, "Secret", "anarchon-redis")
    assert len(secret["data"]["password"]) > 30
    svc = one(docs, "Service", "anarchon-redis")
    assert svc["spec"]["selector"] == redis["spec"]["selector"]["matchLabels"]
    op = one(docs, "Deployment", "anarchon")
    # The two Deployments must not select each other's pods.
    assert op["spec"]["selector"]["matchLabels"] != redis["spec"]["selector"]["matchLabels"]
    env = env_of(container(op))
    assert env["ANARCHON_STORE_PASSWORD"] == {"secretKeyRef": {"name": "anarchon-redis", "key": "password"}}
    assert env["ANARCHON_STORE"] == "redis://:$(ANARCHON_STORE_PASSWORD)@anarchon-redis.anarchon-system.svc:6379/0"
    names = [e["name"] for e in container(op)["env"]]
    assert names.index("ANARCHON_STORE_PASSWORD") < names.index("ANARCHON_STORE"), (
        "Kubernetes expands $(VAR) only from variables defined earlier"
    )
    rc = container(redis, "redis")
    assert rc["securityContext"]["readOnlyRootFilesystem"] is True
    assert "$(REDIS_PASSWORD)" in rc["args"]


def _redis_options(redis: Manifest) -> dict[str, str]:
    """`redis-server --opt value ...` -> {"opt": "value"} (every option the chart passes takes one value)."""
    args = container(redis, "redis")["args"]
    assert args[0] == "redis-server"
    opts = args[1:]
    assert len(opts) % 2 == 0 and all(o.startswith("--") for o in opts[::2]), args
    options = {k.removeprefix("--"): v for k, v in zip(opts[::2], opts[1::2], strict=True)}
    assert len(options) == len(opts) // 2, f"an option is given twice: {args}"
    return options


def test_bundled_redis_keeps_claims_on_a_pvc_with_aof_by_default() -> None:
    """A Redis restart must not forget claims and leases: AOF (fsync every second) on a kept PVC at /data."""
    docs = rendered(VARIANTS["bundled-redis"])
    redis = one(docs, "Deployment", "anarchon-redis")
    pvc = one(docs, "PersistentVolumeClaim", "anarchon-redis-data")
    assert pvc["metadata"]["namespace"] == "anarchon-system"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "storageClassName" not in pvc["spec"], "empty storageClassName: the cluster's default class"
    pod = redis["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "anarchon-redis-data"}}
    assert {m["mountPath"]: m["name"] for m in container(redis, "redis")["volumeMounts"]} == {"/data": "data"}
    assert redis["spec"]["strategy"] == {"type": "Recreate"}, "a ReadWriteOnce volume: never two Redis pods"
    options = _redis_options(redis)
    assert options["appendonly"] == "yes"
    assert options["appendfsync"] == "everysec"
    assert options["dir"] == "/data"
    assert options["save"] == "", "RDB snapshots off: the AOF is the durable copy"
    assert options["maxmemory"] == "200mb"
    assert options["maxmemory-policy"] == "noeviction"
    # The one PVC of the release is Redis': the operator's own data volume stays an emptyDir.
    assert len(find(docs, "PersistentVolumeClaim")) == 1
    op = one(docs, "Deployment", "anarchon")
    assert "emptyDir" in {v["name"]: v for v in op["spec"]["template"]["spec"]["volumes"]}["data"]


def test_bundled_redis_persistence_settings() -> None:
    docs = rendered(
        {
            "redis": {
                "enabled": True,
                "persistence": {"size": "5Gi", "storageClassName": "fast-ssd", "accessModes": ["ReadWriteOncePod"]},
                "maxmemory": "1gb",
                "resources": {"limits": {"memory": "2Gi"}},
            }
        },
        release="q",
    )
    pvc = one(docs, "PersistentVolumeClaim", "q-anarchon-redis-data")
    assert pvc["spec"]["storageClassName"] == "fast-ssd"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOncePod"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "5Gi"
    redis = one(docs, "Deployment", "q-anarchon-redis")
    vols = {v["name"]: v for v in redis["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "q-anarchon-redis-data"
    assert _redis_options(redis)["maxmemory"] == "1gb"


def test_bundled_redis_without_persistence_uses_an_empty_dir() -> None:
    docs = rendered(VARIANTS["bundled-redis-ephemeral"])
    assert not find(docs, "PersistentVolumeClaim")
    redis = one(docs, "Deployment", "anarchon-redis")
    vols = {v["name"]: v for v in redis["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"] == {"name": "data", "emptyDir": {}}
    options = _redis_options(redis)
    assert options["appendonly"] == "no"
    assert "appendfsync" not in options
    # Memory bounds do not depend on persistence: noeviction always.
    assert options["maxmemory"] == "100mb"
    assert options["maxmemory-policy"] == "noeviction"


def test_no_redis_pvc_unless_redis_is_enabled() -> None:
    """redis.persistence.enabled is true by default, but without redis.enabled there is no Redis to keep."""
    docs = rendered()
    assert not find(docs, "PersistentVolumeClaim")
    assert not find(docs, "Deployment", "anarchon-redis")


@pytest.mark.parametrize(
    ("maxmemory", "limit", "ok"),
    [
        ("200mb", "256Mi", True),
        ("255mb", "256Mi", True),
        ("256mb", "256Mi", False),  # mb = MiB
        ("268435455", "256Mi", True),
        ("268435456", "256Mi", False),
        ("268m", "256Mi", True),  # m = 10^6 bytes
        ("269m", "256Mi", False),
        ("1GB", "1Gi", False),  # units are case-insensitive
        ("999m", "1G", True),
        ("1g", "1G", False),
        ("300mb", 536870912, True),  # a limit in plain bytes
        ("600mb", 536870912, False),
        ("300mb", "0.5Gi", True),  # a fractional limit is not parsed (not checked): it renders
    ],
)
def test_redis_maxmemory_must_stay_below_the_memory_limit(maxmemory: str, limit: object, ok: bool) -> None:
    res = render(
        {"redis": {"enabled": True, "maxmemory": maxmemory, "resources": {"limits": {"memory": limit}}}},
        check=False,
    )
    if ok:
        assert res.returncode == 0, res.stderr
        assert _redis_options(one(manifests(res.stdout), "Deployment", "anarchon-redis"))["maxmemory"] == maxmemory
    else:
        assert res.returncode != 0, f"maxmemory {maxmemory} accepted with a {limit} limit"
        assert "must be below redis.resources.limits.memory" in res.stderr, res.stderr


def test_url_with_password_from_secret_and_tls() -> None:
    docs = rendered(VARIANTS["existing-secret"])
    dep = one(docs, "Deployment")
    c = container(dep)
    env = env_of(c)
    assert env["ANARCHON_STORE_PASSWORD"] == {"secretKeyRef": {"name": "redis-credentials", "key": "password"}}
    assert env["ANARCHON_STORE"].startswith("rediss://:$(ANARCHON_STORE_PASSWORD)@")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/anarchon/store-tls"]["readOnly"] is True
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["store-tls"]["secret"]["secretName"] == "redis-ca"
    assert not find(docs, "Secret"), "no chart-made Secret: credentials come from existing Secrets"


def test_sqlite_single_replica_with_pvc() -> None:
    docs = rendered(VARIANTS["sqlite"])
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert env_of(container(dep))["ANARCHON_STORE"] == "sqlite:///var/lib/anarchon/anarchon.db"
    pvc = one(docs, "PersistentVolumeClaim", "anarchon-data")
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert not find(docs, "PodDisruptionBudget"), "a PDB over one replica would block node drains"


def test_a_sqlite_url_renders_with_one_replica_and_another_url_with_any() -> None:
    """The guard on SQLite looks at the store actually used: one replica on a sqlite:// URL is
    fine, and so are three on a Redis URL whatever store.type says (the URL wins)."""
    one_replica = one(rendered({"store": {"url": "sqlite:////data/a.db"}, "replicaCount": 1}), "Deployment")
    assert env_of(container(one_replica))["ANARCHON_STORE"] == "sqlite:////data/a.db"
    three = one(rendered({"store": {"type": "sqlite", "url": "redis://r:6379/0"}}), "Deployment")
    assert three["spec"]["replicas"] == 3 and env_of(container(three))["ANARCHON_STORE"] == "redis://r:6379/0"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"store": {"type": "sqlite"}}, "store.type=sqlite keeps the store in a file inside one pod"),
        # The scheme of the URL says it as well as the type: each replica would open a file of its own.
        ({"store": {"url": "sqlite:////data/a.db"}}, "store.url=sqlite:////data/a.db keeps the store in a file"),
        ({"store": {"url": "sqlite:///x"}, "replicaCount": 2}, "replicaCount is 2"),
        ({"store": {"type": "sqlite", "url": "sqlite:////x.db"}}, "store.url=sqlite:////x.db keeps the store"),
        ({"store": {"existingSecret": {"name": ""}}}, "no store: set store.existingSecret.name"),
        ({"redis": {"enabled": True}, "store": {"type": "postgresql"}}, "redis.enabled=true bundles a Redis store"),
        ({"store": {"tls": {"enabled": True}}}, "store.tls.enabled=true needs store.tls.secretName"),
        ({"replicaCount": 0}, "/replicaCount"),
        ({"store": {"type": "mysql"}}, "/store/type"),
        ({"store": {"url": "mysql://x"}}, "/store/url"),
        ({"unknownKey": 1}, "unknownKey"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
        ({"podAntiAffinity": "maybe"}, "/podAntiAffinity"),
        ({"redis": {"persistence": {"sizee": "1Gi"}}}, "sizee"),
        ({"redis": {"persistence": {"size": "lots"}}}, "/redis/persistence/size"),
        ({"redis": {"persistence": {"accessModes": ["ReadAnywhere"]}}}, "/redis/persistence/accessModes/0"),
        ({"redis": {"maxmemory": "0"}}, "/redis/maxmemory"),
        ({"redis": {"maxmemory": "200 MB"}}, "/redis/maxmemory"),
        ({"redis": {"maxmemoryPolicy": "allkeys-lru"}}, "maxmemoryPolicy"),
        ({"operator": {"resync": "soon"}}, "/operator/resync"),
        ({"operator": {"storeCheck": "often"}}, "/operator/storeCheck"),
        ({"clusterName": "Europe_West"}, "/clusterName"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else "",
)
def test_invalid_values_are_rejected_with_a_reason(values: dict[str, Any], message: str) -> None:
    res = render(values, check=False)
    assert res.returncode != 0, f"rendered although invalid: {values}"
    assert message in res.stderr, res.stderr


def test_notes_say_what_to_do_next(crds_installed: ControlPlane) -> None:
    """NOTES.txt, as `helm install` prints it (a server-side dry run against the test control plane)."""

    def notes(namespace: str, *extra: str) -> str:
        res = helm(
            "install", "anarchon", str(CHART), "--namespace", namespace, "--dry-run=server",
            "--kubeconfig", str(crds_installed.kubeconfig), *extra,
        )  # fmt: skip
        return res.stdout.split("NOTES:", 1)[1]

    text = notes("anarchon-system")
    assert "kubectl -n anarchon-system create secret generic anarchon-store" in text
    assert "rollout status deployment/anarchon" in text
    assert "kubectl get anarchonruns" in text
    text = notes("ops", "--values", str(CHART / "ci" / "namespaced-values.yaml"))
    assert "team-a, team-b" in text and "create secret" in text
    text = notes("anarchon-system", "--set", "store.type=nats", "--set", "store.url=nats://nats:4222")
    assert "claim-only store" in text and "create secret" not in text
    assert "WARNING" not in text


def test_notes_warn_when_the_bundled_redis_forgets_claims(crds_installed: ControlPlane) -> None:
    """Without persistence a Redis restart loses every claim and lease: NOTES.txt says so, loudly."""

    def notes(values_file: str) -> str:
        res = helm(
            "install", "anarchon", str(CHART), "--namespace", "anarchon-system", "--dry-run=server",
            "--kubeconfig", str(crds_installed.kubeconfig), "--values", str(CHART / "ci" / values_file),
        )  # fmt: skip
        return " ".join(res.stdout.split("NOTES:", 1)[1].split())  # one line: the wording may wrap anywhere

    text = notes("bundled-redis-ephemeral-values.yaml")
    assert "WARNING: redis.persistence.enabled=false" in text
    assert "LOSES EVERY CLAIM AND LEASE" in text
    assert "slots may run twice" in text and "orphaned" in text
    assert "Set redis.persistence.enabled=true" in text
    text = notes("bundled-redis-values.yaml")
    assert "WARNING" not in text
    assert "PersistentVolumeClaim anarchon-redis-data" in text and "fsynced every second" in text


# ------------------------------------------------------------------------------- kubeconform / dry-run


def _write_variant(tmp_path: Path, variant: str, *, include_crds: bool = False) -> Path:
    out = tmp_path / f"{variant}.yaml"
    out.write_text(render(VARIANTS[variant], include_crds=include_crds).stdout)
    return out


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_kubeconform_validates_rendered_manifests(variant: str, schema_dir: Path, tmp_path: Path) -> None:
    """Strict schema validation against the test API server's own OpenAPI (CRDs included), offline."""
    f = _write_variant(tmp_path, variant, include_crds=True)
    res = kubeconform([f], schema_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Invalid: 0, Errors: 0" in res.stdout and "Skipped: 0" in res.stdout, res.stdout


def test_kubeconform_catches_a_broken_manifest(schema_dir: Path, tmp_path: Path) -> None:
    """The schemas are strict enough to catch a typo and a wrong type (so the check above means something)."""
    docs = rendered()
    dep = one(docs, "Deployment")
    dep["spec"]["replica"] = 3  # typo: unknown field
    container(dep)  # still well-formed
    dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eighty"
    f = tmp_path / "broken.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    res = kubeconform([f], schema_dir)
    assert res.returncode != 0
    assert "replica" in res.stdout and "containerPort" in res.stdout, res.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_server_side_dry_run_of_rendered_manifests(variant: str, crds_installed: ControlPlane, tmp_path: Path) -> None:
    """The API server itself (admission, defaulting, CRD and CEL validation) accepts everything the chart renders."""
    ns = f"dry-{variant}"
    for n in (ns, "team-a", "team-b"):
        crds_installed.kubectl("create", "namespace", n, check=False)
    f = tmp_path / f"{variant}.yaml"
    f.write_text(render(VARIANTS[variant], namespace=ns).stdout)
    res = crds_installed.kubectl("apply", "--dry-run=server", "-f", str(f))  # every object names its namespace
    applied = [line for line in res.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(manifests(f.read_text())), res.stdout


def test_server_rejects_what_schema_does_not_allow(crds_installed: ControlPlane, tmp_path: Path) -> None:
    """Sanity check of the dry-run: a broken Deployment is refused by the API server."""
    docs = rendered()
    dep = one(docs, "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = 70000
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(dep))
    crds_installed.kubectl("create", "namespace", "anarchon-system", check=False)
    res = crds_installed.kubectl("apply", "--dry-run=server", "-n", "anarchon-system", "-f", str(f), check=False)
    assert res.returncode != 0 and "containerPort" in res.stderr, res.stderr


def test_installed_chart_runs_three_replicas_on_three_nodes(crds_installed: ControlPlane, tmp_path: Path) -> None:
    """Really apply the chart (no dry-run): the scheduler spreads the 3 replicas over the 3 fake nodes.

    KWOK plays the kubelet; the annotation keeps its fake containers Running. The secret the pods
    read is created too, so that nothing is left pending on configuration.
    """
    ns = "spread"
    crds_installed.kubectl("create", "namespace", ns, check=False)
    crds_installed.kubectl(
        "-n", ns, "create", "secret", "generic", "anarchon-store", "--from-literal=url=redis://x:6379/0"
    )
    f = tmp_path / "install.yaml"
    f.write_text(
        render(
            {"podAnnotations": {"anarchon.test/run-seconds": "-1"}, "podAntiAffinity": "hard"},
            namespace=ns,
            release="spread",
        ).stdout
    )
    crds_installed.kubectl("apply", "-n", ns, "-f", str(f))
    try:
        crds_installed.kubectl(
            "-n",
            ns,
            "wait",
            "--for=condition=Ready",
            "pod",
            "-l",
            "app.kubernetes.io/component=operator",
            "--timeout=60s",
        )
        pods = json.loads(
            crds_installed.kubectl(
                "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=operator", "-o", "json"
            ).stdout
        )["items"]
        assert len(pods) == 3
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(crds_installed.nodes)
        assert all(p["spec"]["serviceAccountName"] == "spread-anarchon" for p in pods)
    finally:
        crds_installed.kubectl("delete", "-n", ns, "-f", str(f), "--wait=false", check=False)
