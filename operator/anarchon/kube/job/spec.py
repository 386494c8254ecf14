"""Reading an AnarchonJob object into what the engine runs, and the names the operator derives.

The CRD (``crds/anarchonjobs.anarchon.io.yaml``) rejects most bad specs at admission, but
the operator checks everything again here because it cannot rely on that: objects stored
before a CRD upgrade, a cluster still carrying an older CRD, or validation ratcheting all
let through objects that the current schema refuses. Some checks exist only here, because
the apiserver cannot make them: an unknown time zone, and a cron expression with valid
characters but impossible values.

Every problem is collected before raising, so one status condition tells the user all that
is wrong instead of one field per edit. Defaults are those of the CRD (:data:`CRD_DEFAULTS`;
a test checks the two agree), so an object created without CRD defaulting runs the same.

Pure Python on purpose (no Kubernetes client): it is unit-tested without a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from anarchon.engine.durations import format_duration, parse_duration
from anarchon.engine.errors import ScheduleError
from anarchon.engine.job import JobOptions
from anarchon.engine.limits import (
    MAX_ATTEMPTS,
    MAX_HISTORY_LIMIT,
    MAX_JITTER_MS,
    MAX_RETRIES,
    MAX_RETRY_BACKOFF_MS,
    MIN_ATTEMPTS,
    MIN_CATCH_UP_WINDOW_MS,
    MIN_EVERY_MS,
    MIN_HEARTBEAT_MS,
    MIN_LEASE_HEARTBEATS,
    MIN_PENDING_TIMEOUT_MS,
    MIN_RETRY_BACKOFF_MS,
    MIN_STARTING_DEADLINE_OVER_JITTER_MS,
    MIN_TIMEOUT_MS,
)
from anarchon.engine.model import CatchUp, CrossCluster, Overlap
from anarchon.engine.schedule import Cron, Schedule, cron, every
from anarchon.engine.tries import NO_RETRIES, Retries
from anarchon.kube.constants import LABEL_PREFIX

#: Longest AnarchonJob name. Run (and Pod) names are ``<job>-<slot>``: 40 + 1 + 13 digits (a
#: slot in ms) = 54, and a retry's Pod adds ``-r<n>`` (at most 4 more): 58, within the 63
#: characters of a DNS label (Pod hostnames).
MAX_JOB_NAME_LENGTH: Final = 40
#: Longest duration string; the CRD bounds it too, which keeps the CEL rules' cost estimate low.
MAX_DURATION_LENGTH: Final = 32
#: Longest duration, in ms: Go's (and so CEL's) ~292 years; longer ones are typos, and the
#: CRD's lease/heartbeat rule fails on them at admission.
MAX_DURATION_MS: Final = (2**63 - 1) // 1_000_000
MAX_CRON_LENGTH: Final = 128
MAX_TIME_ZONE_LENGTH: Final = 64

#: Same patterns as the CRD's (checked by a test). Durations are lower-case ``<number><unit>``
#: parts with units d, h, m, s, ms in that order, each at most once (``1d12h``, ``1h30m``,
#: ``250ms``); the engine's parser alone would also accept upper case and any order. The
#: order lets the CRD's CEL rule turn a leading ``<n>d`` into hours for ``duration()``.
DURATION_PATTERN: Final = r"^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$"
#: 5 fields (minute hour day month weekday), 6 (seconds first), or one of CronJob's shorthands
#: (``@daily``: :data:`anarchon.engine.schedule.MACROS`). The CRD checks it with a CEL rule
#: (:data:`CRON_RULE`), whose message says this in words rather than quoting the pattern.
CRON_PATTERN: Final = (
    r"^\s*(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9A-Za-z*?/,#-]+(\s+[0-9A-Za-z*?/,#-]+){4,5})\s*$"
)
CRON_RULE: Final = f"self.matches(r'{CRON_PATTERN}')"
CRON_SHAPE: Final = (
    "a cron expression of 5 fields (minute hour day month weekday), 6 (seconds first),"
    " or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
)
#: ``spec.sharedName``: a DNS-subdomain-like name, the job's key in a store shared by clusters.
SHARED_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
MAX_SHARED_NAME_LENGTH: Final = 63
#: The prefix of a shared job's key in the store (:func:`engine_key`); no other key has it.
SHARED_KEY_PREFIX: Final = "shared/"
#: The shape of an IANA name (``UTC``, ``Europe/Paris``, ``America/Argentina/Buenos_Aires``).
TIME_ZONE_PATTERN: Final = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$"

#: Defaults of the CRD, by path under ``spec``. ``lease`` has none in the schema: it is 3
#: heartbeats, computed by the engine (``JobOptions.effective_lease_ms``).
CRD_DEFAULTS: Final[Mapping[str, Any]] = {
    "timeZone": "UTC",
    "jitter": "1s",
    "heartbeat": "5s",
    "overlap": "Skip",
    "catchUp.policy": "None",
    "catchUp.window": "1h",
    "retries.backoff": "10s",
    "retries.maxBackoff": "6m",
    "maxAttempts": 3,
    "suspend": False,
    "successfulRunsHistoryLimit": 3,
    "failedRunsHistoryLimit": 1,
}

_DURATION_RE = re.compile(DURATION_PATTERN)
_CRON_RE = re.compile(CRON_PATTERN)
_TIME_ZONE_RE = re.compile(TIME_ZONE_PATTERN)
_SHARED_NAME_RE = re.compile(SHARED_NAME_PATTERN)

_E = TypeVar("_E", Overlap, CatchUp, CrossCluster)


class SpecError(ValueError):
    """An AnarchonJob the operator cannot run; ``messages`` lists every problem, each led by its field path."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = list(messages)


