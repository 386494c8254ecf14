"""The operator's metrics, on its own registry as /metrics serves it (no replica: the logic alone).

The end-to-end check (a real replica after real runs) is tests/operator/test_metrics_after_runs.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from anarchon import __version__
from anarchon.engine import RunState, every
from anarchon.kube.report.metrics import SLOTS_SINCE_SUCCESS_CAP, JobTimes, Metrics, MetricsListener

NOW = 1_800_000_000_000  # a whole minute
JOB = {"namespace": "team-a", "job": "report"}


def _text(metrics: Metrics) -> str:
    return generate_latest(metrics.registry).decode()


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}`` as /metrics serves it (parsed: floats print as 1.8e+09)."""
    for family in text_string_to_metric_families(_text(metrics)):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def _times(**kw: object) -> JobTimes:
    base: dict[str, object] = {
        "namespace": "team-a",
        "name": "report",
        "schedule": every("10s"),
        "suspended": False,
        "created_ms": NOW - 3_600_000,
        "last_schedule_ms": NOW - 10_000,
        "last_success_ms": NOW - 30_000,
    }
    base.update(kw)
    return JobTimes(**base)  # type: ignore[arg-type]


class Named(MetricsListener):
    """The operator's listener names jobs from its specs; here every engine job is team-a/report."""

    def job_labels(self, job: str) -> tuple[str, str] | None:
        return ("team-a", "report") if job == "key-of-report" else None


def test_no_created_series_and_build_info() -> None:
    metrics = Metrics(lambda: NOW)
    listener = Named(metrics)
    listener.finished("key-of-report", NOW, 1, RunState.SUCCEEDED, None)
    metrics.store_call("sqlite")("claim", 0.002, None)
    text = _text(metrics)
    assert "_created" not in text
    assert 'anarchon_build_info{python="' in text and f'version="{__version__}"}} 1.0' in text


def test_slots_since_success_counts_due_slots_from_the_last_success() -> None:
    metrics = Metrics(lambda: NOW)
    metrics.job_gauges.jobs["k"] = _times()  # success 30 s ago, every 10 s: 3 slots due since (-20, -10, 0)
    text = _text(metrics)
    assert 'anarchon_job_slots_since_success{job="report",namespace="team-a"} 3.0' in text
    assert _value(metrics, "anarchon_job_last_success_timestamp_seconds", **JOB) == (NOW - 30_000) / 1000
    assert _value(metrics, "anarchon_job_last_schedule_timestamp_seconds", **JOB) == (NOW - 10_000) / 1000


def test_slots_since_success_without_a_success_counts_from_creation_up_to_the_cap() -> None:
    metrics = Metrics(lambda: NOW)
    metrics.job_gauges.jobs["k"] = _times(last_success_ms=None, last_schedule_ms=None, created_ms=NOW - 25_000)
    text = _text(metrics)  # created 25 s ago: slots -20 s, -10 s and now are due
    assert 'anarchon_job_slots_since_success{job="report",namespace="team-a"} 3.0' in text
    assert "anarchon_job_last_success_timestamp_seconds{" not in text  # unknown, not 0 (1970)
    metrics.job_gauges.jobs["k"] = _times(last_success_ms=None, created_ms=NOW - 86_400_000)  # a day: 8640 slots
    assert f'anarchon_job_slots_since_success{{job="report",namespace="team-a"}} {SLOTS_SINCE_SUCCESS_CAP}.0' in _text(
        metrics
    )


def test_a_suspended_job_is_not_overdue() -> None:
    metrics = Metrics(lambda: NOW)
    metrics.job_gauges.jobs["k"] = _times(suspended=True, last_success_ms=NOW - 3_600_000)
    assert 'anarchon_job_slots_since_success{job="report",namespace="team-a"} 0.0' in _text(metrics)


