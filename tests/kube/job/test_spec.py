"""Unit tests of the AnarchonJob parser: what the operator accepts, its defaults, and its messages.

The parser is the operator's last line of defence against specs the CRD did not check (old
objects, validation off), so every rule is tested on its own (the message must name the
field) and together (one SpecError lists them all).
"""

from __future__ import annotations

import copy
import re
from datetime import datetime
from types import MappingProxyType
from typing import Any

import pytest

from anarchon.engine.limits import MAX_RETRIES
from anarchon.engine.model import CatchUp, Overlap
from anarchon.engine.schedule import Cron, Every
from anarchon.kube.constants import (
    ANNOTATION_INSTANCE,
    ANNOTATION_SCHEDULED_AT,
    ANNOTATION_TRIGGER,
    ANNOTATION_TRIGGER_HANDLED,
    LABEL_ATTEMPT,
    LABEL_FOLLOWER,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    LABEL_RUN,
    LABEL_SLOT,
    LABEL_TRY,
    MANAGED_BY,
)
from anarchon.kube.job.spec import (
    CRD_DEFAULTS,
    JobSpec,
    SpecError,
    parse_job,
    pod_name,
    run_name,
    schedule_column,
    slot_time,
)


def body(spec: dict[str, Any] | None = None, *, name: str = "sync", **meta: Any) -> dict[str, Any]:
    """An AnarchonJob as the API returns it, with ``spec`` merged over a minimal valid one."""
    base: dict[str, Any] = {
        "every": "10s",
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}},
    }
    base.update(spec or {})
    return {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonJob",
        "metadata": {"name": name, "namespace": "team-a", "uid": "u-1", "generation": 4, **meta},
        "spec": base,
    }


def errors_of(b: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job(b)
    assert info.value.messages, "a SpecError must carry at least one message"
    assert str(info.value) == "; ".join(info.value.messages)
    return info.value.messages


# ------------------------------------------------------------------------------ valid specs


def test_minimal_every_spec_gets_every_default() -> None:
    job = parse_job(body())
    assert isinstance(job, JobSpec)
    assert (job.namespace, job.name, job.uid, job.generation) == ("team-a", "sync", "u-1", 4)
    assert job.engine_name == "team-a/sync"
    assert job.schedule == Every(10_000)
    o = job.options
    assert o.jitter_ms == 1_000
    assert o.heartbeat_ms == 5_000
    assert o.lease_ms is None and o.effective_lease_ms == 15_000
    assert o.overlap is Overlap.SKIP
    assert o.catch_up is CatchUp.NONE
    assert o.catch_up_window_ms == 3_600_000
    assert o.starting_deadline_ms is None
    assert o.max_attempts == 3
    assert job.timeout_ms is None and o.timeout_ms is None, "the runner times a try, not the engine"
    assert o.resumable, "a takeover may adopt a live Pod: the runner counts relaunches"
    assert job.pending_timeout_ms is None
    assert job.retries.max_tries == 1, "no retry unless asked for"
    assert o.suspend is False
    assert (job.successful_history, job.failed_history) == (3, 1)
    assert job.template == {
        "metadata": {"labels": {}, "annotations": {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}], "restartPolicy": "Never"},
    }


def test_defaults_match_the_declared_crd_defaults() -> None:
    """The parser's defaults come from CRD_DEFAULTS: an explicit spec with those values parses the same."""
    explicit = {
        "timeZone": CRD_DEFAULTS["timeZone"],
        "jitter": CRD_DEFAULTS["jitter"],
        "heartbeat": CRD_DEFAULTS["heartbeat"],
        "overlap": CRD_DEFAULTS["overlap"],
        "catchUp": {"policy": CRD_DEFAULTS["catchUp.policy"], "window": CRD_DEFAULTS["catchUp.window"]},
        "maxAttempts": CRD_DEFAULTS["maxAttempts"],
        "suspend": CRD_DEFAULTS["suspend"],
        "retries": {
            "limit": 2,
            "backoff": CRD_DEFAULTS["retries.backoff"],
            "maxBackoff": CRD_DEFAULTS["retries.maxBackoff"],
        },
        "successfulRunsHistoryLimit": CRD_DEFAULTS["successfulRunsHistoryLimit"],
        "failedRunsHistoryLimit": CRD_DEFAULTS["failedRunsHistoryLimit"],
    }
    assert parse_job(body(explicit)) == parse_job(body({"retries": {"limit": 2}}))


