"""``anarchon trigger JOB [--wait]``: a manual run; with --wait, its progress and its outcome as the exit code."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from anarchon.cli import trigger
from anarchon.kube.api.client import Kube
from anarchon.kube.constants import MAX_PENDING_TRIGGERS
from anarchon.kube.job.triggers import pending_requests, request_trigger
from tests.harness.cli import Cli, ok, one_line_error
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.controlplane import REPO
from tests.harness.until import until


def _requests(cluster: Cluster, job: str) -> dict[str, str]:
    return pending_requests(cluster.get("anarchonjob", job)["metadata"].get("annotations") or {})


def test_trigger_without_wait_only_asks(cluster: Cluster, cli: Cli) -> None:
    cluster.apply(job_manifest("asked", every="1h", suspend=True))
    out = ok(cli("trigger", "asked", "--at", "2027-01-15T08:00:00Z"))
    assert out.strip() == f"anarchonjob {cluster.namespace}/asked: run of 2027-01-15T08:00:00Z requested"
    ((key, value),) = _requests(cluster, "asked").items()
    assert key.startswith("anarchon.io/trigger.") and value == "2027-01-15T08:00:00Z"


def test_a_full_queue_is_refused(cluster: Cluster, cli: Cli) -> None:
    """On main a trigger always overwrote the one annotation: a request pending (no replica had
    seen it yet) was lost to the next. Now each is kept, up to the bound, and one more is refused."""
    cluster.apply(job_manifest("busy", every="1h", suspend=True))  # no replica runs: requests stay
    queued = {f"anarchon.io/trigger.q{n}": str(1_800_000_000_000 + n) for n in range(MAX_PENDING_TRIGGERS - 2)}
    cluster.kubectl(
        "annotate", "anarchonjob", "busy", "anarchon.io/trigger=now", *(f"{k}={v}" for k, v in queued.items())
    )
    ok(cli("trigger", "busy", "--at", "2027-01-15T08:00:00Z"))
    assert len(_requests(cluster, "busy")) == MAX_PENDING_TRIGGERS
    one_line_error(
        cli("trigger", "busy"),
        1,
        f"anarchon trigger: anarchonjob {cluster.namespace}/busy: the trigger queue is full,",
        f"{MAX_PENDING_TRIGGERS} requests pending (at most {MAX_PENDING_TRIGGERS})",
    )
    requests = _requests(cluster, "busy")
    assert len(requests) == MAX_PENDING_TRIGGERS and requests["anarchon.io/trigger"] == "now"
    assert queued.items() <= requests.items()


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


async def test_requests_written_at_once_are_all_kept(cluster: Cluster, kube: Kube) -> None:
    """Five requests added at the same moment, each onto the version of the job it read: the
    writes that meet a newer version (409) read it again, and none overwrites another."""
    cluster.apply(job_manifest("racy", every="1h", suspend=True))
    slots = [str(1_800_000_000_000 + n) for n in range(5)]
    keys = await asyncio.gather(*(request_trigger(kube, cluster.namespace, "racy", slot) for slot in slots))
    assert _requests(cluster, "racy") == dict(zip(keys, slots, strict=True))


def test_wait_gives_up_after_its_timeout(cluster: Cluster, cli: Cli) -> None:
    """``--wait`` stops after 10 minutes unless told otherwise (on main it waited for ever)."""
    parser = argparse.ArgumentParser()
    trigger.add(parser.add_subparsers())
    assert parser.parse_args(["trigger", "job", "--wait"]).timeout == 600
    assert parser.parse_args(["trigger", "job", "--wait", "--timeout", "1m30s"]).timeout == 90
    assert "default 10m" in " ".join(ok(cli("trigger", "--help")).split())

    cluster.apply(job_manifest("unserved", every="1h", suspend=True))  # no replica runs
    started = time.monotonic()
    res = cli("trigger", "unserved", "--wait", "--timeout", "2s", "--at", "1800000000000")
    assert 2 <= time.monotonic() - started < 60
    one_line_error(
        res, 1, "anarchon trigger: run unserved-1800000000 is not over after --timeout 2s: no replica has claimed it"
    )
    one_line_error(cli("trigger", "unserved", "--wait", "--timeout", "0s"), 2, "--timeout: must be positive")
    one_line_error(cli("trigger", "unserved", "--at", "soon"), 2, "anarchon trigger: --at 'soon' is not a time")


def _trigger_in_background(control_plane: Any, namespace: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    kubeconfig = str(control_plane.kubeconfig)
    return subprocess.Popen(
        [sys.executable, "-m", "anarchon", "trigger", *args, "-n", namespace, "--kubeconfig", kubeconfig],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_no_trigger_is_lost_with_three_replicas(
    cluster: Cluster, replicas_factory: Any, cli: Cli, control_plane: Any, tmp_path: Path
) -> None:
    """Every trigger that said "requested" runs, once: two sent 50 ms apart, and two sent while
    every replica was down (with a kubectl ``now`` beside them) once the replicas are back.

    On main each trigger overwrote the one annotation, and the replicas handled its newest value:
    of triggers sent while none ran, only the last ever ran.
    """
    replicas: Replicas = replicas_factory(f"sqlite://{tmp_path / 'store.db'}")
    names = ("replica-a", "replica-b", "replica-c")
    for name in names:
        replicas.start(name)
    cluster.apply(job_manifest("often", every="1h", suspend=True, overlap="Allow", successfulRunsHistoryLimit=10))
    status = lambda: (cluster.get("anarchonjob", "often") or {}).get("status") or {}  # noqa: E731
    until("the replicas to serve the job", lambda: status().get("schedule") == "every 1h", timeout=60)

    def succeeded() -> list[int]:
        return [
            int(r["spec"]["slot"]) for r in cluster.runs("often") if r.get("status", {}).get("phase") == "Succeeded"
        ]

    base = 1_800_000_000_000
    pair = []
    for slot in (base, base + 50):
        pair.append(_trigger_in_background(control_plane, cluster.namespace, "often", "--at", str(slot)))
        time.sleep(0.05)
    for proc in pair:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    until("both runs of the pair", lambda: succeeded() == [base, base + 50], timeout=60)

    for name in names:
        replicas.kill(name)
    asked = time.time_ns() // 1_000_000
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", "often", "anarchon.io/trigger=now")
    ok(cli("trigger", "often", "--at", str(base + 1_000)))
    ok(cli("trigger", "often", "--at", str(base + 2_000)))
    assert sorted(_requests(cluster, "often").values()) == [str(base + 1_000), str(base + 2_000), "now"]
    for name in names:
        replicas.start(name)
    until("the three requests sent while no replica ran", lambda: len(succeeded()) == 5, timeout=60)
    time.sleep(1)  # nothing more comes
    now, *slots = succeeded()  # "now" is when a replica first saw it: before 2027
    assert slots == [base, base + 50, base + 1_000, base + 2_000] and asked <= now < base, (now, slots)
    assert [r["status"]["attempt"] for r in cluster.runs("often")] == [1] * 5
    assert len(cluster.pods("anarchon.io/job=often")) == 5
    assert _requests(cluster, "often") == {}
