"""Fixtures for the chart, examples and RBAC tests.

They share the harness's control plane (tests/harness, e2e/controlplane/README.md): ``crds_installed`` adds
the Prometheus Operator's CRDs, for the chart's monitoring objects, to the project's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane

from tests.chart.chartlib import kubeconform_schemas
from tests.harness.controlplane import wait_established

FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: Kinds whose OpenAPI schema must be published before the kubeconform schemas are written.
_CUSTOM_KINDS = {
    ("anarchon.io", "AnarchonJob"),
    ("anarchon.io", "AnarchonRun"),
    ("monitoring.coreos.com", "ServiceMonitor"),
    ("monitoring.coreos.com", "PrometheusRule"),
}


@pytest.fixture(scope="session")
def crds_installed(crds: ControlPlane) -> ControlPlane:
    """The project's CRDs (the harness's ``crds``) and Prometheus Operator stand-ins, Established."""
    crds.kubectl(
        "apply",
        "--server-side",
        "-f",
        str(FIXTURES / "servicemonitor-crd.yaml"),
        "-f",
        str(FIXTURES / "prometheusrule-crd.yaml"),
    )
    wait_established(crds, "servicemonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")
    return crds


@pytest.fixture(scope="session")
def schema_dir(crds_installed: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kubeconform schemas made from the test API server's OpenAPI v2 document, CRDs included."""
    deadline = time.monotonic() + 60
    while True:
        doc: dict[str, Any] = crds_installed.api("GET", "/openapi/v2")
        kinds = {
            (g.get("group", ""), g["kind"])
            for d in doc["definitions"].values()
            for g in d.get("x-kubernetes-group-version-kind", [])
        }
        if kinds >= _CUSTOM_KINDS:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"CRD schemas not published in /openapi/v2 after 60s: missing {_CUSTOM_KINDS - kinds}")
        time.sleep(0.5)
    dest = tmp_path_factory.mktemp("kubeconform-schemas")
    written = kubeconform_schemas(doc, dest)
    assert "deployment-apps-v1.json" in written and "anarchonjob-anarchon-v1alpha1.json" in written
    return dest
