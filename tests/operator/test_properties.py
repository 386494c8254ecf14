"""Property tests: generated AnarchonJob specs and trigger annotations, through the real API server
and a running operator replica.

Every generated spec must end one of three ways: refused at admission by the CRD (schema or CEL)
with a message naming a field, admitted and scheduled, or admitted and marked ``Invalid`` with
a message naming the field — never a crash, a stall or a silent death. The operator's parser is
checked against the CRD on the way: it refuses everything the CRD refuses (an object stored
before a CRD upgrade must not run either) and decides exactly what the replica reports. A valid
job beside them keeps getting its runs, and the replica must stay up from start to end.

Examples are few (each is a round trip through the API server and the replica) and
deterministic (``derandomize``); shrinking is off, as each step would cost seconds: a failure
reports the first failing example as generated.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from anarchon.engine import Every
from anarchon.engine import limits as L
from anarchon.kube.job.spec import JobSpec, SpecError, parse_job, schedule_column
from anarchon.kube.job.triggers import NOW, parse_trigger
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)

# Mostly sensible values (so that many specs get past admission), then the edges of
# anarchon.engine.limits, any <n><unit>, and text that is no duration at all.
SENSIBLE = st.sampled_from(["500ms", "1s", "2s", "5s", "30s", "1m", "1h"])
DURATIONS = st.one_of(
    SENSIBLE,
    SENSIBLE,
    SENSIBLE,
    st.sampled_from(["0s", "1ms", "10ms", "499ms", "999ms", "1h1ms", "1d"]),
    st.builds(lambda n, unit: f"{n}{unit}", st.integers(0, 3000), st.sampled_from(["ms", "s", "m", "h", "d"])),
    st.sampled_from(["", "1S", "10 seconds", "-1s", "1.5s", "30m1h", "99999999999999999d"]),
)
# Valid, out of range, short of a field, and dates that never come (30 February, 31 April).
CRONS = st.sampled_from(
    ["0 8 * * *", "*/15 * * * *", "30 0 12 * * *", "61 * * * *", "0 25 * * *", "0 8 * *", "0 0 30 2 *", "0 0 31 4 *"]
)
ZONES = st.sampled_from(["UTC", "Europe/Paris", "Mars/Olympus", "Paris, France"])
SCHEDULES = st.one_of(
    st.fixed_dictionaries({"every": DURATIONS}),
    st.fixed_dictionaries({"cron": CRONS}, optional={"timeZone": ZONES}),
    st.fixed_dictionaries({"every": DURATIONS, "cron": CRONS}),
    st.fixed_dictionaries({"every": DURATIONS, "timeZone": ZONES}),
    st.just({}),
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "every": DURATIONS,
    "cron": CRONS,
    "timeZone": ZONES,
    "jitter": DURATIONS,
    "heartbeat": DURATIONS,
    "lease": DURATIONS,
    "startingDeadline": DURATIONS,
    "timeout": DURATIONS,
    "overlap": st.sampled_from(["Skip", "Allow", "Replace", "Sometimes"]),
    "catchUp": st.fixed_dictionaries({}, optional={"policy": st.sampled_from(["None", "All", "Most"])}),
    "maxAttempts": st.integers(-1, 12),
    "successfulRunsHistoryLimit": st.integers(-1, 4),
    "suspend": st.booleans(),
}
#: A valid schedule with one field changed (many get past admission), or anything at all.
VALID_SCHEDULES = st.one_of(
    st.fixed_dictionaries({"every": st.sampled_from(["1s", "2s", "10s", "1m", "1h"])}),
    st.fixed_dictionaries(
        {
            "cron": st.sampled_from(["0 8 * * *", "*/15 * * * *", "30 0 12 * * *"]),
            "timeZone": st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
        }
    ),
)
ONE_FIELD = st.one_of(*(st.fixed_dictionaries({key: value}) for key, value in FIELDS.items()))
ANY_FIELDS = st.fixed_dictionaries({}, optional={k: v for k, v in FIELDS.items() if k not in ("every", "cron")})


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for part in parts for k, v in part.items()}


SPECS = st.one_of(
    st.builds(_merge, VALID_SCHEDULES, ONE_FIELD),
    st.builds(_merge, VALID_SCHEDULES, ONE_FIELD, ONE_FIELD),
    st.builds(_merge, SCHEDULES, ANY_FIELDS),
)


def _within_limits(job: JobSpec) -> list[str]:
    """What a scheduled job breaks of anarchon.engine.limits (nothing, if admission and the parser hold)."""
    o = job.options
    broken = []
    if isinstance(job.schedule, Every) and job.schedule.period_ms < L.MIN_EVERY_MS:
        broken.append(f"every {job.schedule.period_ms} ms")
    if o.heartbeat_ms < L.MIN_HEARTBEAT_MS:
        broken.append(f"heartbeat {o.heartbeat_ms} ms")
    if o.effective_lease_ms < L.MIN_LEASE_HEARTBEATS * o.heartbeat_ms:
        broken.append(f"lease {o.effective_lease_ms} ms")
    if job.timeout_ms is not None and job.timeout_ms < L.MIN_TIMEOUT_MS:
        broken.append(f"timeout {job.timeout_ms} ms")
    if o.jitter_ms > L.MAX_JITTER_MS:
        broken.append(f"jitter {o.jitter_ms} ms")
    if o.catch_up_window_ms < L.MIN_CATCH_UP_WINDOW_MS:
        broken.append(f"catch-up window {o.catch_up_window_ms} ms")
    return broken


def _conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (job.get("status") or {}).get("conditions") or []}


@pytest.fixture
def watched(
    cluster: Cluster, replicas_factory: Callable[[str], Replicas], tmp_path: Path
) -> Iterator[Callable[[], None]]:
    """One replica and a steady job beside the generated ones; yields a check that the replica is alive.

    At the end the steady job must have kept its runs and the replica's log must hold no
    traceback and no failed event handling (a swallowed crash is a silent death too).
    """
    replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    proc = replicas.start("replica-0")

    def alive() -> None:
        if proc.poll() is not None:
            pytest.fail(f"the operator exited with {proc.returncode}:\n{replicas.log('replica-0')[-4000:]}")

    cluster.apply(job_manifest("steady", every="2s", successfulRunsHistoryLimit=100))
    until("the steady job's first run", lambda: cluster.phases("steady")["Succeeded"] >= 1, timeout=90)
    before = cluster.phases("steady")["Succeeded"]
    started = time.monotonic()
    yield alive
    alive()
    # Every 2 s for the whole test: at least a third of the slots succeeded (a slow machine).
    expected = before + max(2, int((time.monotonic() - started) / 2 / 3))
    until(f"{expected} steady runs", lambda: cluster.phases("steady")["Succeeded"] >= expected, timeout=60)
    log = replicas.log("replica-0")
    assert "Traceback" not in log and "failed; will retry" not in log, log[-4000:]


def test_generated_specs_are_admitted_and_run_or_refused_with_the_field_named(
    cluster: Cluster, watched: Callable[[], None]
) -> None:
    counter = iter(range(10_000))
    outcomes: dict[str, int] = {"admission": 0, "scheduled": 0, "invalid": 0}

    @settings(SETTINGS, max_examples=40)
    @given(spec=SPECS)
    @example(spec={"every": "10ms"})
    @example(spec={"every": "10s", "heartbeat": "1ms", "lease": "2ms"})
    @example(spec={"every": "10s", "heartbeat": "5s", "lease": "5s1ms"})
    @example(spec={"cron": "0 8 * * *", "timeZone": "Mars/Olympus"})
    @example(spec={"cron": "61 * * * *"})
    @example(spec={"cron": "0 0 30 2 *", "timeZone": "Europe/Paris"})
    @example(spec={"every": "1s", "heartbeat": "500ms", "lease": "1s", "timeout": "1s", "jitter": "1h"})
    def check(spec: dict[str, Any]) -> None:
        name = f"gen-{next(counter)}"
        body = job_manifest(name, every=None)
        body["spec"] = {"template": body["spec"]["template"], **spec}
        res = cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(body), check=False)
        local = copy.deepcopy(body)
        local["metadata"]["namespace"] = cluster.namespace
        if res.returncode != 0:
            outcomes["admission"] += 1
            assert "spec" in res.stderr and "invalid" in res.stderr.lower(), res.stderr
            # The parser refuses what the CRD refuses: an object that skipped validation must not run.
            with pytest.raises(SpecError):
                parse_job(local)
            watched()
            return
        created = json.loads(res.stdout)
        try:
            try:
                parsed = parse_job(created)
                problems = None
            except SpecError as exc:
                parsed, problems = None, exc.messages
            generation = created["metadata"]["generation"]

            def decided() -> dict[str, Any] | None:
                job = cluster.get("anarchonjob", name) or {}
                conds = _conditions(job)
                if conds.get("Invalid", {}).get("observedGeneration") == generation:
                    return job
                return None

            job = until(f"the operator to decide on {name}: {spec}", decided, timeout=60)
            conds = _conditions(job)
            if problems is None:
                assert parsed is not None
                outcomes["scheduled"] += 1
                assert _within_limits(parsed) == [], f"scheduled past the limits: {spec}"
                assert conds["Invalid"]["status"] == "False", conds
                assert conds["Ready"]["reason"] in ("Scheduled", "Suspended"), conds
                assert job["status"]["schedule"] == schedule_column(parsed.schedule)
                assert job["status"].get("nextScheduleTime"), job["status"]
            else:
                outcomes["invalid"] += 1
                assert conds["Invalid"]["status"] == "True", conds
                assert conds["Invalid"]["message"] == "; ".join(problems)
                assert all(p.startswith("spec") for p in problems), problems
                events = [e for e in cluster.events("InvalidSpec") if e["involvedObject"]["name"] == name]
                assert events and events[0]["type"] == "Warning", events
        finally:
            cluster.kubectl("delete", "anarchonjob", name, "--wait=false", check=False)
        watched()

    check()
    print(f"generated specs: {outcomes}")
    assert all(outcomes.values()), f"each outcome should occur at least once: {outcomes}"


TRIGGERS = st.one_of(
    st.integers(-(10**3), 10**22).map(str),
    st.integers(1_700_000_000_000, 1_900_000_000_000).map(str),
    st.sampled_from(
        [
            "²",
            "١٢٣",
            "now",
            " ",
            "2027-01-15T08:00:00Z",
            "2027-01-15T09:00:00+01:00",
            "1969-12-31T23:59:59Z",
            "9999-12-31T23:59:59.999Z",
            "9999-12-31T23:59:59-01:00",
            "10000-01-01T00:00:00Z",
        ]
    ),
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20),
)


def test_generated_trigger_annotations_run_once_or_are_refused_and_always_handled(
    cluster: Cluster, watched: Callable[[], None]
) -> None:
    # History limits above the number of examples: a generated slot older than the rest (such as
    # "2534", 2.5 s after 1970) is the oldest run, so with the default limits it is pruned as soon
    # as it ends, and the check below could miss it (seen in CI).
    limits = {"successfulRunsHistoryLimit": 100, "failedRunsHistoryLimit": 100}
    cluster.apply(job_manifest("trig", every="1h", suspend=True, **limits))
    until(
        "the trigger job to be scheduled",
        lambda: ((cluster.get("anarchonjob", "trig") or {}).get("status") or {}).get("schedule") == "every 1h",
        timeout=60,
    )
    outcomes = {"run": 0, "refused": 0}

    @settings(SETTINGS, max_examples=20)
    @given(value=TRIGGERS)
    @example(value="99999999999999999999")
    @example(value="²")
    @example(value="1800000000000")
    @example(value=" now")
    @example(value="<&>")  # a JSON patch's test of it never passed: the API server escapes & < >
    def check(value: str) -> None:
        before = {int(r["spec"]["slot"]) for r in cluster.runs("trig")}
        patch = {"metadata": {"annotations": {"anarchon.io/trigger": value}}}
        cluster.kubectl("patch", "anarchonjob", "trig", "--type=merge", "-p", json.dumps(patch))
        slot = parse_trigger(value)

        def handled() -> bool:
            annotations = cluster.get("anarchonjob", "trig")["metadata"].get("annotations", {})
            trigger = annotations.get("anarchon.io/trigger")
            # "now" becomes the time a replica saw it, then is marked handled like any value.
            marked = annotations.get("anarchon.io/trigger-handled") == trigger
            return marked and (value.strip() == NOW or trigger == value)

        until(f"trigger {value!r} to be marked handled", handled, timeout=60)
        if value.strip() == NOW:
            outcomes["run"] += 1
            # A replica set the time it saw it, then claimed that slot: a new run.
            until("the run of now", lambda: {int(r["spec"]["slot"]) for r in cluster.runs("trig")} - before, timeout=60)
        elif slot is None:
            outcomes["refused"] += 1
            shown = repr(value if len(value) <= 60 else value[:57] + "...")
            events = [e for e in cluster.events("BadTrigger") if shown in e["message"]]
            assert events, f"no BadTrigger Event for {value!r}"
        else:
            outcomes["run"] += 1
            # Claimed before it is marked handled; its AnarchonRun (Skipped if one is active) follows.
            until(
                f"the run of slot {slot}",
                lambda: any(int(r["spec"]["slot"]) == slot for r in cluster.runs("trig")),
                timeout=60,
            )
        watched()

    check()
    print(f"generated triggers: {outcomes}")
    assert all(outcomes.values()), outcomes
    # The job's handler is still free: an edit is taken up.
    cluster.apply(job_manifest("trig", every="2h", suspend=True, **limits))
    until(
        "an edit after the generated triggers",
        lambda: ((cluster.get("anarchonjob", "trig") or {}).get("status") or {}).get("schedule") == "every 2h",
        timeout=60,
    )
