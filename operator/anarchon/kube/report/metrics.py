"""Prometheus metrics, fed by the engine's listener hooks, its store stopwatch and the jobs' status.

Kept in one registry per process so tests can start several operators in one interpreter
without clashing on metric names. Per-job series carry ``namespace`` and ``job`` and nothing
finer (no slot, run or instance label): their number grows with the jobs, not with time, and
a deleted job's series are dropped (:meth:`Metrics.forget`).

Every replica serves every job, so a per-job counter counts what happened on this replica
(sum it over the replicas); the per-job gauges come from the AnarchonJob's status, which every
replica sees alike (take the max over the replicas).
"""

from __future__ import annotations

import itertools
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ... import __version__
from ...engine import Cause, ClaimOutcome, EngineListener, Run, RunState, Schedule, StoreObserver
from ...engine.schedule import slots_between
from ..job.spec import JobSpec

#: The outcome of a slot that could not start by its starting deadline (not a run phase: no run
#: exists for it; the word is that of its Event).
MISSED = "Missed"
#: The outcome of a run ended by a newer one (overlap Replace). Its phase is Interrupted, but
#: counted as that it would look like a run given up (the AnarchonRunsGivenUp alert); the word
#: is that of its Event.
REPLACED = "Replaced"
#: Every ``outcome`` of ``anarchon_job_runs_total``, in the project's words.
JOB_OUTCOMES = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.INTERRUPTED,
    RunState.SKIPPED,
    RunState.CANCELLED,
    MISSED,
    REPLACED,
)
#: ``anarchon_job_slots_since_success`` counts no further: enough for any alert threshold, and a
#: scrape never walks a long schedule (an ``every: 1s`` job a day without success).
SLOTS_SINCE_SUCCESS_CAP = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# A ``_created`` sample beside every counter and histogram doubles the series for nothing an
# alert uses; prometheus_client emits them unless told not to, for the whole process.
disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class JobTimes:
    """What the per-job gauges are computed from, as the job's status last said it."""

    namespace: str
    name: str
    schedule: Schedule
    suspended: bool
    created_ms: int
    last_schedule_ms: int | None
    last_success_ms: int | None


def job_times(spec: JobSpec, meta: Mapping[str, Any], status: Mapping[str, Any]) -> JobTimes:
    """The gauges' inputs from a job as the watch delivered it (every replica sees the same)."""
    created = _ms(meta.get("creationTimestamp"))
    return JobTimes(
        spec.namespace,
        spec.name,
        spec.schedule,
        spec.options.suspend,
        created if created is not None else 0,
        _ms(status.get("lastScheduleTime")),
        _ms(status.get("lastSuccessfulTime")),
    )


def _ms(value: object) -> int | None:
    """Milliseconds since the epoch of an RFC3339 time; None for none, or one that does not parse."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return (parsed - _EPOCH) // timedelta(milliseconds=1)


class JobGauges(Collector):
    """The per-job gauges, computed at each scrape from the jobs this replica serves.

    A job is in it from its first valid spec to its deletion (or until its spec turns invalid),
    so a deleted job leaves no stale gauge behind.
    """

    def __init__(self, now_ms: Callable[[], int]) -> None:
        self.now_ms = now_ms
        self.jobs: dict[str, JobTimes] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["namespace", "job"]
        schedule = GaugeMetricFamily(
            "anarchon_job_last_schedule_timestamp_seconds",
            "Slot time of the job's newest run that was not Skipped (status.lastScheduleTime)",
            labels=labels,
        )
        success = GaugeMetricFamily(
            "anarchon_job_last_success_timestamp_seconds",
            "Slot time of the job's newest Succeeded run (status.lastSuccessfulTime)",
            labels=labels,
        )
        since = GaugeMetricFamily(
            "anarchon_job_slots_since_success",
            "Slots due since the newest Succeeded run (since the job's creation if none); 0 while"
            f" suspended; at most {SLOTS_SINCE_SUCCESS_CAP}",
            labels=labels,
        )
        now = self.now_ms()
        for times in list(self.jobs.values()):
            key = [times.namespace, times.name]
            if times.last_schedule_ms is not None:
                schedule.add_metric(key, times.last_schedule_ms / 1000)
            if times.last_success_ms is not None:
                success.add_metric(key, times.last_success_ms / 1000)
            since.add_metric(key, 0 if times.suspended else _slots_due(times, now))
        yield schedule
        yield success
        yield since


def _slots_due(times: JobTimes, now_ms: int) -> int:
    after = times.last_success_ms if times.last_success_ms is not None else times.created_ms
    return sum(1 for _ in itertools.islice(slots_between(times.schedule, after, now_ms), SLOTS_SINCE_SUCCESS_CAP))


class Metrics:
    def __init__(self, now_ms: Callable[[], int], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        Info("anarchon_build", "The running operator's version and Python", registry=r).info(
            {"version": __version__, "python": platform.python_version()}
        )
        self.claims = Counter("anarchon_claims", "Claims sent to the store, by result", ["result"], registry=r)
        self.skew = Histogram(
            "anarchon_slot_claim_skew_seconds",
            "From a slot's scheduled time to the store's answer to the claim",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.runs = Counter("anarchon_runs", "Attempts ended, by outcome", ["outcome"], registry=r)
        self.takeovers = Counter("anarchon_takeovers", "Runs taken over by this instance as a backup", registry=r)
        self.fenced = Counter("anarchon_fenced", "Attempts of this instance fenced off by a newer one", registry=r)
        self.skips = Counter("anarchon_skips", "Slots skipped (overlap) or missed (deadline)", ["kind"], registry=r)
        self.heartbeat_failures = Counter(
            "anarchon_heartbeat_failures", "Heartbeats that could not reach the store", registry=r
        )
        self.store_errors = Counter("anarchon_store_errors", "Store operations that failed", ["operation"], registry=r)
        self.store_latency = Histogram(
            "anarchon_store_latency_seconds",
            "Time of each store call, failed ones included, by store kind and operation",
            ["store", "operation"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.given_up = Counter(
            "anarchon_runs_given_up",
            "Runs ended Interrupted by this instance: their Pod lost once more than maxAttempts allows",
            registry=r,
        )
        self.pod_watch_up = Gauge(
            "anarchon_pod_watch_up", "1 while the Pod watch is live (else runners poll their Pods)", registry=r
        )
        self.store_not_shared = Gauge(
            "anarchon_store_not_shared",
            "Replicas seen starting runs that this replica's store does not know: above 0, the replicas do not"
            " share one store (the jobs' Ready condition says StoreNotShared)",
            registry=r,
        )
        per_job = ["namespace", "job"]
        self.job_runs = Counter(
            "anarchon_job_runs",
            "Runs of the job that ended on this replica, by outcome: Succeeded, Failed, Interrupted (no"
            " attempt left), Skipped (overlap), Cancelled (anarchon cancel), Missed (past the starting"
            " deadline; each replica counts its own)",
            [*per_job, "outcome"],
            registry=r,
        )
        self.job_pod_delay = Histogram(
            "anarchon_job_pod_delay_seconds",
            "From a slot's scheduled time to the creation of its first attempt's Pod",
            per_job,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.job_gauges = JobGauges(now_ms)
        r.register(self.job_gauges)

    def store_call(self, store: str) -> StoreObserver:
        """The engine's store observer (:func:`anarchon.engine.observed`) for a store of kind ``store``."""

        def observe(operation: str, seconds: float, _error: BaseException | None) -> None:
            self.store_latency.labels(store, operation).observe(seconds)

        return observe

    def forget(self, key: str, namespace: str, name: str) -> None:
        """Drop the series of a deleted job (engine key ``key``): a job that is gone must not linger."""
        for outcome in JOB_OUTCOMES:
            self.job_runs.remove(namespace, name, str(outcome))
        self.job_pod_delay.remove(namespace, name)
        self.job_gauges.jobs.pop(key, None)


