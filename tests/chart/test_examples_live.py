"""The examples do what their comments say, with real operator replicas on the test control plane
(KWOK plays the kubelet; the examples' ``anarchon.test/*`` annotations set how long Pods "run")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from tests.chart.chartlib import EXAMPLES
from tests.harness.cluster import Cluster, Replicas
from tests.harness.until import until


def replicas(factory: Callable[[str], Replicas], tmp: Path, *names: str) -> Replicas:
    """Operator replicas sharing one SQLite store (a lease store: takeover, overlap)."""
    started = factory(f"sqlite://{tmp}/store.db")
    for name in names:
        started.start(name)
    return started


def tails(replicas: Replicas) -> str:
    """The end of each replica's log, for a failure's message."""
    return "\n".join(f"== {name}\n{replicas.log(name)[-1500:]}" for name in sorted(replicas.procs))


def test_cron_timezone_next_run_is_0830_paris_on_a_weekday(
    cluster: Cluster, replicas_factory: Callable[[str], Replicas], tmp_path: Path
) -> None:
    path = EXAMPLES / "cron-timezone.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    started = replicas(replicas_factory, tmp_path, "replica-a")
    applied = datetime.now(UTC)
    cluster.kubectl("apply", "-f", str(path))

    def status() -> dict[str, Any] | None:
        st: dict[str, Any] = cluster.get("anarchonjob", name).get("status") or {}
        return st if st.get("nextScheduleTime") else None

    st = until("status.nextScheduleTime", status, timeout=60, detail=lambda: tails(started))
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
    cluster: Cluster, replicas_factory: Callable[[str], Replicas], tmp_path: Path
) -> None:
    path = EXAMPLES / "forbid-overlap.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    most_running = 0
    started = replicas(replicas_factory, tmp_path, "replica-a", "replica-b")
    cluster.kubectl("apply", "-f", str(path))

    def skipped() -> list[dict[str, Any]]:
        nonlocal most_running
        runs = cluster.runs(name)
        most_running = max(most_running, sum(r.get("status", {}).get("phase") == "Running" for r in runs))
        return [r for r in runs if r.get("status", {}).get("phase") == "Skipped"]

    until("a Skipped run of no-overlap", skipped, timeout=75, detail=lambda: tails(started))
    cluster.kubectl("delete", "anarchonjob", name)
    assert most_running == 1, "overlap: Skip, yet two runs were Running at once"


def test_long_takeover_moves_the_run_to_another_replica(
    cluster: Cluster, replicas_factory: Callable[[str], Replicas], tmp_path: Path
) -> None:
    path = EXAMPLES / "long-takeover.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    started = replicas(replicas_factory, tmp_path, "replica-a", "replica-b", "replica-c")
    cluster.kubectl("apply", "-f", str(path))
    # Its slots are 5 minutes apart: ask for a run now, as `anarchon trigger` does.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", name, f"anarchon.io/trigger={now}")

    def running() -> dict[str, Any] | None:
        for r in cluster.runs(name):
            st = r.get("status", {})
            if st.get("phase") == "Running" and st.get("instance"):
                return r
        return None

    run = until("a Running run of long-takeover", running, timeout=60, detail=lambda: tails(started))
    victim = run["status"]["instance"]
    assert run["status"]["attempt"] == 1
    started.kill(victim)  # a crash: no hand-over, the heartbeats just stop
    run_name = run["metadata"]["name"]

    def taken_over() -> dict[str, Any] | None:
        st = cluster.get("anarchonrun", run_name).get("status", {})
        return st if st.get("instance") not in (None, "", victim) else None

    st = until(f"another replica than {victim} to take {run_name} over", taken_over, detail=lambda: tails(started))
    assert st["attempt"] >= 2, st
    assert st["phase"] in ("Claimed", "Running"), st
    cluster.kubectl("delete", "anarchonjob", name)


def test_retry_flaky_succeeds_on_its_third_try(
    cluster: Cluster, replicas_factory: Callable[[str], Replicas], tmp_path: Path
) -> None:
    path = EXAMPLES / "retry-flaky.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    started = replicas(replicas_factory, tmp_path, "replica-a", "replica-b")
    cluster.kubectl("apply", "-f", str(path))
    # Its slots are a minute apart: ask for a run now, as `anarchon trigger` does.
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    cluster.kubectl("annotate", "--overwrite", "anarchonjob", name, f"anarchon.io/trigger={now}")

    def succeeded() -> dict[str, Any] | None:
        for r in cluster.runs(name):
            if r.get("status", {}).get("phase") == "Succeeded":
                return r
        return None

    # Two failed tries of 2 s, backoffs of 5 s and 10 s, a third try of 2 s: about 20 s.
    run = until("a Succeeded run of flaky", succeeded, timeout=90, detail=lambda: tails(started))
    st = run["status"]
    assert st["try"] == 3 and [t["outcome"] for t in st["tries"]] == ["Failed", "Failed", "Succeeded"], st
    assert st["podName"] == f"{run['metadata']['name']}-r2"
    cluster.kubectl("delete", "anarchonjob", name)