@dataclass(frozen=True)
class JobSpec:
    """An AnarchonJob as the operator runs it: checked, defaulted, durations in ms."""

    namespace: str
    name: str
    uid: str
    generation: int
    schedule: Schedule
    options: JobOptions
    #: ``{"metadata": {"labels": {...}, "annotations": {...}}, "spec": {...}}``, plain dicts,
    #: a deep copy (safe to mutate), ``spec.restartPolicy`` always ``"Never"``.
    template: dict[str, Any]
    successful_history: int
    failed_history: int
    #: How long an attempt's Pod may stay Pending (from its creation) before the run fails; None: no bound.
    pending_timeout_ms: int | None = None
    #: How long one try's Pod may run (from its start); None: no bound. The runner enforces it
    #: (a node may not), not the engine: the engine's timer starts again with each attempt, and
    #: cannot wait for the Pod it deleted to stop.
    timeout_ms: int | None = None
    #: New Pods after a failed one (``spec.retries``); none unless asked for.
    retries: Retries = NO_RETRIES
    #: ``spec.sharedName``: one job with those of the same name in other clusters on the store.
    shared_name: str | None = None

    @property
    def max_attempts(self) -> int:
        """How often a run's Pod may be launched (maxAttempts); the parser always sets it."""
        assert self.options.max_attempts is not None
        return self.options.max_attempts

    @property
    def key(self) -> str:
        """The job's key in the store (:func:`engine_key`)."""
        return engine_key(self.namespace, self.name, self.uid, self.shared_name)

    @property
    def engine_name(self) -> str:
        """The job's name in the lease store: unique across namespaces, stable across restarts."""
        return f"{self.namespace}/{self.name}"


