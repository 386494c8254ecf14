"""The CRDs against a real kube-apiserver: admission, defaulting, CEL, explain, printer columns.

The schema is the first line of defence (a bad spec is refused at ``kubectl apply`` with a
message, instead of surfacing later as an operator condition), so each rule is tried on
the real apiserver rather than trusted from reading the YAML. The first tests need no
cluster: they keep the CRDs and the parser (operator/anarchon/kube/job/spec.py) in agreement.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from controlplane import ControlPlane

from anarchon.engine import limits as L
from anarchon.engine.schedule import MACROS, cron
from anarchon.kube import constants as C
from anarchon.kube.job import spec as S
from anarchon.kube.job.spec import SpecError, parse_job
from tests.harness.controlplane import JOB_CRD, REPO, RUN_CRD
from tests.kube.job.crdlib import explain, job


def load(path: Path) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    return crd


def schema(path: Path) -> dict[str, Any]:
    root: dict[str, Any] = load(path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


JOB_SPEC_SCHEMA = schema(JOB_CRD)["properties"]["spec"]


# ------------------------------------------------------------------------------ offline: the YAML itself


def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property schema under ``node``, with its dotted path (``[]`` for array items)."""
    for name, prop in (node.get("properties") or {}).items():
        yield f"{path}.{name}", prop
        yield from walk(prop, f"{path}.{name}")
    if "items" in node:
        yield f"{path}[]", node["items"]
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("path", [JOB_CRD, RUN_CRD], ids=lambda p: p.name)
def test_every_field_has_a_description(path: Path) -> None:
    """``kubectl explain`` shows these; a field without one is a field users must guess."""
    # The root metadata is ObjectMeta, documented by the apiserver; a CRD may not describe it.
    # The items of a list of strings or numbers are described by the list's field (so in the Pod
    # API's schema, which crds/generate.py copies); explain has nothing more to show for them.
    fields = [
        (p, prop)
        for p, prop in walk(schema(path), "")
        if p != ".metadata" and not (p.endswith("[]") and prop.get("type") in ("string", "integer"))
    ]
    missing = [p for p, prop in fields if not str(prop.get("description") or "").strip()]
    assert missing == []


def test_crd_defaults_are_the_parser_defaults() -> None:
    """An object that skipped CRD defaulting must run exactly like one that did not."""
    props = JOB_SPEC_SCHEMA["properties"]
    declared: dict[str, Any] = {}
    for name, prop in props.items():
        if "default" in prop and prop["type"] != "object":
            declared[name] = prop["default"]
    for group in ("catchUp", "retries"):
        for name, prop in props[group]["properties"].items():
            if "default" in prop:
                declared[f"{group}.{name}"] = prop["default"]
    assert declared == dict(S.CRD_DEFAULTS)
    assert "default" not in props["lease"], "lease defaults to 3 heartbeats, which a schema cannot express"


