"""The chart's alerts and dashboard, checked as Prometheus and Grafana would read them.

``promcheck`` (e2e/promcheck, built by ``e2e/controlplane/build-promcheck.sh``) runs Prometheus'
own rule-file checks (``promtool check rules``: groups, expressions, durations, labels, annotation
templates) and names the metrics each expression reads, so a test can hold them against what a
replica's /metrics really serves.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.chartlib import REPO, Manifest, one, rendered

BUILD_SCRIPT = REPO / "e2e" / "controlplane" / "build-promcheck.sh"

#: What turns on every monitoring object of the chart.
MONITORING = {
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "dashboard": {"enabled": True},
    }
}

#: Grafana's own variables, set to what they could be at query time, so the query is plain PromQL.
_GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "6h"}
_LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.+),\s*\w+\)$", re.S)


def promcheck_binary() -> Path:
    """The built ``promcheck``; FAILS the test if missing (a skipped check is no check)."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], check=True, capture_output=True, text=True, timeout=30
    )
    binary = Path(out.stdout.strip().splitlines()[-1]) / "promcheck"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"promcheck is missing at {binary}: build it with `bash {BUILD_SCRIPT.relative_to(REPO)}`")
    return binary


def check_rules(spec: Mapping[str, Any]) -> dict[str, list[str]]:
    """``promtool check rules`` on a PrometheusRule's spec; expression -> the metrics it reads.

    Raises AssertionError with promcheck's messages when the rules are not valid.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(dict(spec), fh)
    try:
        res = subprocess.run([str(promcheck_binary()), "rules", fh.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(fh.name)
    if res.returncode != 0:
        raise AssertionError(f"promcheck rules: {res.stderr}")
    return {c["expr"]: c["metrics"] for c in json.loads(res.stdout)}


def check_exprs(exprs: Iterable[str]) -> dict[str, list[str]]:
    """Parse each PromQL expression as Prometheus does; expression -> the metrics it reads."""
    res = subprocess.run(
        [str(promcheck_binary()), "exprs"], input=json.dumps(list(exprs)), capture_output=True, text=True, timeout=60
    )
    if res.returncode != 0:
        raise AssertionError(f"promcheck exprs: {res.stderr}")
    return {c["expr"]: c["metrics"] for c in json.loads(res.stdout)}


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[str]:
    """Every PromQL query of a Grafana dashboard: panel targets and query variables, Grafana's variables set."""
    queries: list[str] = []

    def panels(items: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels") or [])

    for panel in panels(dashboard.get("panels") or []):
        queries += [t["expr"] for t in panel.get("targets") or []]
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = _LABEL_VALUES.match(query.strip())
            assert match, f"variable {var['name']}: not label_values(EXPR, label): {query}"
            queries.append(match["expr"])
    out = []
    for q in queries:
        for name, value in _GRAFANA_VARIABLES.items():
            q = q.replace(name, value)
        out.append(q)
    return out


def monitoring_objects(docs: list[Manifest] | None = None) -> tuple[Manifest, dict[str, Any]]:
    """The rendered PrometheusRule and the dashboard (parsed from its ConfigMap)."""
    docs = docs if docs is not None else rendered(MONITORING)
    rule = one(docs, "PrometheusRule")
    config_map = one(docs, "ConfigMap", "anarchon-dashboard")
    return rule, json.loads(config_map["data"]["anarchon.json"])


def metrics_read_by_the_chart() -> set[str]:
    """Every metric the chart's alerts and dashboard read, each expression checked by promcheck."""
    rule, dashboard = monitoring_objects()
    names: set[str] = set()
    for metrics in [*check_rules(rule["spec"]).values(), *check_exprs(dashboard_queries(dashboard)).values()]:
        names.update(metrics)
    return names


def exposed_names(text: str) -> set[str]:
    """Every series name a /metrics page can hold, from its families (a family with no sample yet counts).

    A counter ``c`` is read as ``c_total``; a histogram ``h`` as ``h_bucket``, ``h_count``, ``h_sum``.
    """
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(family.name)
    return names