def test_per_job_runs_by_outcome_and_an_interrupted_attempt_is_not_a_run_end() -> None:
    metrics = Metrics(lambda: NOW)
    listener = Named(metrics)
    listener.finished("key-of-report", NOW, 1, RunState.SUCCEEDED, None)
    listener.finished("key-of-report", NOW + 10_000, 1, RunState.FAILED, "exit 1")
    listener.finished("key-of-report", NOW + 20_000, 1, RunState.INTERRUPTED, "Pod deleted")  # attempt 2 follows
    listener.skipped("key-of-report", NOW + 30_000, "overlap")
    listener.missed("key-of-report", NOW + 40_000, "past the starting deadline")
    listener.replaced("key-of-report", NOW + 40_000, NOW + 50_000)  # overlap Replace: ended, not given up
    listener.finished("key-of-report", NOW + 60_000, 2, RunState.CANCELLED, "cancelled by alice: wrong input")
    listener.finished("key-of-gone-job", NOW, 1, RunState.SUCCEEDED, None)  # a job nobody names: no series
    text = _text(metrics)
    series = 'anarchon_job_runs_total{{job="report",namespace="team-a",outcome="{}"}} 1.0'
    for outcome in ("Succeeded", "Failed", "Skipped", "Missed", "Replaced", "Cancelled"):
        assert series.format(outcome) in text, outcome
    assert _value(metrics, "anarchon_job_runs_total", **JOB, outcome="Interrupted") is None
    assert text.count("anarchon_job_runs_total{") == 6


def test_forget_drops_every_series_of_the_job_and_only_its() -> None:
    metrics = Metrics(lambda: NOW)
    listener = Named(metrics)
    listener.finished("key-of-report", NOW, 1, RunState.SUCCEEDED, None)
    listener.missed("key-of-report", NOW, "late")
    listener.finished("key-of-report", NOW, 1, RunState.CANCELLED, "cancelled")
    metrics.job_pod_delay.labels("team-a", "report").observe(0.5)
    metrics.job_pod_delay.labels("team-a", "other").observe(0.5)
    metrics.job_gauges.jobs["k"] = _times()
    metrics.job_gauges.jobs["k2"] = _times(name="other")
    metrics.forget("k", "team-a", "report")
    text = _text(metrics)
    assert 'job="report"' not in text, text
    assert 'anarchon_job_pod_delay_seconds_count{job="other",namespace="team-a"} 1.0' in text
    assert 'anarchon_job_slots_since_success{job="other",namespace="team-a"}' in text


def test_store_latency_by_store_and_operation() -> None:
    metrics = Metrics(lambda: NOW)
    observe = metrics.store_call("redis")
    observe("claim", 0.003, None)
    observe("heartbeat", 0.2, ConnectionError("reset"))
    text = _text(metrics)
    assert 'anarchon_store_latency_seconds_count{operation="claim",store="redis"} 1.0' in text
    assert 'anarchon_store_latency_seconds_bucket{le="0.25",operation="heartbeat",store="redis"} 1.0' in text
    assert 'anarchon_store_latency_seconds_bucket{le="0.1",operation="heartbeat",store="redis"} 0.0' in text


def test_docs_table_every_served_metric_and_nothing_else() -> None:
    """docs/metrics.md lists exactly the metrics the operator serves (a new or renamed one must be documented)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(anarchon_\w+)", doc, re.M))
    served = set()
    for family in text_string_to_metric_families(_text(Metrics(lambda: NOW))):
        served.add(f"{family.name}_total" if family.type == "counter" else family.name)
    assert documented == served, (documented - served, served - documented)


def test_slots_missed_together_count_each_slot_once() -> None:
    """One report of 3,599 missed slots (an hour down, catch-up Latest) counts 3,599 Missed runs."""
    metrics = Metrics(lambda: NOW)
    listener = Named(metrics)
    listener.missed_slots("key-of-report", [NOW + 1000 * i for i in range(1, 3600)], "missed while no instance ran")
    listener.missed("key-of-report", NOW + 3_601_000, "past the starting deadline")
    assert _value(metrics, "anarchon_job_runs_total", **JOB, outcome="Missed") == 3600