def test_null_fields_take_their_defaults() -> None:
    """The apiserver prunes nulls then defaults; an object stored without that must read the same."""
    nulls = {k: None for k in ("timeZone", "jitter", "heartbeat", "lease", "overlap", "catchUp", "maxAttempts")}
    assert parse_job(body(nulls)) == parse_job(body())
    assert parse_job(body({"catchUp": {"policy": None, "window": None}})) == parse_job(body())


def test_every_field_set() -> None:
    job = parse_job(
        body(
            {
                "every": "1h30m",
                "jitter": "250ms",
                "heartbeat": "2s",
                "lease": "7s",
                "overlap": "Replace",
                "catchUp": {"policy": "All", "window": "2d"},
                "startingDeadline": "90s",
                "maxAttempts": 10,
                "timeout": "5m",
                "pendingTimeout": "2m",
                "retries": {"limit": 6, "backoff": "2s", "maxBackoff": "1m"},
                "suspend": True,
                "successfulRunsHistoryLimit": 0,
                "failedRunsHistoryLimit": 7,
            }
        )
    )
    o = job.options
    assert job.schedule == Every(5_400_000)
    assert (o.jitter_ms, o.heartbeat_ms, o.lease_ms, o.effective_lease_ms) == (250, 2_000, 7_000, 7_000)
    assert o.overlap is Overlap.REPLACE
    assert o.catch_up is CatchUp.ALL
    assert o.catch_up_window_ms == 2 * 86_400_000
    assert o.starting_deadline_ms == 90_000
    assert o.max_attempts == 10
    assert job.timeout_ms == 300_000
    assert o.suspend is True
    assert (job.successful_history, job.failed_history) == (0, 7)
    assert job.pending_timeout_ms == 120_000
    assert (job.retries.limit, job.retries.backoff_ms, job.retries.max_backoff_ms) == (6, 2_000, 60_000)


@pytest.mark.parametrize(
    ("cron", "tz", "after", "expected"),
    [
        # 08:00 in Paris in winter is 07:00 UTC.
        ("0 8 * * *", "Europe/Paris", "2026-01-15T00:00:00Z", "2026-01-15T07:00:00Z"),
        # 6 fields: seconds first.
        ("30 0 12 * * *", "UTC", "2026-01-15T00:00:00Z", "2026-01-15T12:00:30Z"),
        # Extra spaces are tolerated and normalised.
        ("  */15   *  * * *  ", "UTC", "2026-01-15T00:01:00Z", "2026-01-15T00:15:00Z"),
    ],
)
def test_cron_specs(cron: str, tz: str, after: str, expected: str) -> None:
    job = parse_job(body({"every": None, "cron": cron, "timeZone": tz}))
    assert isinstance(job.schedule, Cron)
    assert job.schedule.tz == tz
    after_ms = int(datetime.fromisoformat(after).timestamp() * 1000)
    assert slot_time(job.schedule.next_after(after_ms)) == expected


def test_every_accepts_explicit_utc_time_zone() -> None:
    assert parse_job(body({"timeZone": "UTC"})).schedule == Every(10_000)


def test_durations_in_days() -> None:
    """Days count 24 hours, in every field and in the lease/heartbeat comparison."""
    assert parse_job(body({"heartbeat": "1h", "lease": "1d"})).options.lease_ms == 86_400_000
    assert parse_job(body({"every": "1d12h30m15s250ms"})).schedule == Every(131_415_250)
    assert parse_job(body({"heartbeat": "12h", "lease": "1d"})).options.lease_ms == 86_400_000
    msgs = errors_of(body({"heartbeat": "1d", "lease": "47h"}))
    assert len(msgs) == 1 and msgs[0].startswith("spec.lease: must be at least 2 heartbeats (2d with")


