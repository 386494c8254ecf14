"""Two Kubernetes clusters on one PostgreSQL store: 10 shared jobs, two replicas a cluster, and the loss of one.

east is a second test control plane started here (its own etcd, API server and KWOK on other
loopback ports); west is the session's. east's replicas reach their API server through the API
fault proxy (tests/faults/apiproxy.py), so that stopping the proxy is east's API server gone from
their point of view while they live. Every invariant is read from outside the processes: the
objects in both API servers.

One scenario in steps, each building on the last (a cluster costs seconds to start):

1. steady: 10 jobs every 2 s in both clusters: at least 200 slots; each ran in one cluster, at its
   first attempt, its Pod there and none in the other, its outcome shown in the other; no slot lost;
2. every replica of east killed: the next slots run in west within a lease and a slot; a run east
   had in hand is relaunched in west (attempt 2, a greater fencing token);
3. east back: it deletes its stale Pods, shows the relaunched runs as west's, runs slots again;
4. east's API server out of its replicas' reach: the slots run in west, on time;
5. and at the end: no slot ran in two clusters, and every run's phase is its Pod's fate.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from controlplane import ControlPlane

from tests.faults.apiproxy import ApiFaultProxy
from tests.harness.cluster import Cluster, Replicas, job_manifest, ran_here
from tests.harness.controlplane import fresh_namespace, install_crds
from tests.harness.until import until

JOBS = [f"j{i:02d}" for i in range(10)]
EVERY_MS = 2_000
LEASE_MS = 4_000  # job_manifest's: heartbeat 1 s, lease 4 s, jitter 300 ms


@dataclass
class Side:
    name: str
    cluster: Cluster
    replicas: Replicas
    options: tuple[str, ...]

    def start(self) -> None:
        for n in (1, 2):
            self.replicas.start(f"{self.name}-{n}", *self.options)

    def runs(self) -> list[dict[str, Any]]:
        return list(self.cluster.get("anarchonruns")["items"])

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.cluster.get("pods")["items"]}


@pytest.fixture(scope="module")
def east_plane() -> Iterator[ControlPlane]:
    with ControlPlane(node_count=1) as cp:
        yield install_crds(cp)


@pytest.fixture(scope="module")
def east_api(east_plane: ControlPlane) -> Iterator[ApiFaultProxy]:
    with ApiFaultProxy(east_plane) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def sides(
    crds: ControlPlane,
    east_plane: ControlPlane,
    east_api: ApiFaultProxy,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Side, Side]]:
    logs = Path(tmp_path_factory.mktemp("multicluster"))
    with fresh_namespace(east_plane, "billing") as east_ns, fresh_namespace(crds, "billing") as west_ns:
        east = Side(
            "east",
            Cluster(east_plane, east_ns),
            Replicas(east_plane, east_ns, postgres_url, logs),
            ("--kubeconfig", str(east_api.kubeconfig), "--cluster-name", "east", "--store-check", "2s"),
        )
        west = Side(
            "west",
            Cluster(crds, west_ns),
            Replicas(crds, west_ns, postgres_url, logs),
            ("--cluster-name", "west", "--store-check", "2s"),
        )
        try:
            for side in (east, west):
                side.start()
            yield east, west
        finally:
            for side in (east, west):
                side.replicas.stop_all()


def _own(sides: tuple[Side, Side]) -> dict[tuple[str, int], list[tuple[str, dict[str, Any]]]]:
    """Each (job, slot) that ran, with the clusters whose runner ran it (one, unless relaunched) and its object."""
    own: dict[tuple[str, int], list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for side in sides:
        for run in filter(ran_here, side.runs()):
            own[(run["spec"]["job"], int(run["spec"]["slot"]))].append((side.name, run))
    return own


def _token(pod: dict[str, Any]) -> int:
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}
    return int(env["ANARCHON_FENCING_TOKEN"])


def _slots_after(side: Side, after_ms: int) -> set[tuple[str, int]]:
    return {(r["spec"]["job"], s) for r in side.runs() if ran_here(r) and (s := int(r["spec"]["slot"])) > after_ms}


def test_two_clusters_share_jobs_and_survive_losing_one(sides: tuple[Side, Side], east_api: ApiFaultProxy) -> None:
    east, west = sides
    for side in sides:
        items = [
            job_manifest(job, every="2s", sharedName=f"{job}.billing", successfulRunsHistoryLimit=100) for job in JOBS
        ]
        # and one run by hand only, which lasts until its Pod is deleted: a run east will have in hand
        items.append(
            job_manifest(
                "long",
                every="1h",
                suspend=True,
                sharedName="long.billing",
                annotations={"anarchon.test/run-seconds": "-1"},
            )
        )
        side.cluster.apply({"apiVersion": "v1", "kind": "List", "items": items})

    # 1. steady
    own = until("200 slots run", lambda: len(o := _own(sides)) >= 200 and o, timeout=120, interval=1)
    for (job, slot), ran in own.items():
        assert len(ran) == 1, f"{job} slot {slot} ran in {[name for name, _ in ran]}"
        name, run = ran[0]
        assert run["status"]["attempt"] == 1 and run["status"]["instance"].startswith(f"{name}/"), run["status"]
    assert {name for ran in own.values() for name, _ in ran} == {"east", "west"}
    steady = {key: ran[0][0] for key, ran in own.items()}
    for job in JOBS:
        slots = sorted(slot for j, slot in steady if j == job)
        seen = {int(r["spec"]["slot"]) for side in sides for r in side.runs() if r["spec"]["job"] == job}
        lost = set(range(slots[0], slots[-1], EVERY_MS)) - seen
        assert not lost, f"{job}: slots with no run in either cluster: {sorted(lost)}"

    # 2. every replica of east killed, with a run in hand
    long = east.cluster.trigger_running("long")["metadata"]["name"]
    east_pod = east.pods()[long]
    for n in (1, 2):
        east.replicas.kill(f"east-{n}")
    killed_ms = int(time.time() * 1000)
    until(
        "the next slot of every job to run in west",
        lambda: {job for job, _ in _slots_after(west, killed_ms + LEASE_MS)} >= set(JOBS),
        timeout=60,
        interval=1,
    )
    for job, slot in _slots_after(west, killed_ms + LEASE_MS + EVERY_MS):
        assert job == "long" or (job, slot) not in _slots_after(east, killed_ms)

    def relaunched() -> dict[str, Any] | None:
        run = west.cluster.get("anarchonrun", long) or {}
        return run if ran_here(run) and run["status"].get("attempt") == 2 and run["status"].get("podName") else None

    run = until(f"{long} to be relaunched in west", relaunched, timeout=60, interval=1)
    assert run["status"]["attempts"][0]["instance"].startswith("east/"), run["status"]
    west_pod = west.pods()[long]
    tokens = [_token(pod) for pod in (east_pod, west_pod)]
    assert tokens[1] > tokens[0], f"the relaunch must fence the lost Pod's writes: {tokens}"

    # 3. east back: its stale Pod goes, its object shows the run as west's
    east.start()
    back_ms = int(time.time() * 1000)
    until(f"east's stale Pod of {long} to go", lambda: long not in east.pods(), timeout=60, interval=1)
    until(
        f"east to show {long} as west's",
        lambda: ((east.cluster.get("anarchonrun", long) or {}).get("status") or {}).get("cluster") == "west",
        timeout=60,
        interval=1,
    )
    until("east to run slots again", lambda: len(_slots_after(east, back_ms)) >= 5, timeout=90, interval=1)

    # 4. east's API server out of its replicas' reach
    east_api.stop()
    try:
        cut_ms = int(time.time() * 1000)
        held_ms = cut_ms + 3_000 + LEASE_MS  # held back after 3 s; a run claimed just before waits two leases
        until(
            "every job's slots to run in west while east is cut off",
            lambda: {job for job, _ in _slots_after(west, held_ms + EVERY_MS)} >= set(JOBS),
            timeout=60,
            interval=1,
        )
    finally:
        east_api.start()

    # 5. no slot ran in two clusters (east shows what moved as west's), and phase = the Pod's fate
    def once() -> dict[tuple[str, int], list[tuple[str, dict[str, Any]]]] | None:
        o = _own(sides)
        return None if any(len(ran) > 1 for ran in o.values()) else o

    def twice() -> str:
        return "\n".join(
            f"{key}: " + "; ".join(f"{name} {run['status']}" for name, run in ran)
            for key, ran in _own(sides).items()
            if len(ran) > 1
        )

    own = until("every slot to have run in one cluster only", once, timeout=60, interval=1, detail=twice)
    pods = {side.name: side.pods() for side in sides}
    for (job, slot), [(name, run)] in own.items():
        phase, pod = run["status"]["phase"], run["status"].get("podName")
        if phase in ("Succeeded", "Failed"):
            assert pod in pods[name], f"{job} {slot}: {phase} in {name} without its Pod"
            assert pods[name][pod]["status"]["phase"] == phase, (job, slot, phase, pods[name][pod]["status"])
        other = "west" if name == "east" else "east"
        assert pod not in pods[other] or pods[other][pod]["metadata"]["labels"].get("anarchon.io/attempt") != str(
            run["status"]["attempt"]
        ), f"{job} {slot}: the Pod of its attempt in both clusters"