def _show(value: object) -> str:
    """``repr`` of a value for a message, cut short so a pasted blob cannot flood a condition."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value: Any) -> Any:
    """A deep copy made of dicts and lists only (a body may come as read-only mapping views)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _Reader:
    """Reads typed fields of one mapping, recording a message per problem instead of raising."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str, *, required: bool = False) -> Mapping[str, Any] | None:
        if value is None:
            if required:
                self.error(path, "required")
            return None
        if not isinstance(value, Mapping):
            self.error(path, f"expected an object, got {_show(value)}")
            return None
        return value

    def string(self, value: Any, path: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str):
            self.error(path, f"expected a string, got {_show(value)}")
            return None
        return value

    def required_string(self, value: Any, path: str) -> str | None:
        if value is None or value == "":
            self.error(path, "required")
            return None
        return self.string(value, path)

    def duration(
        self, value: Any, path: str, *, low: int = 0, high: int = MAX_DURATION_MS, why: str = ""
    ) -> int | None:
        """Milliseconds of a duration string, or None if absent or bad (then an error is recorded).

        ``low`` and ``high`` bound it (:mod:`anarchon.engine.limits`); ``why`` tells the user
        what the bound protects, so the message is worth more than a number.
        """
        if value is None:
            return None
        if not isinstance(value, str):
            self.error(path, f"expected a duration string such as '10s', got {_show(value)}")
            return None
        if not value or len(value) > MAX_DURATION_LENGTH or not _DURATION_RE.fullmatch(value):
            self.error(
                path,
                f"cannot parse {_show(value)}; use numbers with units d, h, m, s, ms, in that order and"
                " in lower case (e.g. '10s', '1h30m', '2d12h', '250ms')",
            )
            return None
        ms = parse_duration(value, what=path)
        if ms > MAX_DURATION_MS:
            self.error(path, f"{_show(value)} is too long (more than 292 years)")
            return None
        if ms < low or ms > high:
            bound = f"at least {format_duration(low)}" if ms < low else f"at most {format_duration(high)}"
            self.error(path, f"must be {bound}, got {_show(value)}" + (f": {why}" if why else ""))
            return None
        return ms

    def integer(self, value: Any, path: str, *, low: int, high: int | None = None) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(path, f"expected an integer, got {_show(value)}")
            return None
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"between {low} and {high}"
            self.error(path, f"must be {bounds}, got {value}")
            return None
        return value

    def boolean(self, value: Any, path: str) -> bool | None:
        if not isinstance(value, bool):
            self.error(path, f"expected true or false, got {_show(value)}")
            return None
        return value

    def enum(self, value: Any, path: str, kind: type[_E]) -> _E | None:
        allowed = [str(m) for m in kind]
        if not isinstance(value, str) or value not in allowed:
            self.error(path, f"must be one of {', '.join(allowed)}, got {_show(value)}")
            return None
        return kind(value)

    def string_map(self, value: Any, path: str) -> dict[str, str]:
        m = self.mapping(value, path)
        if m is None:
            return {}
        out: dict[str, str] = {}
        for k, v in m.items():
            if not isinstance(v, str):
                self.error(f"{path}.{k}", f"expected a string, got {_show(v)}")
            else:
                out[str(k)] = v
        return out


def _default(spec: Mapping[str, Any], key: str, default_key: str | None = None) -> Any:
    """``spec[key]``, or the CRD default when absent or null (null is pruned then defaulted by the apiserver)."""
    value = spec.get(key)
    return CRD_DEFAULTS.get(default_key or key) if value is None else value


def _parse_schedule(spec: Mapping[str, Any], r: _Reader) -> Schedule | None:
    """``every`` xor ``cron`` (+ ``timeZone``); every problem recorded, the schedule only if all is well."""
    every_value, cron_value = spec.get("every"), spec.get("cron")
    tz = r.string(_default(spec, "timeZone"), "spec.timeZone")
    tz_ok = False
    if tz is not None:
        if len(tz) > MAX_TIME_ZONE_LENGTH or not _TIME_ZONE_RE.fullmatch(tz):
            r.error("spec.timeZone", f"{_show(tz)} is not an IANA time zone name such as 'Europe/Paris'")
        else:
            try:
                ZoneInfo(tz)
                tz_ok = True
            except (ZoneInfoNotFoundError, ValueError):
                r.error("spec.timeZone", f"unknown time zone {_show(tz)}")

    if every_value is None and cron_value is None:
        r.error("spec", "set one of every (a period such as '10m') or cron (an expression such as '0 8 * * *')")
        return None
    both = every_value is not None and cron_value is not None
    if both:
        r.error("spec", "set exactly one of every and cron, not both")

    # Both fields are checked even when both are set, so that one pass reports everything.
    schedule: Schedule | None = None
    if every_value is not None:
        if not both and tz is not None and tz != "UTC":
            r.error(
                "spec.timeZone",
                f"must be UTC or unset with every, got {_show(tz)}: every counts its slots on the UTC grid;"
                " use cron for wall-clock times in a zone",
            )
        period = r.duration(
            every_value,
            "spec.every",
            low=MIN_EVERY_MS,
            why="the finest cron grain is one second too, and each slot costs a claim, an AnarchonRun and a Pod",
        )
        if period is not None:
            schedule = every(period)
    if cron_value is not None:
        schedule = _parse_cron(cron_value, tz if tz_ok else None, r)
    return None if both else schedule


def _parse_cron(value: Any, tz: str | None, r: _Reader) -> Schedule | None:
    """A :class:`Cron` in ``tz``; the expression is checked even when ``tz`` is bad (None)."""
    expression = r.string(value, "spec.cron")
    if expression is None:
        return None
    if len(expression) > MAX_CRON_LENGTH or not _CRON_RE.fullmatch(expression):
        r.error(
            "spec.cron",
            f"{_show(expression)} is not {CRON_SHAPE}",
        )
        return None
    normalized = " ".join(expression.split())
    try:
        cron(normalized, "UTC")  # the expression alone, so that a bad zone does not hide it
    except ScheduleError as exc:
        r.error("spec.cron", str(exc).removeprefix("cron: "))
        return None
    if tz is None:
        return None
    try:
        return cron(normalized, tz)  # may still never fire there: every time it names skipped by DST
    except ScheduleError as exc:
        r.error("spec.cron", str(exc).removeprefix("cron: "))
        return None


def _parse_template(spec: Mapping[str, Any], r: _Reader) -> dict[str, Any] | None:
    """The Pod template as plain dicts with ``restartPolicy: Never``, or None if it is unusable."""
    tmpl = r.mapping(spec.get("template"), "spec.template", required=True)
    if tmpl is None:
        return None
    meta = r.mapping(tmpl.get("metadata"), "spec.template.metadata") or {}
    labels = r.string_map(meta.get("labels"), "spec.template.metadata.labels")
    annotations = r.string_map(meta.get("annotations"), "spec.template.metadata.annotations")
    for key in labels:
        if key.startswith(LABEL_PREFIX):
            r.error(
                f"spec.template.metadata.labels.{key}",
                f"labels under {LABEL_PREFIX} are set by the operator (it selects its Pods by them)",
            )

    pod_spec = r.mapping(tmpl.get("spec"), "spec.template.spec", required=True)
    if pod_spec is None:
        return None
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        r.error("spec.template.spec.containers", "at least one container is required")
    else:
        for i, c in enumerate(containers):
            path = f"spec.template.spec.containers[{i}]"
            if not isinstance(c, Mapping):
                r.error(path, f"expected an object, got {_show(c)}")
                continue
            for key in ("name", "image"):
                if not isinstance(c.get(key), str) or not c.get(key):
                    r.error(f"{path}.{key}", "required (a non-empty string)")
    restart = pod_spec.get("restartPolicy")
    if restart is not None and restart != "Never":
        r.error(
            "spec.template.spec.restartPolicy",
            f"must be Never or unset, got {_show(restart)}: Anarchon forces Never, because a failed"
            " container fails its Pod, and a retry is a new Pod (spec.retries, or a new attempt after an interruption)",
        )

    out_spec: dict[str, Any] = _plain(pod_spec)
    out_spec["restartPolicy"] = "Never"
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": out_spec}


def _parse_retries(spec: Mapping[str, Any], r: _Reader) -> Retries | None:
    """``spec.retries``: absent means no retry; None if it has a problem (recorded)."""
    retries = r.mapping(spec.get("retries"), "spec.retries")
    if retries is None:
        return NO_RETRIES
    limit = retries.get("limit")
    if limit is None:
        r.error("spec.retries.limit", "required: how many new Pods may follow a failed one")
    else:
        limit = r.integer(limit, "spec.retries.limit", low=0, high=MAX_RETRIES)
    low, high = MIN_RETRY_BACKOFF_MS, MAX_RETRY_BACKOFF_MS
    why = "shorter relaunches a failing Pod in a crash loop; a retry later than that is a later slot's job"
    backoff = r.duration(
        _default(retries, "backoff", "retries.backoff"), "spec.retries.backoff", low=low, high=high, why=why
    )
    cap = r.duration(
        _default(retries, "maxBackoff", "retries.maxBackoff"), "spec.retries.maxBackoff", low=low, high=high, why=why
    )
    if backoff is not None and cap is not None and cap < backoff:
        r.error(
            "spec.retries.maxBackoff",
            f"must not be shorter than spec.retries.backoff ({format_duration(backoff)}), got {format_duration(cap)}",
        )
        return None
    if limit is None or backoff is None or cap is None:
        return None
    return Retries(limit=limit, backoff_ms=backoff, max_backoff_ms=cap)


def parse_job(body: Mapping[str, Any]) -> JobSpec:
    """Check an AnarchonJob ``body`` (as the API gives it) and turn it into a :class:`JobSpec`.

    Raises :class:`SpecError` listing every problem found, each prefixed with its field path.
    """
    errors: list[str] = []
    r = _Reader(errors)

    meta = r.mapping(body.get("metadata"), "metadata", required=True) or {}
    name = r.required_string(meta.get("name"), "metadata.name")
    if name is not None and len(name) > MAX_JOB_NAME_LENGTH:
        r.error(
            "metadata.name",
            f"must be at most {MAX_JOB_NAME_LENGTH} characters, got {len(name)}: Pod names"
            " <job>-<slot>-r<retry> must fit in 63",
        )
        name = None
    namespace = r.required_string(meta.get("namespace"), "metadata.namespace")
    uid = r.string(meta.get("uid"), "metadata.uid") or ""
    generation = meta.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int):
        r.error("metadata.generation", f"expected an integer, got {_show(generation)}")
        generation = 0

    spec = r.mapping(body.get("spec"), "spec", required=True)
    if spec is None:
        raise SpecError(errors)

    schedule = _parse_schedule(spec, r)
    jitter = r.duration(
        _default(spec, "jitter"),
        "spec.jitter",
        high=MAX_JITTER_MS,
        why="it delays every run's start by up to its value; seconds are enough to spread the claims",
    )
    heartbeat = r.duration(
        _default(spec, "heartbeat"),
        "spec.heartbeat",
        low=MIN_HEARTBEAT_MS,
        why="each heartbeat is a store write per running attempt",
    )
    lease = r.duration(spec.get("lease"), "spec.lease")
    if lease is not None and heartbeat is not None and lease < MIN_LEASE_HEARTBEATS * heartbeat:
        r.error(
            "spec.lease",
            f"must be at least {MIN_LEASE_HEARTBEATS} heartbeats ({format_duration(MIN_LEASE_HEARTBEATS * heartbeat)}"
            f" with spec.heartbeat {_default(spec, 'heartbeat')}), got {_show(spec.get('lease'))}: with less, one late"
            " heartbeat lets the lease run out under a live runner and a backup takes over a run that was fine",
        )
    overlap = r.enum(_default(spec, "overlap"), "spec.overlap", Overlap)
    # No CRD default: it matters to shared jobs only, and would be written into every job.
    cross_cluster = r.enum(spec.get("crossCluster") or CrossCluster.RELAUNCH, "spec.crossCluster", CrossCluster)

    catch_up_spec = r.mapping(spec.get("catchUp"), "spec.catchUp") or {}
    catch_up = r.enum(_default(catch_up_spec, "policy", "catchUp.policy"), "spec.catchUp.policy", CatchUp)
    window = r.duration(
        _default(catch_up_spec, "window", "catchUp.window"),
        "spec.catchUp.window",
        low=MIN_CATCH_UP_WINDOW_MS,
        why="slots are at least a second apart, so a shorter window never holds a missed slot",
    )

    starting_deadline = r.duration(spec.get("startingDeadline"), "spec.startingDeadline")
    if starting_deadline is not None and jitter is not None:
        least = jitter + MIN_STARTING_DEADLINE_OVER_JITTER_MS
        if starting_deadline < least:
            r.error(
                "spec.startingDeadline",
                f"must be at least spec.jitter ({_default(spec, 'jitter')}) plus"
                f" {format_duration(MIN_STARTING_DEADLINE_OVER_JITTER_MS)}, got {_show(spec.get('startingDeadline'))}:"
                " a run waits up to the jitter before its claim, so a shorter deadline misses slots at random",
            )
    timeout = r.duration(
        spec.get("timeout"),
        "spec.timeout",
        low=MIN_TIMEOUT_MS,
        why="it becomes the Pod's activeDeadlineSeconds, whole seconds",
    )
    pending_timeout = r.duration(
        spec.get("pendingTimeout"),
        "spec.pendingTimeout",
        low=MIN_PENDING_TIMEOUT_MS,
        why="a Pod takes that long at least to be scheduled and started",
    )
    max_attempts = r.integer(_default(spec, "maxAttempts"), "spec.maxAttempts", low=MIN_ATTEMPTS, high=MAX_ATTEMPTS)
    suspend = r.boolean(_default(spec, "suspend"), "spec.suspend")
    successful = r.integer(
        _default(spec, "successfulRunsHistoryLimit"), "spec.successfulRunsHistoryLimit", low=0, high=MAX_HISTORY_LIMIT
    )
    failed = r.integer(
        _default(spec, "failedRunsHistoryLimit"), "spec.failedRunsHistoryLimit", low=0, high=MAX_HISTORY_LIMIT
    )
    retries = _parse_retries(spec, r)
    template = _parse_template(spec, r)
    shared_name = r.string(spec.get("sharedName"), "spec.sharedName")
    if shared_name is not None and (
        len(shared_name) > MAX_SHARED_NAME_LENGTH or not _SHARED_NAME_RE.fullmatch(shared_name)
    ):
        r.error(
            "spec.sharedName",
            f"{_show(shared_name)} is not a name: use at most {MAX_SHARED_NAME_LENGTH} lower-case letters, digits,"
            " '-' and '.', starting and ending with a letter or digit (such as nightly-report.billing)",
        )

    if errors:
        raise SpecError(errors)
    # Every value below was checked above; the asserts narrow the types for mypy.
    assert name is not None and namespace is not None and schedule is not None and template is not None
    assert jitter is not None and heartbeat is not None and overlap is not None and catch_up is not None
    assert window is not None and max_attempts is not None and suspend is not None
    assert successful is not None and failed is not None and retries is not None and cross_cluster is not None
    options = JobOptions(
        jitter_ms=jitter,
        heartbeat_ms=heartbeat,
        lease_ms=lease,
        overlap=overlap,
        catch_up=catch_up,
        catch_up_window_ms=window,
        starting_deadline_ms=starting_deadline,
        max_attempts=max_attempts,
        suspend=suspend,
        # The runner counts relaunches against maxAttempts itself: a takeover that adopts a live Pod is free.
        resumable=True,
        cross_cluster=cross_cluster,
    )
    return JobSpec(
        namespace=namespace,
        name=name,
        uid=uid,
        generation=generation,
        schedule=schedule,
        options=options,
        template=template,
        successful_history=successful,
        failed_history=failed,
        pending_timeout_ms=pending_timeout,
        timeout_ms=timeout,
        retries=retries,
        shared_name=shared_name or None,
    )


def run_name(job_name: str, slot_ms: int) -> str:
    """The AnarchonRun name of one slot: ``<job>-<seconds>``, or ``<job>-<ms>`` if the slot is not whole seconds.

    Deterministic, so that every operator replica names the same run the same way and a
    create races into AlreadyExists instead of a duplicate. Seconds read better and are 10
    digits until 2286; the 13-digit millisecond form cannot collide with them before then.
    """
    if slot_ms < 0:
        raise ValueError(f"slot must not be negative, got {slot_ms}")
    return f"{job_name}-{slot_ms // 1000}" if slot_ms % 1000 == 0 else f"{job_name}-{slot_ms}"


def pod_name(run_name: str, try_number: int = 1) -> str:
    """The Pod of one try of a run: the run's own name for the first, ``<run>-r<n>`` for retry n.

    One name per try, whichever attempt launches it, makes the API server the last fence: a
    runner that froze between its last lease check and its create, long enough for a backup
    to launch, gets AlreadyExists and adopts that Pod; it can never start a second one beside
    it. A retry's Pod is a new Pod (the one before it failed and stays, with its logs).
    """
    if try_number < 1:
        raise ValueError(f"tries count from 1, got {try_number}")
    return run_name if try_number == 1 else f"{run_name}-r{try_number - 1}"


def engine_key(namespace: str, name: str, uid: str, shared_name: str | None = None) -> str:
    """The job's name in the store: a re-created object is a new job with its own history.

    A shared job's (``spec.sharedName``) is the shared name alone, the same in every cluster
    and across re-creations: the job is the clusters' together, not one object's.
    """
    return f"{SHARED_KEY_PREFIX}{shared_name}" if shared_name else f"{namespace}/{name}#{uid[:8]}"


def shared_name_of(body: Mapping[str, Any]) -> str | None:
    """``spec.sharedName`` of a job's body as the API gives it, before (or without) parsing."""
    spec = body.get("spec")
    value = spec.get("sharedName") if isinstance(spec, Mapping) else None
    return value if isinstance(value, str) and value else None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_of(rfc3339: str | None) -> int | None:
    """A time the API server wrote (RFC3339), as ms since the epoch: :func:`slot_time`'s inverse."""
    if not rfc3339:
        return None
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def slot_time(slot_ms: int) -> str:
    """A slot as RFC3339 in UTC with ``Z``; milliseconds only when the slot has some.

    Integer arithmetic (no float seconds), so the text is exact for every slot.
    """
    t = _EPOCH + timedelta(milliseconds=slot_ms)
    ms = slot_ms % 1000
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ms:03d}" if ms else "") + "Z"


def schedule_column(schedule: Schedule) -> str:
    """What the SCHEDULE column shows: ``every 10s``, or ``0 8 * * * Europe/Paris`` (no zone if UTC)."""
    if isinstance(schedule, Cron):
        return schedule.expression if schedule.tz == "UTC" else f"{schedule.expression} {schedule.tz}"
    return str(schedule)