def test_the_smallest_and_largest_accepted_values() -> None:
    """Each bound of anarchon.engine.limits is inclusive: the limit itself runs."""
    job = parse_job(body({"every": "1s", "heartbeat": "500ms", "lease": "1s", "timeout": "1s", "jitter": "1h"}))
    o = job.options
    assert job.schedule == Every(1_000)
    assert (o.heartbeat_ms, o.lease_ms, job.timeout_ms, o.jitter_ms) == (500, 1_000, 1_000, 3_600_000)
    assert parse_job(body({"heartbeat": "500ms"})).options.effective_lease_ms == 1_500  # the default: 3 heartbeats


def test_accepts_read_only_mapping_views() -> None:
    """A body may come as read-only views; the template must come back as plain, mutable dicts."""
    tmpl = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "m", "image": "i"}]}}
    b = body({"template": tmpl})
    view = MappingProxyType({k: MappingProxyType(v) if isinstance(v, dict) else v for k, v in b.items()})
    job = parse_job(view)
    assert job.template["metadata"]["labels"] == {"app": "x"}
    job.template["spec"]["containers"][0]["image"] = "changed"


# ------------------------------------------------------------------------------ template


def test_restart_policy_is_forced_to_never_and_template_is_a_copy() -> None:
    b = body(
        {
            "template": {
                "metadata": {"labels": {"app": "etl"}, "annotations": {"note": "hi"}, "name": "ignored"},
                "spec": {"containers": [{"name": "m", "image": "i", "args": ["a"]}], "nodeSelector": {"x": "y"}},
            }
        }
    )
    original = copy.deepcopy(b)
    job = parse_job(b)
    assert job.template == {
        "metadata": {"labels": {"app": "etl"}, "annotations": {"note": "hi"}},
        "spec": {
            "containers": [{"name": "m", "image": "i", "args": ["a"]}],
            "nodeSelector": {"x": "y"},
            "restartPolicy": "Never",
        },
    }
    job.template["spec"]["containers"][0]["args"].append("b")
    assert b == original, "parse_job must not share mutable state with the body"
    explicit = body({"template": {"spec": {"containers": [{"name": "m", "image": "i"}], "restartPolicy": "Never"}}})
    assert parse_job(explicit).template["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("policy", ["Always", "OnFailure", ""])
def test_restart_policy_other_than_never_is_rejected(policy: str) -> None:
    tmpl = {"spec": {"containers": [{"name": "m", "image": "i"}], "restartPolicy": policy}}
    msgs = errors_of(body({"template": tmpl}))
    assert len(msgs) == 1
    assert msgs[0].startswith("spec.template.spec.restartPolicy: must be Never")
    assert "forces Never" in msgs[0]


# ------------------------------------------------------------------------------ one bad field at a time


BAD_FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("both schedules", {"cron": "0 8 * * *"}, "spec: set exactly one of every and cron"),
    ("no schedule", {"every": None}, "spec: set one of every"),
    ("every = 0", {"every": "0s"}, "spec.every: must be at least 1s, got '0s': the finest cron grain"),
    ("every = 0 in ms and days", {"every": "0d0ms"}, "spec.every: must be at least 1s, got '0d0ms'"),
    ("every = 10ms", {"every": "10ms"}, "spec.every: must be at least 1s, got '10ms'"),
    ("every = 999ms", {"every": "999ms"}, "spec.every: must be at least 1s, got '999ms'"),
    ("every not a duration", {"every": "ten seconds"}, "spec.every: cannot parse"),
    ("every upper case", {"every": "10S"}, "spec.every: cannot parse"),
    ("units out of order", {"every": "30m1h"}, "spec.every: cannot parse"),
    ("unit twice", {"every": "1h1h"}, "spec.every: cannot parse"),
    ("empty duration", {"jitter": ""}, "spec.jitter: cannot parse ''"),
    ("absurd duration", {"lease": "99999999999999999d"}, "spec.lease: '99999999999999999d' is too long"),
    ("every as a number", {"every": 10}, "spec.every: expected a duration string"),
    ("every with a fraction", {"every": "1.5s"}, "spec.every: cannot parse"),
    ("every negative", {"every": "-10s"}, "spec.every: cannot parse"),
    ("every with a zone", {"timeZone": "Europe/Paris"}, "spec.timeZone: must be UTC or unset with every"),
    ("bad cron values", {"every": None, "cron": "61 * * * *"}, "spec.cron: '61 * * * *' is not a valid cron"),
    ("impossible cron", {"every": None, "cron": "0 0 30 2 *"}, "spec.cron: '0 0 30 2 *' never fires: no date"),
    (
        "cron skipped by DST",
        {"every": None, "cron": "*/5 2 * 3 0#5", "timeZone": "Europe/Paris"},
        "spec.cron: '*/5 2 * 3 0#5' never fires in Europe/Paris",
    ),
    ("cron with 4 fields", {"every": None, "cron": "0 8 * *"}, "spec.cron: '0 8 * *' is not a cron expression"),
    ("cron with 7 fields", {"every": None, "cron": "0 0 8 * * * 2026"}, "spec.cron: '0 0 8 * * * 2026' is not"),
    ("cron unknown macro", {"every": None, "cron": "@fortnightly"}, "spec.cron: '@fortnightly' is not a cron"),
    ("cron not a string", {"every": None, "cron": 5}, "spec.cron: expected a string"),
    ("unknown zone", {"every": None, "cron": "0 8 * * *", "timeZone": "Mars/Olympus"}, "spec.timeZone: unknown"),
    ("zone path", {"every": None, "cron": "0 8 * * *", "timeZone": "../etc/passwd"}, "spec.timeZone: '../etc"),
    ("bad jitter", {"jitter": "x"}, "spec.jitter: cannot parse 'x'"),
    ("bad heartbeat", {"heartbeat": "5 s"}, "spec.heartbeat: cannot parse"),
    ("zero heartbeat", {"heartbeat": "0s"}, "spec.heartbeat: must be at least 500ms, got '0s': each heartbeat"),
    ("heartbeat = 1ms", {"heartbeat": "1ms", "lease": "1s"}, "spec.heartbeat: must be at least 500ms, got '1ms'"),
    ("heartbeat = 499ms", {"heartbeat": "499ms"}, "spec.heartbeat: must be at least 500ms, got '499ms'"),
    ("lease = heartbeat", {"heartbeat": "5s", "lease": "5s"}, "spec.lease: must be at least 2 heartbeats (10s"),
    ("lease = heartbeat + 1ms", {"heartbeat": "5s", "lease": "5s1ms"}, "spec.lease: must be at least 2 heartbeats"),
    (
        "lease < 2 default heartbeats",
        {"lease": "9s999ms"},
        "spec.lease: must be at least 2 heartbeats (10s with spec.heartbeat 5s), got '9s999ms': with less, one late",
    ),
    ("jitter > 1h", {"jitter": "1h1ms"}, "spec.jitter: must be at most 1h, got '1h1ms': it delays"),
    ("bad lease", {"lease": "long"}, "spec.lease: cannot parse"),
    ("overlap", {"overlap": "Sometimes"}, "spec.overlap: must be one of Skip, Allow, Replace, got 'Sometimes'"),
    ("overlap case", {"overlap": "skip"}, "spec.overlap: must be one of"),
    ("catchUp not an object", {"catchUp": "All"}, "spec.catchUp: expected an object"),
    ("catchUp policy", {"catchUp": {"policy": "Most"}}, "spec.catchUp.policy: must be one of None, Latest, All"),
    ("catchUp window", {"catchUp": {"window": "1 hour"}}, "spec.catchUp.window: cannot parse"),
    ("catchUp window 0s", {"catchUp": {"window": "0s"}}, "spec.catchUp.window: must be at least 1s, got '0s'"),
    ("startingDeadline", {"startingDeadline": "soon"}, "spec.startingDeadline: cannot parse"),
    (
        "startingDeadline 0s",
        {"startingDeadline": "0s"},
        "spec.startingDeadline: must be at least spec.jitter (1s) plus 1s, got '0s': a run waits up to the jitter",
    ),
    (
        "startingDeadline within the jitter",
        {"jitter": "30s", "startingDeadline": "30s999ms"},
        "spec.startingDeadline: must be at least spec.jitter (30s) plus 1s, got '30s999ms'",
    ),
    ("maxAttempts 0", {"maxAttempts": 0}, "spec.maxAttempts: must be between 1 and 10, got 0"),
    ("maxAttempts 11", {"maxAttempts": 11}, "spec.maxAttempts: must be between 1 and 10, got 11"),
    ("maxAttempts text", {"maxAttempts": "3"}, "spec.maxAttempts: expected an integer"),
    ("maxAttempts bool", {"maxAttempts": True}, "spec.maxAttempts: expected an integer"),
    ("timeout zero", {"timeout": "0s"}, "spec.timeout: must be at least 1s, got '0s'"),
    ("timeout = 10ms", {"timeout": "10ms"}, "spec.timeout: must be at least 1s, got '10ms': it becomes the Pod's"),
    ("pending timeout zero", {"pendingTimeout": "0s"}, "spec.pendingTimeout: must be at least 1s, got '0s'"),
    ("timeout bad", {"timeout": "1y"}, "spec.timeout: cannot parse"),
    ("suspend text", {"suspend": "yes"}, "spec.suspend: expected true or false"),
    ("retries not an object", {"retries": 3}, "spec.retries: expected an object"),
    ("retries without limit", {"retries": {"backoff": "10s"}}, "spec.retries.limit: required"),
    ("retries 21", {"retries": {"limit": 21}}, "spec.retries.limit: must be between 0 and 20, got 21"),
    ("retries negative", {"retries": {"limit": -1}}, "spec.retries.limit: must be between 0 and 20, got -1"),
    (
        "retry backoff 999ms",
        {"retries": {"limit": 1, "backoff": "999ms"}},
        "spec.retries.backoff: must be at least 1s, got '999ms': shorter relaunches a failing Pod in a crash loop",
    ),
    ("retry cap > 1d", {"retries": {"limit": 1, "maxBackoff": "1d1ms"}}, "spec.retries.maxBackoff: must be at most 1d"),
    (
        "retry cap < backoff",
        {"retries": {"limit": 1, "backoff": "7m"}},
        "spec.retries.maxBackoff: must not be shorter than spec.retries.backoff (7m), got 6m",
    ),
    ("successful history", {"successfulRunsHistoryLimit": -1}, "spec.successfulRunsHistoryLimit: must be between 0"),
    (
        "failed history too long",
        {"failedRunsHistoryLimit": 1001},
        "spec.failedRunsHistoryLimit: must be between 0 and 1000, got 1001",
    ),
    ("failed history", {"failedRunsHistoryLimit": 1.5}, "spec.failedRunsHistoryLimit: expected an integer"),
    ("no template", {"template": None}, "spec.template: required"),
    ("template not an object", {"template": []}, "spec.template: expected an object"),
    ("no pod spec", {"template": {"metadata": {}}}, "spec.template.spec: required"),
    ("no containers", {"template": {"spec": {}}}, "spec.template.spec.containers: at least one container"),
    ("empty containers", {"template": {"spec": {"containers": []}}}, "spec.template.spec.containers: at least one"),
    (
        "container without image",
        {"template": {"spec": {"containers": [{"name": "m"}]}}},
        "spec.template.spec.containers[0].image: required",
    ),
    (
        "reserved label",
        {"template": {"metadata": {"labels": {LABEL_JOB: "x"}}, "spec": {"containers": [{"name": "m", "image": "i"}]}}},
        "spec.template.metadata.labels.anarchon.io/job: labels under anarchon.io/ are set by the operator",
    ),
    (
        "label not a string",
        {"template": {"metadata": {"labels": {"n": 1}}, "spec": {"containers": [{"name": "m", "image": "i"}]}}},
        "spec.template.metadata.labels.n: expected a string",
    ),
]