def test_crd_patterns_and_bounds_are_the_parsers() -> None:
    props = JOB_SPEC_SCHEMA["properties"]
    durations = ["every", "jitter", "heartbeat", "lease", "startingDeadline", "timeout", "pendingTimeout"]
    for name in durations:
        assert props[name]["pattern"] == S.DURATION_PATTERN, name
        assert props[name]["maxLength"] == S.MAX_DURATION_LENGTH, name
    assert props["catchUp"]["properties"]["window"]["pattern"] == S.DURATION_PATTERN
    retries = props["retries"]["properties"]
    for name in ("backoff", "maxBackoff"):
        assert retries[name]["pattern"] == S.DURATION_PATTERN, name
        assert retries[name]["maxLength"] == S.MAX_DURATION_LENGTH, name
    assert (retries["limit"]["minimum"], retries["limit"]["maximum"]) == (0, L.MAX_RETRIES)
    # A CEL rule, not a pattern: its refusal says in words what a cron value may be.
    assert "pattern" not in props["cron"]
    (cron_rule,) = props["cron"]["x-kubernetes-validations"]
    assert cron_rule["rule"] == S.CRON_RULE and S.CRON_PATTERN in cron_rule["rule"]
    assert cron_rule["message"] == f"spec.cron must be {S.CRON_SHAPE}"
    assert props["cron"]["maxLength"] == S.MAX_CRON_LENGTH
    assert props["timeZone"]["pattern"] == S.TIME_ZONE_PATTERN
    assert props["timeZone"]["maxLength"] == S.MAX_TIME_ZONE_LENGTH
    assert (props["maxAttempts"]["minimum"], props["maxAttempts"]["maximum"]) == (S.MIN_ATTEMPTS, S.MAX_ATTEMPTS)
    for name in ("successfulRunsHistoryLimit", "failedRunsHistoryLimit"):
        assert (props[name]["minimum"], props[name]["maximum"]) == (0, L.MAX_HISTORY_LIMIT), name
    assert props["overlap"]["enum"] == ["Skip", "Allow", "Replace"]
    assert props["catchUp"]["properties"]["policy"]["enum"] == ["None", "Latest", "All"]

    # The bounds of anarchon.engine.limits, as the CEL rules write them (in ms).
    def rules(node: dict[str, Any]) -> str:
        return " ".join(r["rule"] for r in node.get("x-kubernetes-validations", []))

    assert f"self.matches(r'{S.SHARED_NAME_PATTERN}')" == rules(props["sharedName"])
    assert props["sharedName"]["maxLength"] == S.MAX_SHARED_NAME_LENGTH
    assert f">= {L.MIN_EVERY_MS}" in rules(props["every"])
    assert f">= {L.MIN_HEARTBEAT_MS}" in rules(props["heartbeat"])
    assert f">= {L.MIN_TIMEOUT_MS}" in rules(props["timeout"])
    assert f">= {L.MIN_CATCH_UP_WINDOW_MS}" in rules(props["catchUp"]["properties"]["window"])
    assert f"<= {L.MAX_JITTER_MS}" in rules(props["jitter"])
    assert f">= {L.MIN_LEASE_HEARTBEATS} * (" in rules(JOB_SPEC_SCHEMA)
    assert f">= {L.MIN_STARTING_DEADLINE_OVER_JITTER_MS} + (" in rules(JOB_SPEC_SCHEMA)
    for name in ("backoff", "maxBackoff"):
        assert f">= {L.MIN_RETRY_BACKOFF_MS}" in rules(retries[name]), name
        assert f"<= {L.MAX_RETRY_BACKOFF_MS}" in rules(retries[name]), name
    root_rules = schema(JOB_CRD)["x-kubernetes-validations"]
    assert any(f"size() <= {S.MAX_JOB_NAME_LENGTH}" in r["rule"] for r in root_rules)


def test_crd_names() -> None:
    for path, kind, plural, short in (
        (JOB_CRD, C.JOB_KIND, C.JOBS, "aj"),
        (RUN_CRD, C.RUN_KIND, C.RUNS, "ar"),
    ):
        crd = load(path)
        assert crd["metadata"]["name"] == f"{plural}.{C.GROUP}"
        assert crd["spec"]["group"] == C.GROUP
        assert [v["name"] for v in crd["spec"]["versions"]] == [C.VERSION]
        names = crd["spec"]["names"]
        assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
            kind,
            plural,
            [short],
            ["anarchon"],
        )


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_parse(path: Path) -> None:
    """What the docs show must be what the operator runs (the chart tests apply them to a cluster)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == C.JOB_KIND:
            doc["metadata"].setdefault("namespace", "default")
            parse_job(doc)


# ------------------------------------------------------------------------------ against the apiserver


def create(cp: ControlPlane, namespace: str, obj: dict[str, Any], *, check: bool = True) -> Any:
    """``kubectl create`` (strict field validation, kubectl's default); the created object, or the failed process."""
    res = cp.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(obj), check=False)
    if not check:
        return res
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def get(cp: ControlPlane, namespace: str, *args: str) -> Any:
    return json.loads(cp.kubectl("get", "-n", namespace, *args, "-o", "json").stdout)


