"""``anarchon get``/``describe JOB`` on the real API server: conditions, recent runs, next times in its zone."""

from __future__ import annotations

import time

import yaml

from anarchon.engine.schedule import cron
from anarchon.kube.job.spec import slot_time
from tests.harness.cli import Cli, ok, ok_json, one_line_error
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def test_get_shows_conditions_recent_runs_and_next_times(cluster: Cluster, replicas_factory, cli: Cli, tmp_path):
    replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    replicas.start("replica-a")
    cluster.apply(
        job_manifest("nightly", cron="30 2 * * *", tz="Europe/Paris", annotations={"anarchon.test/exit-code": "3"})
    )
    cluster.trigger_running("nightly")
    until("the run to fail", lambda: cluster.phases("nightly")["Failed"] == 1, timeout=60)

    before = time.time_ns() // 1_000_000
    job = ok_json(cli("get", "nightly", "-o", "json", "--next", "4"))
    after = time.time_ns() // 1_000_000
    assert job["job"]["name"] == "nightly" and job["job"]["schedule"] == "30 2 * * * Europe/Paris"
    assert {c["type"]: c["status"] for c in job["conditions"]} == {"Ready": "True", "Invalid": "False"}
    (failed,) = job["runs"]
    assert failed["outcome"] == "Failed" and failed["attempts"][0]["instance"] == "replica-a"
    # The engine's slots, in a row, shown on Paris' wall clock.
    schedule = cron("30 2 * * *", "Europe/Paris")
    expected = []
    for start in (before, after):
        slots, t = [], start
        for _ in range(4):
            t = schedule.next_after(t)
            slots.append(t)
        expected.append(slots)
    assert [t["slot"] for t in job["next"]] in expected
    for t in job["next"]:
        assert t["time"] == slot_time(t["slot"])
        assert t["local"][10:] in ("T02:30:00+01:00", "T02:30:00+02:00", "T03:00:00+02:00"), t  # 03:00: spring forward
        assert t["zone"] in ("CET", "CEST")

    text = ok(cli("describe", "nightly", "--next", "3"))
    assert "Name:" in text and f"{cluster.namespace}/nightly" in text
    assert "Recent runs (1):" in text and "Failed" in text
    assert "Next 3 times:" in text and "Europe/Paris" in text
    assert yaml.safe_load(ok(cli("get", "nightly", "-o", "yaml", "--runs", "0")))["runs"] == []


def test_get_of_a_suspended_job_has_no_next_times(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("paused", every="10s", suspend=True))
    job = ok_json(cli("get", "paused", "-o", "json"))
    assert job["job"]["suspended"] is True and job["next"] == [] and job["runs"] == []
    assert job["pendingTriggers"] == []
    assert "Next times: none while suspended" in ok(cli("get", "paused"))
    one_line_error(cli("get", "absent"), 1, "anarchon get: no AnarchonJob 'absent'")


def test_get_shows_the_triggers_no_replica_took_yet(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("asked", every="1h", suspend=True))  # no replica runs: requests stay
    ok(cli("trigger", "asked", "--at", "2027-01-15T08:00:00Z"))
    cluster.kubectl("annotate", "anarchonjob", "asked", "anarchon.io/trigger=now")  # as a kubectl-only user would
    job = ok_json(cli("get", "asked", "-o", "json"))
    assert job["pendingTriggers"] == ["2027-01-15T08:00:00Z", "now"]
    text = ok(cli("get", "asked"))
    assert "Pending triggers (2):\n  2027-01-15T08:00:00Z\n  now\n" in text