@pytest.mark.parametrize(("change", "expected"), [(c, e) for _, c, e in BAD_FIELDS], ids=[i for i, _, _ in BAD_FIELDS])
def test_each_bad_field_is_named(change: dict[str, Any], expected: str) -> None:
    msgs = errors_of(body(change))
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith(expected), msgs[0]


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"name": "x" * 41}, "metadata.name: must be at most 40 characters, got 41"),
        ({"name": None}, "metadata.name: required"),
        ({"name": ""}, "metadata.name: required"),
        ({"namespace": None}, "metadata.namespace: required"),
        ({"generation": "4"}, "metadata.generation: expected an integer"),
    ],
)
def test_bad_metadata(meta: dict[str, Any], expected: str) -> None:
    b = body()
    b["metadata"].update(meta)
    msgs = errors_of(b)
    assert len(msgs) == 1 and msgs[0].startswith(expected), msgs


def test_name_of_40_characters_is_accepted() -> None:
    assert parse_job(body(name="x" * 40)).name == "x" * 40


def test_missing_spec() -> None:
    assert errors_of({"metadata": {"name": "a", "namespace": "b"}}) == ["spec: required"]


def test_all_errors_at_once() -> None:
    b = body(
        {
            "every": "0s",
            "cron": "61 * * * *",
            "timeZone": "Mars/Olympus",
            "jitter": "1S",
            "heartbeat": "2s",
            "lease": "1s",
            "overlap": "Sometimes",
            "catchUp": {"policy": "Some", "window": "x"},
            "maxAttempts": 11,
            "timeout": "0s",
            "template": {"spec": {"containers": [], "restartPolicy": "Always"}},
        },
        name="n" * 41,
    )
    paths = [m.split(":", 1)[0] for m in errors_of(b)]
    assert paths == [
        "metadata.name",
        "spec.timeZone",
        "spec",  # both every and cron
        "spec.every",
        "spec.cron",
        "spec.jitter",
        "spec.lease",
        "spec.overlap",
        "spec.catchUp.policy",
        "spec.catchUp.window",
        "spec.timeout",
        "spec.maxAttempts",
        "spec.template.spec.containers",
        "spec.template.spec.restartPolicy",
    ]