def table(text: str) -> list[dict[str, str]]:
    """Rows of kubectl's table output, cut at the header's column starts (cells may be empty)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def test_valid_every_job_is_defaulted_like_the_parser(crds: ControlPlane, namespace: str) -> None:
    raw = job()
    created = create(crds, namespace, raw)
    spec = created["spec"]
    assert spec == {
        "every": "10s",
        "timeZone": "UTC",
        "jitter": "1s",
        "heartbeat": "5s",
        "overlap": "Skip",
        "catchUp": {"policy": "None", "window": "1h"},
        "maxAttempts": 3,
        "suspend": False,
        "successfulRunsHistoryLimit": 3,
        "failedRunsHistoryLimit": 1,
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}},
    }
    # The parser reads the defaulted object and the raw one alike: same defaults on both sides.
    raw["metadata"] = created["metadata"]
    server, local = parse_job(created), parse_job(raw)
    assert (server.schedule, server.options, server.template) == (local.schedule, local.options, local.template)
    assert server.uid == created["metadata"]["uid"] and server.namespace == namespace


def test_valid_cron_job_with_everything_set(crds: ControlPlane, namespace: str) -> None:
    full = {
        "every": None,
        "cron": "30 0 8 * * 1-5",
        "timeZone": "Europe/Paris",
        "jitter": "250ms",
        "heartbeat": "2s",
        "lease": "1m",
        "overlap": "Replace",
        "catchUp": {"policy": "All", "window": "2d"},
        "startingDeadline": "90s",
        "maxAttempts": 10,
        "retries": {"limit": 6, "backoff": "5s", "maxBackoff": "1d"},
        "timeout": "1h30m",
        "pendingTimeout": "10m",
        "suspend": True,
        "successfulRunsHistoryLimit": 0,
        "failedRunsHistoryLimit": 5,
        "template": {
            "metadata": {"labels": {"app": "etl"}, "annotations": {"team": "data"}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"disk": "ssd"},
                "containers": [
                    {"name": "main", "image": "busybox:1.36", "args": ["run"], "env": [{"name": "A", "value": "1"}]}
                ],
            },
        },
    }
    created = create(crds, namespace, job("etl", **full))
    expected = {k: v for k, v in full.items() if v is not None}
    assert created["spec"] == expected, "nothing may be pruned from a full spec (PodSpec fields included)"
    parsed = parse_job(created)
    assert parsed.options.lease_ms == 60_000 and parsed.timeout_ms == 5_400_000
    assert parsed.pending_timeout_ms == 600_000
    assert (parsed.retries.limit, parsed.retries.backoff_ms, parsed.retries.max_backoff_ms) == (6, 5_000, 86_400_000)
    assert parsed.template["spec"]["nodeSelector"] == {"disk": "ssd"}


def test_status_is_pruned_on_create_and_written_through_the_subresource(crds: ControlPlane, namespace: str) -> None:
    obj = job("st")
    obj["status"] = {"activeCount": 5}
    created = create(crds, namespace, obj)
    assert "status" not in created or "activeCount" not in created["status"]


LEASE = "spec.lease must be at least 2 heartbeats"
DEADLINE = "spec.startingDeadline must be at least spec.jitter (default 1s) plus 1s"
CONTAINERS = "spec.template.spec.containers"


def tmpl(pod_spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"labels": labels or {}}, "spec": pod_spec}


OK_CONTAINERS = [{"name": "m", "image": "i"}]

CRON_SHAPE = "spec.cron must be a cron expression of 5 fields (minute hour day month weekday), 6 (seconds first), or"
RETRY_MIN = "spec.retries.backoff must be at least 1s"
RETRY_CAP = "spec.retries.maxBackoff must not be shorter than spec.retries.backoff"
INVALID_JOBS: list[tuple[str, dict[str, Any], str, list[str]]] = [
    # (id, spec changes, name, fragments of the apiserver's message)
    ("every-and-cron", {"cron": "0 8 * * *"}, "j", ["set exactly one of spec.every and spec.cron"]),
    ("neither", {"every": None}, "j", ["set one of spec.every", "spec.cron"]),
    ("bad-duration", {"every": "10 seconds"}, "j", ["spec.every", "should match"]),
    ("upper-case-unit", {"jitter": "1S"}, "j", ["spec.jitter", "should match"]),
    ("units-out-of-order", {"every": "30m1h"}, "j", ["spec.every", "should match"]),
    ("empty-duration", {"timeout": ""}, "j", ["spec.timeout", "at least 1 chars long"]),
    ("every-zero", {"every": "0m"}, "j", ["spec.every must be at least 1s"]),
    ("every-10ms", {"every": "10ms"}, "j", ["spec.every must be at least 1s", "finest cron grain"]),
    ("every-999ms", {"every": "999ms"}, "j", ["spec.every must be at least 1s"]),
    ("heartbeat-zero", {"heartbeat": "0s"}, "j", ["spec.heartbeat must be at least 500ms"]),
    ("heartbeat-1ms", {"heartbeat": "1ms", "lease": "2ms"}, "j", ["spec.heartbeat must be at least 500ms", "store"]),
    ("timeout-zero", {"timeout": "0ms"}, "j", ["spec.timeout must be at least 1s"]),
    ("timeout-10ms", {"timeout": "10ms"}, "j", ["spec.timeout must be at least 1s", "activeDeadlineSeconds"]),
    ("jitter-over-1h", {"jitter": "1h1ms"}, "j", ["spec.jitter must be at most 1h"]),
    ("catch-up-window-zero", {"catchUp": {"policy": "All", "window": "0s"}}, "j", ["spec.catchUp.window must be at"]),
    ("jitter-in-days", {"jitter": "1d"}, "j", ["spec.jitter must be at most 1h"]),
    ("pending-timeout-zero", {"pendingTimeout": "0s"}, "j", ["spec.pendingTimeout must be at least 1s"]),
    ("pending-timeout-10ms", {"pendingTimeout": "10ms"}, "j", ["spec.pendingTimeout must be at least 1s"]),
    ("every-with-zone", {"timeZone": "Europe/Paris"}, "j", ["spec.timeZone must be UTC or unset with spec.every"]),
    ("cross-cluster-sometimes", {"crossCluster": "Sometimes"}, "j", ["spec.crossCluster", "Unsupported value"]),
    ("shared-name-upper", {"sharedName": "Report"}, "j", ["spec.sharedName must be lower-case letters, digits"]),
    ("shared-name-too-long", {"sharedName": "a" * 64}, "j", ["spec.sharedName", "may not be more than 63"]),
    ("bad-zone-shape", {"every": None, "cron": "0 8 * * *", "timeZone": "Paris, France"}, "j", ["spec.timeZone"]),
    ("cron-4-fields", {"every": None, "cron": "0 8 * *"}, "j", [CRON_SHAPE]),
    # robfig/cron's @every is not one of CronJob's shorthands here: spec.every is.
    ("cron-every-macro", {"every": None, "cron": "@every 5m"}, "j", [CRON_SHAPE]),
    ("cron-unknown-macro", {"every": None, "cron": "@fortnightly"}, "j", [CRON_SHAPE]),
    (
        "restart-always",
        {"template": tmpl({"restartPolicy": "Always", "containers": OK_CONTAINERS})},
        "j",
        ["spec.template.spec.restartPolicy", "forced to Never"],
    ),
    ("overlap-sometimes", {"overlap": "Sometimes"}, "j", ["spec.overlap", 'Unsupported value: "Sometimes"', '"Skip"']),
    ("catchup-policy", {"catchUp": {"policy": "Most"}}, "j", ["spec.catchUp.policy", "Unsupported value"]),
    ("lease-below-heartbeat", {"heartbeat": "10s", "lease": "9s"}, "j", [LEASE]),
    ("lease-equal-heartbeat", {"heartbeat": "1m", "lease": "60s"}, "j", [LEASE]),
    ("lease-heartbeat-plus-1ms", {"heartbeat": "5s", "lease": "5s1ms"}, "j", [LEASE, "late heartbeat"]),
    ("lease-below-2-heartbeats", {"heartbeat": "1s", "lease": "1s999ms"}, "j", [LEASE]),
    ("lease-below-default-heartbeat", {"lease": "3s"}, "j", [LEASE]),
    ("lease-days-below-heartbeat", {"heartbeat": "1d", "lease": "23h"}, "j", [LEASE]),
    ("lease-overflows-cel", {"lease": "99999999999999999d"}, "j", ["integer overflow", LEASE]),
    ("starting-deadline-zero", {"startingDeadline": "0s"}, "j", [DEADLINE]),
    ("starting-deadline-below-default-jitter", {"startingDeadline": "1s999ms"}, "j", [DEADLINE]),
    ("starting-deadline-within-jitter", {"jitter": "30s", "startingDeadline": "30s"}, "j", [DEADLINE, "at random"]),
    ("name-41", {}, "n" * 41, ["metadata.name must be at most 40 characters"]),
    ("no-containers", {"template": tmpl({"containers": []})}, "j", [CONTAINERS, "at least 1 item"]),
    ("containers-missing", {"template": tmpl({"nodeName": "x"})}, "j", [CONTAINERS, "Required"]),
    ("no-template", {"template": None}, "j", ["spec.template", "Required"]),
    ("no-image", {"template": tmpl({"containers": [{"name": "m"}]})}, "j", [f"{CONTAINERS}[0].image"]),
    (
        "reserved-label",
        {"template": tmpl({"containers": OK_CONTAINERS}, {"anarchon.io/job": "x"})},
        "j",
        ["labels under anarchon.io/ are set by the operator"],
    ),
    ("max-attempts-11", {"maxAttempts": 11}, "j", ["spec.maxAttempts", "less than or equal to 10"]),
    ("max-attempts-0", {"maxAttempts": 0}, "j", ["spec.maxAttempts", "greater than or equal to 1"]),
    ("history-negative", {"failedRunsHistoryLimit": -1}, "j", ["spec.failedRunsHistoryLimit"]),
    ("retries-no-limit", {"retries": {"backoff": "10s"}}, "j", ["spec.retries.limit", "Required"]),
    ("retries-21", {"retries": {"limit": 21}}, "j", ["spec.retries.limit", "less than or equal to 20"]),
    ("retries-negative", {"retries": {"limit": -1}}, "j", ["spec.retries.limit", "greater than or equal to 0"]),
    ("retry-backoff-999ms", {"retries": {"limit": 1, "backoff": "999ms"}}, "j", [RETRY_MIN, "crash loop"]),
    (
        "retry-backoff-over-1d",
        {"retries": {"limit": 1, "backoff": "1d1ms", "maxBackoff": "1d"}},
        "j",
        ["spec.retries.backoff must be at most 1d"],
    ),
    (
        "retry-cap-over-1d",
        {"retries": {"limit": 1, "maxBackoff": "25h"}},
        "j",
        ["spec.retries.maxBackoff must be at most 1d"],
    ),
    ("retry-cap-below-backoff", {"retries": {"limit": 1, "backoff": "1m", "maxBackoff": "59s"}}, "j", [RETRY_CAP]),
    ("retry-default-cap-below-backoff", {"retries": {"limit": 1, "backoff": "7m"}}, "j", [RETRY_CAP]),
    ("retry-cap-days", {"retries": {"limit": 1, "backoff": "1d", "maxBackoff": "23h59m"}}, "j", [RETRY_CAP]),
    ("unknown-field", {"jiter": "1s"}, "j", ['unknown field "spec.jiter"']),
]


@pytest.mark.parametrize(
    ("change", "name", "fragments"), [c[1:] for c in INVALID_JOBS], ids=[c[0] for c in INVALID_JOBS]
)
def test_invalid_jobs_are_rejected_with_a_useful_message(
    crds: ControlPlane, namespace: str, change: dict[str, Any], name: str, fragments: list[str]
) -> None:
    res = create(crds, namespace, job(name, **change), check=False)
    assert res.returncode != 0, f"accepted: {res.stdout}"
    for fragment in fragments:
        assert fragment in res.stderr, res.stderr
    # ...and the parser refuses the same spec (an old object, or validation off, must not run either).
    # An unknown field is the exception: the apiserver prunes it, and the parser ignores it alike.
    if "jiter" not in change:
        body = copy.deepcopy(job(name, **change))
        body["metadata"]["namespace"] = namespace
        with pytest.raises(SpecError):
            parse_job(body)


def test_cron_shorthands_are_admitted_and_read_as_cronjob_reads_them(crds: ControlPlane, namespace: str) -> None:
    """``@daily`` and the rest (CronJob's shorthands) pass admission, and the parser gives them the
    schedule of the five fields they stand for; a refused cron value is told in words, not as a regex."""
    for shorthand, fields in MACROS.items():
        created = create(crds, namespace, job(f"m{shorthand[1:]}", every=None, cron=f" {shorthand} "))
        parsed = parse_job(created).schedule
        assert parsed.fingerprint == cron(fields).fingerprint, shorthand
        assert parsed.next_after(1_800_000_000_000) == cron(fields).next_after(1_800_000_000_000), shorthand
    res = create(crds, namespace, job("hourly", every=None, cron="@Hourly"), check=False)
    assert res.returncode != 0 and CRON_SHAPE in res.stderr, res.stderr
    assert "should match" not in res.stderr and "[0-9A-Za-z" not in res.stderr, res.stderr


def test_all_rule_failures_are_reported_together(crds: ControlPlane, namespace: str) -> None:
    """CEL failures come together, but only once the plain schema checks pass.

    The apiserver skips the CEL rules of an object that already fails a schema check (enum,
    pattern...), so one edit can reveal new errors: another reason why the operator's
    parser, which reports everything in one pass, exists.
    """
    bad = job("n" * 41, cron="0 8 * * *", overlap="Sometimes", heartbeat="10s", lease="5s")
    res = create(crds, namespace, bad, check=False)
    assert res.returncode != 0
    assert "spec.overlap" in res.stderr and "some validation rules were not checked" in res.stderr, res.stderr
    assert "exactly one of spec.every and spec.cron" not in res.stderr
    bad["spec"]["overlap"] = "Allow"
    res = create(crds, namespace, bad, check=False)
    assert res.returncode != 0
    for fragment in ("metadata.name must be at most 40", "exactly one of spec.every and spec.cron", LEASE):
        assert fragment in res.stderr, res.stderr
    paths = [m.split(":", 1)[0] for m in _messages(bad, namespace)]
    assert paths == ["metadata.name", "spec", "spec.lease"]


def _messages(body: dict[str, Any], namespace: str) -> list[str]:
    b = copy.deepcopy(body)
    b["metadata"]["namespace"] = namespace
    with pytest.raises(SpecError) as info:
        parse_job(b)
    return info.value.messages


@pytest.mark.parametrize(
    ("heartbeat", "lease", "accepted"),
    [
        ("1h", "1d", True),
        ("1d", "2d", True),
        ("12h", "1d", True),
        ("1d12h", "72h", True),
        ("1d", "1d23h59m59s999ms", False),
        ("1d", "1d", False),
        ("1d12h", "71h", False),
        ("2d", "3d23h", False),
        ("25h", "2d", False),
    ],
)
def test_lease_and_heartbeat_in_days_are_compared_by_cel(
    crds: ControlPlane, namespace: str, heartbeat: str, lease: str, accepted: bool
) -> None:
    """CEL's duration() has no 'd'; the rule turns a leading <n>d into ms by hand. The parser agrees."""
    body = job("days", heartbeat=heartbeat, lease=lease)
    res = create(crds, namespace, body, check=False)
    assert (res.returncode == 0) is accepted, res.stderr
    if not accepted:
        assert LEASE in res.stderr, res.stderr
        assert _messages(body, namespace)[0].startswith("spec.lease: must be at least 2 heartbeats")
    else:
        assert parse_job(json.loads(res.stdout)).options.lease_ms is not None


def test_unknown_time_zone_and_bad_cron_values_are_left_to_the_operator(crds: ControlPlane, namespace: str) -> None:
    created = create(crds, namespace, job("tz", every=None, cron="61 25 * * *", timeZone="Mars/Olympus"))
    with pytest.raises(SpecError) as info:
        parse_job(created)
    assert [m.split(":")[0] for m in info.value.messages] == ["spec.timeZone", "spec.cron"]


def test_explain_documents_each_spec_field(crds: ControlPlane) -> None:
    text = explain(crds, "anarchonjob.spec.jitter")
    assert "FIELD: jitter <string>" in text
    assert "random delay between 0 and jitter" in text
    assert "Default 1s" in text
    for name, prop in JOB_SPEC_SCHEMA["properties"].items():
        out = explain(crds, f"anarchonjob.spec.{name}")
        first_words = " ".join(prop["description"].split()[:4])
        assert first_words in " ".join(out.split()), f"{name}: {out}"
    max_attempts = " ".join(explain(crds, "anarchonjob.spec.maxAttempts").split())
    assert "A Pod that FAILS" in max_attempts and "is not an interruption" in max_attempts
    retries = " ".join(explain(crds, "anarchonjob.spec.retries").split())
    assert "backoffLimit" in retries and "Tries are not attempts" in retries
    assert "FIELD: limit <integer>" in explain(crds, "anarchonjob.spec.retries.limit")
    assert "A try is one Pod of the run" in " ".join(explain(crds, "anarchonrun.status.try").split())
    run_phase = " ".join(explain(crds, "anarchonrun.status.phase").split())
    assert "Interrupted" in run_phase


def test_job_printer_columns(crds: ControlPlane, namespace: str) -> None:
    create(crds, namespace, job("every-job"))
    create(crds, namespace, job("cron-job", every=None, cron="0 8 * * *", timeZone="Europe/Paris", suspend=True))
    last = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    nxt = (datetime.now(UTC) + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "observedGeneration": 1,
        "activeCount": 2,
        "active": [
            {"name": "every-job-1791633600", "slot": 1791633600000, "attempt": 1, "instance": "op-0:1"},
            {"name": "every-job-1791633610", "slot": 1791633610000, "attempt": 2, "instance": "op-1:1"},
        ],
        "lastScheduleTime": last,
        "lastSuccessfulTime": last,
        "nextScheduleTime": nxt,
        "nextSlot": 1791633620000,
        "schedule": "every 10s",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Scheduled",
                "message": "every 10s",
                "lastTransitionTime": last,
                "observedGeneration": 1,
            }
        ],
    }
    crds.kubectl(
        "patch", C.JOBS, "every-job", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    out = crds.kubectl("get", C.JOBS, "-n", namespace).stdout
    assert out.split("\n")[0].split() == ["NAME", "SCHEDULE", "SUSPEND", "ACTIVE", "READY", "LAST", "NEXT", "AGE"]
    rows = {r["NAME"]: r for r in table(out)}
    e, c = rows["every-job"], rows["cron-job"]
    assert (e["SCHEDULE"], e["SUSPEND"], e["ACTIVE"], e["READY"]) == ("every 10s", "false", "2", "True")
    assert re.fullmatch(r"(\d+[smhdy])+", e["LAST"]), f"LAST should be an age, got {e['LAST']!r}"
    assert e["NEXT"] == nxt, "NEXT is a string column: a date column prints <invalid> for a future time"
    # No status yet (no operator has seen it): every status column is empty.
    assert (c["SCHEDULE"], c["SUSPEND"], c["ACTIVE"], c["READY"], c["LAST"], c["NEXT"]) == ("", "true", "", "", "", "")
    wide = table(crds.kubectl("get", "aj", "-n", namespace, "-o", "wide").stdout)
    assert {r["NAME"]: (r["EVERY"], r["CRON"], r["TIMEZONE"]) for r in wide} == {
        "every-job": ("10s", "", "UTC"),
        "cron-job": ("", "0 8 * * *", "Europe/Paris"),
    }


def test_job_status_rejects_a_bad_condition(crds: ControlPlane, namespace: str) -> None:
    create(crds, namespace, job("cond"))
    bad = {"status": {"conditions": [{"type": "Ready", "status": "Yes", "reason": "X", "message": ""}]}}
    res = crds.kubectl(
        "patch", C.JOBS, "cond", "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(bad),
        check=False,
    )  # fmt: skip
    assert res.returncode != 0
    assert "status.conditions[0].status" in res.stderr and "lastTransitionTime" in res.stderr, res.stderr


def run(name: str, slot: int, job_name: str = "sync") -> dict[str, Any]:
    return {
        "apiVersion": C.API_VERSION,
        "kind": C.RUN_KIND,
        "metadata": {"name": name, "labels": {C.LABEL_JOB: job_name, C.LABEL_SLOT: str(slot)}},
        "spec": {"job": job_name, "slot": slot, "slotTime": S.slot_time(slot)},
    }


def patch_run_status(cp: ControlPlane, namespace: str, name: str, status: dict[str, Any], *, check: bool = True) -> Any:
    return cp.kubectl(
        "patch", C.RUNS, name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}), check=check,
    )  # fmt: skip


