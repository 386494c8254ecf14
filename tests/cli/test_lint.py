"""``anarchon lint FILE…``: offline, the operator's own checks, every problem with its field path, exit 1 on any."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.operator.conftest import Cluster, job_manifest

from .conftest import REPO, ok, one_line_error, run_cli


def write(path: Path, *docs: object) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_the_examples_are_clean() -> None:
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    out = ok(run_cli("lint", *examples))
    assert out.strip() == f"{len(examples)} job(s) in {len(examples)} file(s): no problems"


def test_every_problem_with_its_field_path(tmp_path: Path) -> None:
    bad = job_manifest("bad", cron="0 8 * * *", tz="Europe/Pariss", jitter="2h", heartbeat="100ms", maxAttempts=0)
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-ours"}}  # passed over
    path = write(tmp_path / "jobs.yaml", bad, other, job_manifest("fine", every="1m"), ["not", "an", "object"])
    res = run_cli("lint", str(path))
    assert res.returncode == 1, res
    assert res.stdout.splitlines() == [
        f"{path}: document 4: not a Kubernetes object",
        f"{path}: AnarchonJob bad: spec.timeZone: unknown time zone 'Europe/Pariss'",
        f"{path}: AnarchonJob bad: spec.jitter: must be at most 1h, got '2h': it delays every run's start by up to"
        " its value; seconds are enough to spread the claims",
        f"{path}: AnarchonJob bad: spec.heartbeat: must be at least 500ms, got '100ms': each heartbeat is a store"
        " write per running attempt",
        f"{path}: AnarchonJob bad: spec.maxAttempts: must be between 1 and 10, got 0",
        "2 job(s) in 1 file(s): 5 problem(s)",
    ]
    res = run_cli("lint", str(path), "-o", "json")
    assert res.returncode == 1
    assert [(r["job"], len(r["problems"])) for r in json.loads(res.stdout)] == [
        (None, 1),
        ("AnarchonJob bad", 4),
        ("AnarchonJob fine", 0),
    ]


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("spec: [unclosed\n")
    res = run_cli("lint", str(tmp_path / "broken.yaml"))
    assert res.returncode == 1 and f"{tmp_path / 'broken.yaml'}: not YAML: " in res.stdout
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert f"{tmp_path / 'empty.yaml'}: no AnarchonJob in it" in run_cli("lint", str(tmp_path / "empty.yaml")).stdout
    one_line_error(run_cli("lint", str(tmp_path / "absent.yaml")), 2, "anarchon lint: cannot read", "absent.yaml")
    one_line_error(run_cli("lint"), 2, "the following arguments are required: FILE")


def test_lint_says_what_the_operator_says(cluster: Cluster, replicas_factory, tmp_path: Path) -> None:
    """A job the API server admits but the operator cannot run: lint lists the problems of its Invalid condition."""
    job = job_manifest("never", cron="0 8 31 2 *", tz="Mars/Olympus_Mons")
    path = write(tmp_path / "never.yaml", job)
    (linted,) = [r for r in yaml.safe_load(run_cli("lint", str(path), "-o", "yaml").stdout) if r["job"]]
    assert len(linted["problems"]) == 2, linted
    cluster.kubectl("apply", "-f", str(path))  # admitted: the CRD cannot know zones or calendars
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")

    def invalid() -> str | None:
        conditions = ((cluster.get("anarchonjob", "never") or {}).get("status") or {}).get("conditions") or []
        return next((c["message"] for c in conditions if c["type"] == "Invalid" and c["status"] == "True"), None)

    assert cluster.wait(invalid, timeout=60, what="the Invalid condition") == "; ".join(linted["problems"])


def test_cron_shorthands(tmp_path: Path) -> None:
    """CronJob's ``@hourly`` and the rest pass; one it does not take is refused in words."""
    good = [
        job_manifest(f"j{m[1:]}", cron=m) for m in ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly")
    ]
    path = write(tmp_path / "good.yaml", *good)
    assert ok(run_cli("lint", str(path))).strip() == f"{len(good)} job(s) in 1 file(s): no problems"
    path = write(tmp_path / "bad.yaml", job_manifest("bad", cron="@every 5m"))
    res = run_cli("lint", str(path))
    assert res.returncode == 1
    assert f"{path}: AnarchonJob bad: spec.cron: '@every 5m' is not a cron expression of 5 fields" in res.stdout
    assert "or one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly" in res.stdout, res.stdout
