"""``anarchon next FILE|JOB``: the engine's next times on the job's wall clock, clock changes marked."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from anarchon.engine.schedule import every
from tests.harness.cli import Cli, ok, ok_json, one_line_error, run_cli
from tests.harness.cluster import Cluster, job_manifest


def job_file(tmp_path: Path, name: str, **spec: str) -> Path:
    """A file with one AnarchonJob ``name``, with no namespace (as most manifests are)."""
    path = tmp_path / f"{name}.yaml"
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    body = {"apiVersion": "anarchon.io/v1alpha1", "kind": "AnarchonJob", "metadata": {"name": name}}
    path.write_text(yaml.safe_dump({**body, "spec": {**spec, "template": template}}))
    return path


def test_spring_forward_in_paris(tmp_path: Path) -> None:
    """02:30 does not exist on 2027-03-28 in Paris: the engine runs it at 03:00 CEST, and the change is marked."""
    path = job_file(tmp_path, "nightly", cron="30 2 * * *", timeZone="Europe/Paris")
    # HOME has no kubeconfig: the namespace is "default", and nothing is said about it on stderr.
    res = run_cli("next", str(path), "-c", "3", "--after", "2027-03-26T12:00:00Z", cwd=tmp_path, HOME=str(tmp_path))
    assert res.stderr == ""
    assert ok(res).splitlines() == [
        "default/nightly: 30 2 * * * Europe/Paris",
        "LOCAL                       ZONE   UTC                    CLOCK CHANGE",
        "2027-03-27T02:30:00+01:00   CET    2027-03-27T01:30:00Z",
        "2027-03-28T03:00:00+02:00   CEST   2027-03-28T01:00:00Z   CET (+01:00) -> CEST (+02:00)",
        "2027-03-29T02:30:00+02:00   CEST   2027-03-29T00:30:00Z",
    ]


def test_fall_back_in_new_york_runs_through_the_repeated_hour(tmp_path: Path) -> None:
    path = job_file(tmp_path, "quarter", cron="*/15 * * * *", timeZone="America/New_York")
    (job,) = ok_json(run_cli("next", str(path), "-c", "4", "--after", "2027-11-07T05:35:00Z", "-o", "json"))
    assert [(t["local"], t["clockChange"]) for t in job["next"]] == [
        ("2027-11-07T01:45:00-04:00", None),
        ("2027-11-07T01:00:00-05:00", "EDT (-04:00) -> EST (-05:00)"),  # 01:00 again, an hour later
        ("2027-11-07T01:15:00-05:00", None),
        ("2027-11-07T01:30:00-05:00", None),
    ]
    assert [t["time"] for t in job["next"]] == [
        "2027-11-07T05:45:00Z",
        "2027-11-07T06:00:00Z",
        "2027-11-07T06:15:00Z",
        "2027-11-07T06:30:00Z",
    ]


def test_next_of_a_job_on_the_api_server(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("tick", every="10s", suspend=True))
    before = time.time_ns() // 1_000_000
    (job,) = ok_json(cli("next", "tick", "-c", "3", "-o", "json"))
    after = time.time_ns() // 1_000_000
    assert job["suspended"] is True and job["timeZone"] == "UTC" and job["schedule"] == "every 10s"
    slots = [t["slot"] for t in job["next"]]
    first = {every("10s").next_after(t) for t in (before, after)}
    assert slots[0] in first and slots == [slots[0], slots[0] + 10_000, slots[0] + 20_000]
    assert "(suspended: these slots do not run" in ok(cli("next", "tick", "-c", "1")).splitlines()[0]
    one_line_error(cli("next", "missing"), 1, "anarchon next: no AnarchonJob 'missing'")


def test_bad_usage_and_invalid_jobs(tmp_path: Path) -> None:
    path = job_file(tmp_path, "mars", cron="0 8 * * *", timeZone="Mars/Olympus_Mons")
    one_line_error(run_cli("next", str(path)), 1, f"{path}: AnarchonJob mars is invalid: spec.timeZone: ")
    good = job_file(tmp_path, "good", every="1m")
    one_line_error(run_cli("next", str(good), "-c", "0"), 2, "--count/-c", "from 1 to 1000")
    one_line_error(run_cli("next", str(good), "--after", "soon"), 2, "--after 'soon' is not a time")


def test_a_cron_shorthand_runs_at_the_times_of_its_fields(tmp_path: Path) -> None:
    """``@daily`` (as a CronJob takes it) is midnight on the zone's wall clock."""
    path = job_file(tmp_path, "nightly", cron="@daily", timeZone="Europe/Paris")
    res = run_cli("next", str(path), "--count", "3", "--after", "2027-03-26T12:00:00Z", HOME=str(tmp_path))
    assert ok(res).splitlines() == [
        "default/nightly: @daily Europe/Paris",
        "LOCAL                       ZONE   UTC                    CLOCK CHANGE",
        "2027-03-27T00:00:00+01:00   CET    2027-03-26T23:00:00Z",
        "2027-03-28T00:00:00+01:00   CET    2027-03-27T23:00:00Z",
        "2027-03-29T00:00:00+02:00   CEST   2027-03-28T22:00:00Z   CET (+01:00) -> CEST (+02:00)",
    ]
