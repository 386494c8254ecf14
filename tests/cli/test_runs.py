"""``anarchon runs JOB`` on the real API server: a run taken over by a backup shows both attempts and instances."""

from __future__ import annotations

import signal

from tests.harness.cli import Cli, ok, ok_json, one_line_error
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.until import until


def test_runs_shows_attempts_instances_and_outcome(cluster: Cluster, replicas_factory, cli: Cli, tmp_path) -> None:
    replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    for name in ("replica-a", "replica-b"):
        replicas.start(name)
    cluster.apply(job_manifest("relay", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "10"}))
    run = cluster.trigger_running("relay")
    runner = run["status"]["instance"]
    (backup,) = {"replica-a", "replica-b"} - {runner}

    (open_run,) = ok_json(cli("runs", "relay", "-o", "json"))
    assert open_run["outcome"] is None and open_run["phase"] == "Running"
    assert [a["instance"] for a in open_run["attempts"]] == [runner]

    replicas.kill(runner, signal.SIGKILL)  # the backup adopts the Pod after the lease
    until("the adopted run to succeed", lambda: cluster.phases("relay")["Succeeded"] == 1, timeout=90)

    (done,) = ok_json(cli("runs", "relay", "-o", "json"))
    assert done["name"] == run["metadata"]["name"] and done["slotTime"] == "2027-01-15T08:00:00Z"
    assert done["trigger"] == "Manual" and done["outcome"] == "Succeeded"
    assert [(a["attempt"], a["instance"], a["outcome"]) for a in done["attempts"]] == [
        (1, runner, "Interrupted"),
        (2, backup, "Succeeded"),
    ]
    header, row = ok(cli("runs", "relay")).splitlines()
    assert header.split() == [
        "RUN",
        "SLOT",
        "TRIGGER",
        "PHASE",
        "ATTEMPTS",
        "TAKEOVERS",
        "INSTANCES",
        "TRIES",
        "OUTCOME",
        "MESSAGE",
    ]
    assert done["takeovers"] == 1, "the backup adopted the live Pod"
    assert row.split()[:9] == [
        done["name"],
        done["slotTime"],
        "Manual",
        "Succeeded",
        "2",
        "1",
        f"{runner},{backup}",
        "1",
        "Succeeded",
    ]


def test_runs_of_a_job_that_does_not_exist(cluster: Cluster, cli: Cli) -> None:
    line = one_line_error(cli("runs", "nope"), 1, "no AnarchonJob 'nope'", cluster.namespace, "HTTP 404")
    assert line.startswith("anarchon runs: ")
    one_line_error(cli("runs", "nope", "-o", "toml"), 2, "invalid choice: 'toml'")


def test_runs_show_the_tries_of_a_retried_run() -> None:
    """Tries (retries after a failed Pod) are on the run's line and in its record, beside attempts."""
    from anarchon.cli.records import run_record, run_rows

    run = {
        "metadata": {"name": "flaky-1800000000"},
        "spec": {"slot": 1_800_000_000_000, "trigger": "Schedule"},
        "status": {
            "phase": "Succeeded",
            "finishTime": "2027-01-15T08:01:00Z",
            "attempts": [{"attempt": 1, "instance": "replica-0", "outcome": "Succeeded"}],
            "try": 3,
            "tries": [
                {"try": 1, "podName": "flaky-1800000000", "outcome": "Failed", "message": "exit 3"},
                {"try": 2, "podName": "flaky-1800000000-r1", "outcome": "Failed", "message": "exit 3"},
                {"try": 3, "podName": "flaky-1800000000-r2", "outcome": "Succeeded"},
            ],
        },
    }
    record = run_record(run)
    assert record["try"] == 3
    assert [(t["try"], t["pod"], t["outcome"]) for t in record["tries"]] == [
        (1, "flaky-1800000000", "Failed"),
        (2, "flaky-1800000000-r1", "Failed"),
        (3, "flaky-1800000000-r2", "Succeeded"),
    ]
    headers, rows = run_rows([record])
    assert dict(zip(headers, rows[0], strict=True))["TRIES"] == "3"
