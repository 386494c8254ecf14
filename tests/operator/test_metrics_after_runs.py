"""The metrics people alert on, from a real replica's /metrics after real runs.

One replica (SQLite) runs three jobs: one that succeeds, one whose Pod fails, one whose only
attempt is lost (given up). Its /metrics must show each job's series under the job's own
namespace and name, agree with the job's status, read no finer label than the job, serve every
metric the chart's alerts and dashboard read, and drop a job's series once the job is deleted.
"""

from __future__ import annotations

import socket
import urllib.request
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from anarchon import __version__
from tests.chart.monitoring import exposed_names, metrics_read_by_the_chart
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        return str(rsp.read().decode())


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _status_s(value: Any) -> float:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def test_per_job_series_after_real_runs(cluster: Cluster, replicas_factory, tmp_path) -> None:
    port = _free_port()
    ns = cluster.namespace
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 's.db'}")
    replicas.start("metrics-0", "--metrics-port", str(port))
    cluster.apply(job_manifest("fine", every="1s"))
    cluster.apply(job_manifest("broken", every="2s", annotations={"anarchon.test/exit-code": "1"}))
    lost = {"anarchon.test/vanish-seconds": "2"}  # the Pod is deleted 2 s into its run: attempt lost
    cluster.apply(job_manifest("lost", every="1h", suspend=True, maxAttempts=1, annotations=lost))
    cluster.trigger_running("lost")
    until("fine's runs", lambda: cluster.phases("fine")["Succeeded"] >= 2, timeout=90)
    until("broken's failed run", lambda: cluster.phases("broken")["Failed"] >= 1, timeout=90)
    until("lost's run given up", lambda: cluster.phases("lost")["Interrupted"] >= 1, timeout=90)

    def job(name: str) -> dict[str, str]:
        return {"namespace": ns, "job": name}

    # The gauges follow the status through the watch, and `fine` changes it every second: wait for
    # a scrape between two reads of one same status, which the replica had seen by then.
    def agreed() -> Samples | None:
        before = cluster.get("anarchonjob", "fine")["status"]
        samples = _samples(_scrape(port))
        after = cluster.get("anarchonjob", "fine")["status"]
        times = (before["lastSuccessfulTime"], before["lastScheduleTime"])
        if times != (after["lastSuccessfulTime"], after["lastScheduleTime"]):
            return None
        gauges = (
            _value(samples, "anarchon_job_last_success_timestamp_seconds", **job("fine")),
            _value(samples, "anarchon_job_last_schedule_timestamp_seconds", **job("fine")),
        )
        runs = _value(samples, "anarchon_job_runs_total", **job("fine"), outcome="Succeeded") or 0
        return samples if runs >= 2 and gauges == tuple(map(_status_s, times)) else None

    samples = until("the time gauges to match the status", agreed, timeout=60)
    assert (_value(samples, "anarchon_job_pod_delay_seconds_count", **job("fine")) or 0) >= 2
    assert (_value(samples, "anarchon_job_slots_since_success", **job("fine")) or 0) <= 10  # it keeps succeeding

    samples = until(
        "the given-up run counted",
        lambda: (
            (s := _samples(_scrape(port)))
            and (_value(s, "anarchon_job_runs_total", **job("lost"), outcome="Interrupted") or 0) >= 1
            and s
        ),
        timeout=60,
    )
    assert (_value(samples, "anarchon_job_runs_total", **job("broken"), outcome="Failed") or 0) >= 1
    assert _value(samples, "anarchon_job_runs_total", **job("broken"), outcome="Succeeded") is None
    assert _value(samples, "anarchon_job_last_success_timestamp_seconds", **job("broken")) is None
    assert (_value(samples, "anarchon_job_slots_since_success", **job("broken")) or 0) >= 1
    assert _value(samples, "anarchon_job_slots_since_success", **job("lost")) == 0  # suspended: never overdue
    assert _value(samples, "anarchon_runs_given_up_total") == 1

    text = _scrape(port)
    build = [(n, dict(lbl)) for (n, lbl) in _samples(text) if n == "anarchon_build_info"]
    assert len(build) == 1 and build[0][1]["version"] == __version__ and build[0][1]["python"], build
    for operation in ("claim", "heartbeat", "finish", "takeover"):
        count = _value(samples, "anarchon_store_latency_seconds_count", store="sqlite", operation=operation)
        assert count is not None and count >= 1, operation
    assert "_created" not in text
    # Bounded cardinality: nothing finer than the job (no slot, run, attempt, Pod or instance label).
    labels = {name for (_n, lbl) in _samples(text) for name, _v in lbl}
    assert labels <= {"namespace", "job", "outcome", "le", "result", "kind", "operation", "store", "version", "python"}
    # Every metric the chart's alerts and dashboard read is served by the operator.
    read = metrics_read_by_the_chart()
    assert read <= exposed_names(text), read - exposed_names(text)

    cluster.kubectl("delete", "anarchonjob", "broken", "--wait=true")
    text = until(
        "the deleted job's series to go",
        lambda: t if 'job="broken"' not in (t := _scrape(port)) else "",
        detail=lambda: "\n".join(line for line in _scrape(port).splitlines() if 'job="broken"' in line),
    )
    assert 'job="fine"' in text
