"""The chart's opt-in monitoring: a Grafana dashboard ConfigMap and a PrometheusRule.

Each alert is checked as ``promtool check rules`` checks it (Prometheus' own packages, see
monitoring.py), each dashboard query is parsed as Prometheus parses it, and every metric either
reads must be one the operator serves. That last check runs here against the operator's own
registry (what /metrics serves) and again in tests/operator/test_metrics_after_runs.py against a live replica.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import generate_latest

from anarchon.kube.report.metrics import Metrics
from tests.chart.chartlib import find, one, render, rendered
from tests.chart.monitoring import (
    MONITORING,
    check_exprs,
    check_rules,
    dashboard_queries,
    exposed_names,
    metrics_read_by_the_chart,
    monitoring_objects,
)

ALERTS = {
    "AnarchonJobNotSucceeding",
    "AnarchonRunsGivenUp",
    "AnarchonStoreErrors",
    "AnarchonPodWatchDown",
    "AnarchonStoreNotShared",
}


def test_off_by_default() -> None:
    docs = rendered()
    assert not find(docs, "PrometheusRule")
    assert not [d for d in find(docs, "ConfigMap") if "anarchon.json" in (d.get("data") or {})]


def test_dashboard_config_map_for_the_grafana_sidecar() -> None:
    docs = rendered(
        {
            "metrics": {
                "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "Ops"}}
            }
        }
    )
    cm = one(docs, "ConfigMap", "anarchon-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Ops"}
    dashboard = json.loads(cm["data"]["anarchon.json"])
    assert dashboard["uid"] == "anarchon" and dashboard["title"] == "Anarchon"
    # Every panel reads the data source the user picks, not one named in the file.
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_dashboard_queries_parse_and_read_only_metrics_the_operator_serves() -> None:
    _rule, dashboard = monitoring_objects()
    queries = dashboard_queries(dashboard)
    checked = check_exprs(queries)
    assert set(checked) == set(queries)
    served = exposed_names(generate_latest(Metrics(lambda: 0).registry).decode())
    read = {name for names in checked.values() for name in names}
    assert read and read <= served, read - served
    for per_job in ("anarchon_job_runs_total", "anarchon_job_pod_delay_seconds_bucket"):
        assert per_job in read


def test_prometheus_rule_passes_promtool_checks_and_reads_only_served_metrics() -> None:
    rule, _dashboard = monitoring_objects(
        rendered(
            {
                **MONITORING,
                "metrics": {**MONITORING["metrics"], "prometheusRule": _rule_values(labels={"release": "prometheus"})},
            }
        )
    )
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == ALERTS
    assert alerts["AnarchonJobNotSucceeding"]["expr"].endswith(">= 5")
    assert alerts["AnarchonJobNotSucceeding"]["for"] == "15m"
    checked = check_rules(rule["spec"])
    assert len(checked) == len(ALERTS)
    served = exposed_names(generate_latest(Metrics(lambda: 0).registry).decode())
    read = {name for names in checked.values() for name in names}
    assert read <= served, read - served
    assert metrics_read_by_the_chart() <= served


def _rule_values(**extra: Any) -> dict[str, Any]:
    return {"enabled": True, "notSucceededSlots": 5, "for": "15m", **extra}


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ({"expr": "sum(rate(anarchon_store_errors_total[5m]) > 0"}, "unclosed left parenthesis"),
        ({"annotations": {"description": "{{ $labels.job "}}, "template"),
        ({"for": "five minutes"}, "not a valid duration"),
    ],
    ids=["expression", "annotation template", "duration"],
)
def test_promcheck_refuses_a_broken_rule(broken: dict[str, Any], message: str) -> None:
    """The check can fail: each kind of mistake promtool reports is reported here too."""
    rule, _dashboard = monitoring_objects()
    spec = rule["spec"]
    spec["groups"][0]["rules"][0].update(broken)
    with pytest.raises(AssertionError, match=message):
        check_rules(spec)


def test_service_monitor_keeps_the_jobs_own_namespace_and_job_labels() -> None:
    """Without honorLabels, Prometheus renames them exported_namespace / exported_job and the alerts break."""
    sm = one(rendered(MONITORING), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"notSucceededSlots": 0}, "/metrics/prometheusRule/notSucceededSlots"),
        ({"notSucceededSlots": 101}, "/metrics/prometheusRule/notSucceededSlots"),
        ({"for": "5 minutes"}, "/metrics/prometheusRule/for"),
        ({"severty": "page"}, "severty"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else "",
)
def test_invalid_rule_values_are_rejected(values: dict[str, Any], message: str) -> None:
    res = render({"metrics": {"prometheusRule": values}}, check=False)
    assert res.returncode != 0, f"rendered although invalid: {values}"
    assert message in res.stderr, res.stderr
