"""examples/fenced-writes.yaml does what docs/workload.md says: its container's own command, run
against a real PostgreSQL with the environment a Pod gets, refuses a stale fencing token."""

from __future__ import annotations

import subprocess
from typing import Any

import psycopg
import yaml

from anarchon.kube.run.workload import fencing_token, run_env
from tests.chart.chartlib import EXAMPLES

SLOT = 1_800_000_000_000


def run_pod(postgres_url: str, attempt: int) -> subprocess.CompletedProcess[str]:
    """The example's container command, with the environment the Pod of ``attempt`` would get."""
    job = yaml.safe_load((EXAMPLES / "fenced-writes.yaml").read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {
        e["name"]: e["value"]
        for e in run_env(job="fenced-writes", run="r", slot_ms=SLOT, attempt=attempt, try_number=1)
    }
    return subprocess.run(
        container["command"],
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": postgres_url, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def report(postgres_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres_url) as conn:
        return conn.execute("SELECT body, token FROM hourly_report").fetchall()


def test_the_example_refuses_the_late_write_of_a_lost_pod(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS hourly_report")
    relaunched = run_pod(postgres_url, attempt=2)
    assert relaunched.returncode == 0, relaunched.stderr
    assert "wrote the report" in relaunched.stdout
    # The Pod of attempt 1 was given up for lost, and wakes now.
    late = run_pod(postgres_url, attempt=1)
    assert late.returncode != 0
    assert "stale fencing token" in late.stderr
    assert report(postgres_url) == [("written by attempt 2", fencing_token(SLOT, 2))]
    # The current Pod writing again (a retry inside the workload) is not refused.
    assert run_pod(postgres_url, attempt=2).returncode == 0
    assert run_pod(postgres_url, attempt=3).returncode == 0
    assert report(postgres_url) == [("written by attempt 3", fencing_token(SLOT, 3))]
