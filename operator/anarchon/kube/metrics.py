"""Prometheus metrics, fed by the engine's listener hooks.

Kept in one registry per process so tests can start several operators in one interpreter
without clashing on metric names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..engine import Cause, ClaimOutcome, EngineListener, Run, RunState


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.claims = Counter("anarchon_claims", "Claims sent to the store, by result", ["result"], registry=r)
        self.skew = Histogram(
            "anarchon_slot_claim_skew_seconds",
            "From a slot's scheduled time to the store's answer to the claim",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.pod_skew = Histogram(
            "anarchon_slot_pod_skew_seconds",
            "From a slot's scheduled time to the creation of its first attempt's Pod",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
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
        self.given_up = Counter(
            "anarchon_runs_given_up", "Runs ended Interrupted by this instance: no attempt was left", registry=r
        )
        self.pod_watch_up = Gauge(
            "anarchon_pod_watch_up", "1 while the Pod watch is live (else runners poll their Pods)", registry=r
        )


class MetricsListener(EngineListener):
    """Counts what the engine reports; subclasses add Events."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def claimed(self, job: str, slot: int, outcome: ClaimOutcome, delay_ms: int) -> None:
        super().claimed(job, slot, outcome, delay_ms)
        self.metrics.claims.labels(str(outcome)).inc()
        self.metrics.skew.observe(max(delay_ms, 0) / 1000)

    def skipped(self, job: str, slot: int, reason: str, cause: Cause = Cause.SCHEDULE) -> None:
        super().skipped(job, slot, reason, cause)
        self.metrics.skips.labels("overlap").inc()

    def missed(self, job: str, slot: int, reason: str) -> None:
        super().missed(job, slot, reason)
        self.metrics.skips.labels("missed").inc()

    def took_over(self, job: str, slot: int, attempt: int, previous_instance: str | None) -> None:
        super().took_over(job, slot, attempt, previous_instance)
        self.metrics.takeovers.inc()

    def finished(self, job: str, slot: int, attempt: int, outcome: RunState, error: str | None) -> None:
        super().finished(job, slot, attempt, outcome, error)
        self.metrics.runs.labels(str(outcome)).inc()

    def fenced(self, job: str, slot: int, attempt: int, reason: str) -> None:
        super().fenced(job, slot, attempt, reason)
        self.metrics.fenced.inc()

    def heartbeat_failed(self, job: str, slot: int, error: str) -> None:
        super().heartbeat_failed(job, slot, error)
        self.metrics.heartbeat_failures.inc()

    def store_error(self, operation: str, job: str, error: str) -> None:
        super().store_error(operation, job, error)
        self.metrics.store_errors.labels(operation).inc()

    def run_interrupted_final(self, run: Run) -> None:
        super().run_interrupted_final(run)
        self.metrics.given_up.inc()