def test_run_printer_columns_and_status(crds: ControlPlane, namespace: str) -> None:
    slot = 1_791_633_610_000
    name = S.run_name("sync", slot)
    created = create(crds, namespace, run(name, slot))
    assert created["spec"]["trigger"] == "Schedule", "trigger defaults to Schedule"
    pod = S.pod_name(name)
    patch_run_status(
        crds,
        namespace,
        name,
        {
            "phase": "Running",
            "attempt": 2,
            "instance": "op-1:7",
            "podName": S.pod_name(name, 2),
            "try": 2,
            "tries": [
                {
                    "try": 1,
                    "podName": pod,
                    "outcome": "Failed",
                    "startTime": "2026-10-10T12:00:11Z",
                    "finishTime": "2026-10-10T12:00:20Z",
                    "message": "container main exited with code 3",
                },
                {"try": 2, "podName": S.pod_name(name, 2), "outcome": "Running", "startTime": "2026-10-10T12:00:41Z"},
            ],
            "startTime": "2026-10-10T12:00:11Z",
            "message": "",
            "attempts": [
                {
                    "attempt": 1,
                    "instance": "op-0:3",
                    "podName": pod,
                    "outcome": "Interrupted",
                    "startTime": "2026-10-10T12:00:11Z",
                    "finishTime": "2026-10-10T12:00:40Z",
                    "message": "lease ran out",
                },
                {
                    "attempt": 2,
                    "instance": "op-1:7",
                    "podName": pod,
                    "outcome": "Running",
                    "startTime": "2026-10-10T12:00:41Z",
                },
            ],
        },
    )
    skipped = S.run_name("sync", slot + 10_000)
    create(crds, namespace, run(skipped, slot + 10_000))
    patch_run_status(crds, namespace, skipped, {"phase": "Skipped", "attempt": 0, "message": "sync-1791633610 active"})

    out = crds.kubectl("get", C.RUNS, "-n", namespace).stdout
    assert out.split("\n")[0].split() == ["NAME", "JOB", "SLOT", "PHASE", "ATTEMPT", "TRY", "INSTANCE", "POD", "AGE"]
    rows = {r["NAME"]: r for r in table(out)}
    r = rows[name]
    assert (r["JOB"], r["SLOT"], r["PHASE"], r["ATTEMPT"], r["TRY"], r["INSTANCE"], r["POD"]) == (
        "sync",
        "2026-10-10T12:00:10Z",
        "Running",
        "2",
        "2",
        "op-1:7",
        "sync-1791633610-r1",
    )
    assert (rows[skipped]["PHASE"], rows[skipped]["ATTEMPT"], rows[skipped]["POD"]) == ("Skipped", "0", "")
    wide = {x["NAME"]: x for x in table(crds.kubectl("get", "ar", "-n", namespace, "-o", "wide").stdout)}
    assert wide[name]["TRIGGER"] == "Schedule"
    # The category lists both kinds.
    crds.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(job("sync")))
    everything = crds.kubectl("get", "anarchon", "-n", namespace, "-o", "name").stdout.split()
    assert "anarchonjob.anarchon.io/sync" in everything and f"anarchonrun.anarchon.io/{name}" in everything