# ------------------------------------------------------------------------------ names and labels


def test_run_and_pod_names() -> None:
    assert run_name("sync", 1_791_633_610_000) == "sync-1791633610"
    assert run_name("sync", 1_791_633_610_250) == "sync-1791633610250"
    assert run_name("sync", 0) == "sync-0"
    assert pod_name("sync-1791633610") == "sync-1791633610", "one Pod name per try, whatever the attempt"
    assert pod_name("sync-1791633610", 1) == "sync-1791633610", "the first try keeps the run's name"
    assert [pod_name("sync-1791633610", n) for n in (2, 21)] == ["sync-1791633610-r1", "sync-1791633610-r20"]
    with pytest.raises(ValueError):
        pod_name("sync-1791633610", 0)
    with pytest.raises(ValueError):
        run_name("sync", -1)


def test_longest_names_fit_a_dns_label() -> None:
    """A 40-character job and a millisecond slot still make a valid 63-character label."""
    longest = pod_name(run_name("j" * 40, 9_999_999_999_999), 1 + MAX_RETRIES)
    assert len(longest) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", longest)


def test_slot_time() -> None:
    assert slot_time(0) == "1970-01-01T00:00:00Z"
    assert slot_time(1_791_633_610_000) == "2026-10-10T12:00:10Z"
    assert slot_time(1_791_633_610_007) == "2026-10-10T12:00:10.007Z"


