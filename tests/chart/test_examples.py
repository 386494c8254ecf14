"""examples/: each example is a valid AnarchonJob for the API server (CRD schema and CEL rules), and
the promised scenarios are there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from controlplane import ControlPlane

from tests.chart.chartlib import EXAMPLES, kubeconform

EXPECTED = {
    "cron-timezone.yaml",
    "every-10s.yaml",
    "fenced-writes.yaml",
    "forbid-overlap.yaml",
    "long-takeover.yaml",
    "shared-report.yaml",
}
#: Every file, not only *.yaml: each must be an example that applies.
FILES = sorted(p for p in EXAMPLES.iterdir() if p.is_file())


def test_the_promised_examples_exist() -> None:
    # A set: a list compares by its first difference, so a new example sorted in refused the test.
    assert {p.name for p in FILES} >= EXPECTED


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_shape(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1
    job = docs[0]
    assert job["apiVersion"] == "anarchon.io/v1alpha1" and job["kind"] == "AnarchonJob"
    assert "namespace" not in job["metadata"], "examples apply to the namespace given with kubectl -n"
    assert len(job["metadata"]["name"]) <= 40
    assert path.read_text().startswith("#"), "each example starts with a comment saying what it shows"


def test_examples_show_their_scenarios() -> None:
    def spec(name: str) -> dict[str, object]:
        return dict(yaml.safe_load((EXAMPLES / name).read_text())["spec"])

    assert spec("every-10s.yaml")["every"] == "10s"
    cron = spec("cron-timezone.yaml")
    assert "cron" in cron and cron["timeZone"] not in (None, "UTC")
    assert spec("forbid-overlap.yaml")["overlap"] == "Skip"
    shared = spec("shared-report.yaml")
    assert shared["sharedName"] and shared["crossCluster"] == "Relaunch"
    long = spec("long-takeover.yaml")
    assert {"heartbeat", "lease", "maxAttempts"} <= long.keys()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_api_server(path: Path, crds_installed: ControlPlane, namespace: str) -> None:
    res = crds_installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert "(server dry run)" in res.stdout
    # Really create it, and read it back with the CRD's defaults applied.
    crds_installed.kubectl("apply", "-n", namespace, "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = json.loads(crds_installed.kubectl("get", "anarchonjob", name, "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["timeZone"]  # defaulted (UTC) or given
    assert stored["spec"]["maxAttempts"] >= 1
    crds_installed.kubectl("delete", "anarchonjob", name, "-n", namespace)


def test_a_broken_example_is_refused(crds_installed: ControlPlane, namespace: str) -> None:
    """The check above can fail: both every and cron set is refused by the CRD's CEL rule."""
    job = yaml.safe_load((EXAMPLES / "every-10s.yaml").read_text())
    job["spec"]["cron"] = "* * * * *"
    res = crds_installed.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(job), check=False
    )
    assert res.returncode != 0
    assert "exactly one of spec.every and spec.cron" in res.stderr, res.stderr


def test_examples_pass_kubeconform_against_the_crd_schemas(schema_dir: Path) -> None:
    """Offline too: the CRDs' OpenAPI schemas, as the API server publishes them, accept every example."""
    res = kubeconform(FILES, schema_dir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Valid: {len(FILES)}, Invalid: 0, Errors: 0, Skipped: 0" in res.stdout, res.stdout


def test_examples_pass_lint() -> None:
    """``anarchon lint examples/``, offline, as the README suggests for any job: no problem in any."""
    res = subprocess.run(
        [sys.executable, "-m", "anarchon", "lint", str(EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(EXAMPLES.parent / "operator")},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(FILES)} job(s) in {len(FILES)} file(s): no problems" in res.stdout, res.stdout
