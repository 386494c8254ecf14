"""The examples do what their comments say, with real operator replicas on the test control plane
(KWOK plays the kubelet; the examples' ``anarchon.test/*`` annotations set how long Pods "run")."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import yaml
from controlplane import ControlPlane

from tests.chart.chartlib import EXAMPLES, operator_process


@contextlib.contextmanager
def replicas(cp: ControlPlane, ns: str, tmp: Path, *names: str) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Operator replicas watching ``ns``, sharing one SQLite store (a lease store: takeover, overlap)."""
    with contextlib.ExitStack() as stack:
        procs = {
            name: stack.enter_context(
                operator_process(
                    cp.kubeconfig,
                    tmp / f"{name}.log",
                    f"--namespace={ns}",
                    f"--store=sqlite:///{tmp}/store.db",
                    f"--instance-id={name}",
                )
            )
            for name in names
        }
        yield procs


def runs_of(cp: ControlPlane, ns: str, job: str) -> list[dict[str, Any]]:
    out = cp.kubectl("get", "anarchonruns", "-n", ns, "-l", f"anarchon.io/job={job}", "-o", "json").stdout
    return list(json.loads(out)["items"])


def wait_for(what: str, check: Any, timeout: float, logs: Path) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted(logs.glob("*.log")))
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
        time.sleep(0.5)


def test_cron_timezone_next_run_is_0830_paris_on_a_weekday(
    cluster: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    path = EXAMPLES / "cron-timezone.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    with replicas(cluster, namespace, tmp_path, "replica-a"):
        applied = datetime.now(UTC)
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))

        def status() -> dict[str, Any] | None:
            job = json.loads(cluster.kubectl("get", "anarchonjob", name, "-n", namespace, "-o", "json").stdout)
            st: dict[str, Any] = job.get("status") or {}
            return st if st.get("nextScheduleTime") else None

        st = wait_for("status.nextScheduleTime", status, 60, tmp_path)
    paris = ZoneInfo("Europe/Paris")
    got = datetime.fromisoformat(st["nextScheduleTime"].replace("Z", "+00:00")).astimezone(paris)
    assert (got.hour, got.minute, got.second) == (8, 30, 0) and got.weekday() < 5, got
    # And it is the first such time after the status was written: no weekday 08:30 (Paris)
    # between then and it. That moment lies between `applied` and now; should 08:30 fall in
    # between, either answer is right.

    def first_after(moment: datetime) -> datetime:
        day = moment.date()
        while True:
            candidate = datetime(day.year, day.month, day.day, 8, 30, tzinfo=paris)
            if candidate.weekday() < 5 and candidate > moment:
                return candidate
            day += timedelta(days=1)

    assert got in {first_after(applied.astimezone(paris)), first_after(datetime.now(UTC).astimezone(paris))}
    ready = {c["type"]: c for c in st.get("conditions", [])}
    assert ready["Ready"]["status"] == "True", st


def test_forbid_overlap_skips_slots_while_a_run_is_active(
    cluster: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    path = EXAMPLES / "forbid-overlap.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    most_running = 0
    with replicas(cluster, namespace, tmp_path, "replica-a", "replica-b"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))

        def skipped() -> list[dict[str, Any]]:
            nonlocal most_running
            runs = runs_of(cluster, namespace, name)
            most_running = max(most_running, sum(r.get("status", {}).get("phase") == "Running" for r in runs))
            return [r for r in runs if r.get("status", {}).get("phase") == "Skipped"]

        wait_for("a Skipped run of no-overlap", skipped, 75, tmp_path)
        cluster.kubectl("delete", "anarchonjob", name, "-n", namespace)
    assert most_running == 1, "overlap: Skip, yet two runs were Running at once"


def test_long_takeover_moves_the_run_to_another_replica(cluster: ControlPlane, namespace: str, tmp_path: Path) -> None:
    path = EXAMPLES / "long-takeover.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    with replicas(cluster, namespace, tmp_path, "replica-a", "replica-b", "replica-c") as procs:
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))
        # Its slots are 5 minutes apart: ask for a run now, as `anarchon trigger` does.
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        cluster.kubectl("annotate", "--overwrite", "anarchonjob", name, "-n", namespace, f"anarchon.io/trigger={now}")

        def running() -> dict[str, Any] | None:
            for r in runs_of(cluster, namespace, name):
                st = r.get("status", {})
                if st.get("phase") == "Running" and st.get("instance"):
                    return r
            return None

        run = wait_for("a Running run of long-takeover", running, 60, tmp_path)
        victim = run["status"]["instance"]
        assert run["status"]["attempt"] == 1
        os.killpg(procs[victim].pid, signal.SIGKILL)  # a crash: no hand-over, the heartbeats just stop
        run_name = run["metadata"]["name"]

        def taken_over() -> dict[str, Any] | None:
            out = cluster.kubectl("get", "anarchonrun", run_name, "-n", namespace, "-o", "json").stdout
            st = json.loads(out).get("status", {})
            return st if st.get("instance") not in (None, "", victim) else None

        st = wait_for(f"another replica than {victim} to take {run_name} over", taken_over, 60, tmp_path)
        assert st["attempt"] >= 2, st
        assert st["phase"] in ("Claimed", "Running"), st
        cluster.kubectl("delete", "anarchonjob", name, "-n", namespace)


def test_retry_flaky_succeeds_on_its_third_try(cluster: ControlPlane, namespace: str, tmp_path: Path) -> None:
    path = EXAMPLES / "retry-flaky.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    with replicas(cluster, namespace, tmp_path, "replica-a", "replica-b"):
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))
        # Its slots are a minute apart: ask for a run now, as `anarchon trigger` does.
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        cluster.kubectl("annotate", "--overwrite", "anarchonjob", name, "-n", namespace, f"anarchon.io/trigger={now}")

        def succeeded() -> dict[str, Any] | None:
            for r in runs_of(cluster, namespace, name):
                if r.get("status", {}).get("phase") == "Succeeded":
                    return r
            return None

        # Two failed tries of 2 s, backoffs of 5 s and 10 s, a third try of 2 s: about 20 s.
        run = wait_for("a Succeeded run of flaky", succeeded, 90, tmp_path)
        st = run["status"]
        assert st["try"] == 3 and [t["outcome"] for t in st["tries"]] == ["Failed", "Failed", "Succeeded"], st
        assert st["podName"] == f"{run['metadata']['name']}-r2"
        cluster.kubectl("delete", "anarchonjob", name, "-n", namespace)
