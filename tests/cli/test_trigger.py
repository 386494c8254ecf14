"""``anarchon trigger JOB [--wait]``: a manual run; with --wait, its progress and its outcome as the exit code."""

from __future__ import annotations

import time

from tests.operator.conftest import Cluster, job_manifest

from .conftest import Cli, ok, one_line_error


def test_trigger_without_wait_only_asks(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("asked", every="1h", suspend=True))
    out = ok(cli("trigger", "asked", "--at", "2027-01-15T08:00:00Z"))
    assert out.strip() == f"anarchonjob {cluster.namespace}/asked: run of 2027-01-15T08:00:00Z requested"
    annotations = cluster.get("anarchonjob", "asked")["metadata"]["annotations"]
    assert annotations["anarchon.io/trigger"] == "2027-01-15T08:00:00Z"


def test_wait_follows_the_run_and_exits_with_its_outcome(cluster: Cluster, replicas_factory, cli: Cli, tmp_path):
    replicas_factory(f"sqlite://{tmp_path / 'store.db'}").start("replica-a")
    cluster.apply(job_manifest("works", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "3"}))
    cluster.apply(job_manifest("breaks", every="1h", suspend=True, annotations={"anarchon.test/exit-code": "3"}))

    started = time.monotonic()
    res = cli("trigger", "works", "--wait", "--at", "2027-01-15T08:00:00Z", timeout=180)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert time.monotonic() - started >= 3, "it returned before the Pod's 3 seconds were over"
    lines = res.stdout.splitlines()
    assert lines[0].endswith("run of 2027-01-15T08:00:00Z requested")
    assert lines[1].endswith("waiting for a replica to claim run works-1800000000")
    assert any(line.endswith("Running, attempt 1 on replica-a, Pod works-1800000000") for line in lines), lines
    assert lines[-1].split(" ", 1)[1].startswith("Succeeded, attempt 1 on replica-a"), lines
    assert cluster.phases("works") == {"Succeeded": 1}

    res = cli("trigger", "breaks", "--wait", "--at", "1800000000000", timeout=180)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stdout.splitlines()[-1].split(" ", 1)[1].startswith("Failed, attempt 1 on replica-a"), res.stdout
    assert res.stderr == ""


def test_wait_gives_up_after_its_timeout(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("unserved", every="1h", suspend=True))  # no replica runs
    started = time.monotonic()
    res = cli("trigger", "unserved", "--wait", "--timeout", "2s", "--at", "1800000000000")
    assert 2 <= time.monotonic() - started < 60
    one_line_error(res, 1, "anarchon trigger: run unserved-1800000000 is not over after --timeout 2s", "no replica")
    one_line_error(cli("trigger", "unserved", "--wait", "--timeout", "0s"), 2, "--timeout: must be positive")
    one_line_error(cli("trigger", "unserved", "--at", "soon"), 2, "anarchon trigger: --at 'soon' is not a time")