def test_label_keys() -> None:
    assert (LABEL_JOB, LABEL_RUN, LABEL_SLOT, LABEL_ATTEMPT, LABEL_TRY, LABEL_FOLLOWER) == (
        "anarchon.io/job",
        "anarchon.io/run",
        "anarchon.io/slot",
        "anarchon.io/attempt",
        "anarchon.io/try",
        "anarchon.io/follower",
    )
    assert ANNOTATION_SCHEDULED_AT == "anarchon.io/scheduled-at"
    assert (LABEL_MANAGED_BY, MANAGED_BY) == ("app.kubernetes.io/managed-by", "anarchon")
    assert (ANNOTATION_INSTANCE, ANNOTATION_TRIGGER, ANNOTATION_TRIGGER_HANDLED) == (
        "anarchon.io/instance",
        "anarchon.io/trigger",
        "anarchon.io/trigger-handled",
    )


@pytest.mark.parametrize(
    ("schedule", "column"),
    [
        ({"every": "10s"}, "every 10s"),
        ({"every": "1h30m"}, "every 1h30m"),
        ({"every": None, "cron": "0 8 * * *"}, "0 8 * * *"),
        ({"every": None, "cron": "0 8 * * *", "timeZone": "Europe/Paris"}, "0 8 * * * Europe/Paris"),
    ],
)
def test_schedule_column(schedule: dict[str, Any], column: str) -> None:
    assert schedule_column(parse_job(body(schedule)).schedule) == column