def test_shared_name_cannot_be_set_changed_or_removed_after_creation(crds: ControlPlane, namespace: str) -> None:
    """It is the job's identity in the store: changing it would make the object another job."""
    create(crds, namespace, job("shared", sharedName="report.billing"))
    create(crds, namespace, job("alone"))
    for name, change in (("shared", "other"), ("shared", None), ("alone", "report.billing")):
        patch = json.dumps({"spec": {"sharedName": change}})
        res = crds.kubectl("patch", C.JOBS, name, "-n", namespace, "--type=merge", "-p", patch, check=False)
        assert res.returncode != 0 and "spec.sharedName cannot be set, changed or removed" in res.stderr, res.stderr
    res = crds.kubectl("patch", C.JOBS, "shared", "-n", namespace, "--type=merge", "-p", '{"spec":{"every":"1m"}}')
    assert res.returncode == 0, res.stderr


def test_run_spec_is_immutable_and_status_enums_hold(crds: ControlPlane, namespace: str) -> None:
    slot = 1_791_633_620_000
    name = S.run_name("sync", slot)
    create(crds, namespace, run(name, slot))
    res = crds.kubectl(
        "patch", C.RUNS, name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": {"slot": slot + 1}}),
        check=False,
    )  # fmt: skip
    assert res.returncode != 0 and "spec is immutable" in res.stderr, res.stderr
    res = patch_run_status(crds, namespace, name, {"phase": "Done"}, check=False)
    assert res.returncode != 0 and 'Unsupported value: "Done"' in res.stderr, res.stderr
    bad_trigger = run(S.run_name("sync", slot + 1000), slot + 1000)
    bad_trigger["spec"]["trigger"] = "Cron"
    res = create(crds, namespace, bad_trigger, check=False)
    assert res.returncode != 0 and "spec.trigger" in res.stderr, res.stderr
