"""One job shared by two clusters on one store (``spec.sharedName``): one run per slot, and a spec mismatch.

Two "clusters" here are two namespaces of the test API server, each with its own replicas
(``--cluster-name east`` watching one, ``west`` the other) on one Redis: the operator knows a
cluster only by its name and what its replicas watch, and a shared job's store key is its
sharedName alone, so this is what two clusters are to it. (Two API servers: test_multicluster.py.)
Everything is checked from outside: the objects in both namespaces. Losing a cluster (its
replicas killed, its API server out of reach) and its coming back: test_multicluster.py, on two
real control planes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import ok_json, run_cli
from tests.harness.cluster import Cluster, Replicas, job_manifest, ran_here
from tests.harness.controlplane import fresh_namespace
from tests.harness.until import until

JOB = "report"
SHARED = "report.billing"
#: The store check (and so the shared-spec check) of every replica; a cluster's note lives 3 of them.
CHECK = "1s"


@dataclass
class Side:
    name: str
    cluster: Cluster
    replicas: Replicas


@pytest.fixture(scope="module")
def sides(crds: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    """east and west: a namespace each, one replica each, one Redis."""
    logs = tmp_path_factory.mktemp("shared-jobs")
    with fresh_namespace(crds, "east") as east_ns, fresh_namespace(crds, "west") as west_ns:
        made = []
        for name, ns in (("east", east_ns), ("west", west_ns)):
            replicas = Replicas(crds, ns, redis_url, Path(logs))
            replicas.start(f"{name}-1", "--cluster-name", name, "--store-check", CHECK)
            made.append(Side(name, Cluster(crds, ns), replicas))
        try:
            yield made[0], made[1]
        finally:
            for side in made:
                side.replicas.stop_all()


def _ready(side: Side) -> dict[str, Any] | None:
    job = side.cluster.get("anarchonjob", JOB) or {}
    conds = (job.get("status") or {}).get("conditions") or []
    ready = next((c for c in conds if c["type"] == "Ready"), None)
    return ready if ready is not None and ready.get("observedGeneration") == job["metadata"]["generation"] else None


def _runs(side: Side) -> list[dict[str, Any]]:
    return side.cluster.runs(JOB)


def _ran_once(sides: tuple[Side, Side], job: str) -> dict[int, str]:
    """Each slot that ran, by the cluster whose runner ran it: one only (its instance says so too)."""
    ran: dict[int, str] = {}
    for side in sides:
        for run in filter(ran_here, side.cluster.runs(job)):
            slot = int(run["spec"]["slot"])
            assert slot not in ran, f"slot {slot} ran in {ran[slot]} and in {side.name}"
            ran[slot] = side.name
            assert run["status"]["instance"].startswith(f"{side.name}/"), (side.name, run["status"])
    return ran


def _shared_job(**spec: Any) -> dict[str, Any]:
    return job_manifest(JOB, every="1s", sharedName=SHARED, successfulRunsHistoryLimit=100, **spec)


def test_each_slot_runs_once_shows_everywhere_and_a_mismatch_stops_the_side_that_differs(
    sides: tuple[Side, Side],
) -> None:
    east, west = sides
    for side in sides:
        side.cluster.apply(_shared_job())

    def succeeded() -> int:
        return sum((r.get("status") or {}).get("phase") == "Succeeded" for s in sides for r in _runs(s))

    until("8 runs succeeded across the clusters", lambda: succeeded() >= 8, timeout=90)
    ran = _ran_once(sides, JOB)

    # Where a slot ran shows in the other cluster: a light run naming that cluster, no Pod, its outcome.
    done = sorted(ran)[:-2]
    for slot in done:
        where = ran[slot]
        other = west if where == "east" else east
        name = f"{JOB}-{slot // 1000}"

        def light(other: Side = other, name: str = name) -> dict[str, Any] | None:
            run = other.cluster.get("anarchonrun", name)
            phase = ((run or {}).get("status") or {}).get("phase")
            return run if phase == "Succeeded" else None

        run = until(f"{name} to show in {other.name} as Succeeded", light, timeout=30)
        assert run["status"]["cluster"] == where
        assert run["status"]["instance"].startswith(f"{where}/") and "podName" not in run["status"], run["status"]
        assert not other.cluster.pods(f"anarchon.io/run={name}"), f"{name} has a Pod in {other.name}"
    slot = done[0]
    other = west if ran[slot] == "east" else east
    why = ok_json(
        run_cli(
            "why", JOB, "--slot", str(slot), "-o", "json",
            "-n", other.cluster.namespace, "--kubeconfig", str(other.cluster.cp.kubeconfig),
        )
    )  # fmt: skip
    assert why[0]["cluster"] == ran[slot] and f"ran in cluster {ran[slot]}" in why[0]["why"], why

    # west is edited alone: both clusters say so, and west (the later) stops starting runs.
    west.cluster.kubectl("patch", "anarchonjob", JOB, "--type=merge", "-p", '{"spec":{"every":"2s"}}')
    for side in sides:
        ready = until(
            f"{side.name} to say SharedSpecMismatch",
            lambda side=side: (r := _ready(side)) is not None and r["reason"] == "SharedSpecMismatch" and r,
            timeout=60,
        )
        assert ready["status"] == "False"
        assert "schedule: east 'every 1s', west 'every 2s'" in ready["message"], ready["message"]
        assert ("this cluster (west) starts no run" in ready["message"]) == (side is west), ready["message"]
        until(f"a SharedSpecMismatch Event in {side.name}", lambda side=side: side.cluster.events("SharedSpecMismatch"))
    stopped_ms = int(time.time() * 1000)
    until(
        "east to run 3 more slots",
        lambda: len([r for r in _runs(east) if int(r["spec"]["slot"]) > stopped_ms]) >= 3,
        timeout=60,
    )
    late = [r["metadata"]["name"] for r in _runs(west) if int(r["spec"]["slot"]) > stopped_ms and ran_here(r)]
    assert not late, f"west started runs while its spec disagreed: {late}"

    # west agrees again: both say Ready, and the slots are shared again.
    west.cluster.kubectl("patch", "anarchonjob", JOB, "--type=merge", "-p", '{"spec":{"every":"1s"}}')
    for side in sides:
        until(
            f"{side.name} to be Ready again",
            lambda side=side: (r := _ready(side)) is not None and r["status"] == "True",
            timeout=60,
        )