class MetricsListener(EngineListener):
    """Counts what the engine reports; subclasses add Events and name the jobs."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def job_labels(self, job: str) -> tuple[str, str] | None:
        """``(namespace, name)`` of the engine's job ``job``; None: not counted per job.

        None here, for a job nobody named: the subclass knows the jobs it serves, and a job it
        no longer serves (deleted) gets no series again from a late report.
        """
        return None

    def _count_run(self, job: str, outcome: str) -> None:
        if (labels := self.job_labels(job)) is not None:
            self.metrics.job_runs.labels(*labels, outcome).inc()

    def claimed(self, job: str, slot: int, outcome: ClaimOutcome, delay_ms: int) -> None:
        super().claimed(job, slot, outcome, delay_ms)
        self.metrics.claims.labels(str(outcome)).inc()
        self.metrics.skew.observe(max(delay_ms, 0) / 1000)

    def skipped(self, job: str, slot: int, reason: str, cause: Cause = Cause.SCHEDULE) -> None:
        super().skipped(job, slot, reason, cause)
        self.metrics.skips.labels("overlap").inc()
        self._count_run(job, RunState.SKIPPED)

    def missed(self, job: str, slot: int, reason: str) -> None:
        super().missed(job, slot, reason)
        self.metrics.skips.labels("missed").inc()
        self._count_run(job, MISSED)

    def missed_slots(self, job: str, slots: Sequence[int], reason: str) -> None:
        super().missed_slots(job, slots, reason)
        self.metrics.skips.labels("missed").inc(len(slots))
        if (labels := self.job_labels(job)) is not None:
            self.metrics.job_runs.labels(*labels, MISSED).inc(len(slots))

    def replaced(self, job: str, slot: int, by_slot: int) -> None:
        super().replaced(job, slot, by_slot)
        self._count_run(job, REPLACED)

    def took_over(self, job: str, slot: int, attempt: int, previous_instance: str | None) -> None:
        super().took_over(job, slot, attempt, previous_instance)
        self.metrics.takeovers.inc()

    def finished(self, job: str, slot: int, attempt: int, outcome: RunState, error: str | None) -> None:
        super().finished(job, slot, attempt, outcome, error)
        self.metrics.runs.labels(str(outcome)).inc()
        if outcome is not RunState.INTERRUPTED:  # an interrupted attempt is not the run's end
            self._count_run(job, outcome)

    def fenced(self, job: str, slot: int, attempt: int, reason: str) -> None:
        super().fenced(job, slot, attempt, reason)
        self.metrics.fenced.inc()

    def heartbeat_failed(self, job: str, slot: int, error: str) -> None:
        super().heartbeat_failed(job, slot, error)
        self.metrics.heartbeat_failures.inc()

    def store_error(self, operation: str, job: str, error: str) -> None:
        super().store_error(operation, job, error)
        self.metrics.store_errors.labels(operation).inc()

    def gave_up(self, job: str, slot: int, attempt: int, reason: str) -> None:
        super().gave_up(job, slot, attempt, reason)
        self.metrics.given_up.inc()
        self._count_run(job, RunState.INTERRUPTED)

    def run_interrupted_final(self, run: Run) -> None:
        super().run_interrupted_final(run)
        self.metrics.given_up.inc()
        self._count_run(run.job, RunState.INTERRUPTED)
