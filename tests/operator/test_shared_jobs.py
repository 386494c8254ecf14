"""One job shared by two clusters on one store (``spec.sharedName``): one run per slot, and a spec mismatch.

Two "clusters" here are two namespaces of the test API server, each with its own replicas
(``--cluster-name east`` watching one, ``west`` the other) on one Redis: the operator knows a
cluster only by its name and what its replicas watch, and a shared job's store key is its
sharedName alone, so this is what two clusters are to it. (Two API servers: test_multicluster.py.)
Everything is checked from outside: the objects in both namespaces.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.faults.apiproxy import ApiFaultProxy
from tests.harness.cli import ok_json, run_cli
from tests.harness.cluster import Cluster, Replicas, job_manifest
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
    #: The options of its replicas (east's reach the API server through a fault proxy).
    options: tuple[str, ...]


@pytest.fixture(scope="module")
def east_api(crds: Any) -> Iterator[ApiFaultProxy]:
    """east's API server as east's replicas reach it: stopping it cuts them off, as an outage would."""
    with ApiFaultProxy(crds) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def sides(
    crds: Any, redis_url: str, east_api: ApiFaultProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Side, Side]]:
    """east and west: a namespace each, one replica each, one Redis."""
    logs = tmp_path_factory.mktemp("shared-jobs")
    with fresh_namespace(crds, "east") as east_ns, fresh_namespace(crds, "west") as west_ns:
        made = []
        for name, ns, api in (("east", east_ns, ["--kubeconfig", str(east_api.kubeconfig)]), ("west", west_ns, [])):
            side = Side(
                name,
                Cluster(crds, ns),
                Replicas(crds, ns, redis_url, Path(logs)),
                (*api, "--cluster-name", name, "--store-check", CHECK),
            )
            side.replicas.start(f"{name}-1", *side.options)
            made.append(side)
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


def _ran_here(run: dict[str, Any]) -> bool:
    """The run ran in the cluster whose object this is: neither a light run of another nor a Skipped slot."""
    status = run.get("status") or {}
    return status.get("phase") not in (None, "Skipped") and not status.get("cluster")


def _ran_once(sides: tuple[Side, Side], job: str) -> dict[int, str]:
    """Each slot that ran, by the cluster whose runner ran it: one only (its instance says so too)."""
    ran: dict[int, str] = {}
    for side in sides:
        for run in filter(_ran_here, side.cluster.runs(job)):
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
    assert {ran[slot] for slot in done} == {"east", "west"}, "one cluster ran every slot"
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
    late = [r["metadata"]["name"] for r in _runs(west) if int(r["spec"]["slot"]) > stopped_ms and _ran_here(r)]
    assert not late, f"west started runs while its spec disagreed: {late}"

    # west agrees again: both say Ready, and the slots are shared again.
    west.cluster.kubectl("patch", "anarchonjob", JOB, "--type=merge", "-p", '{"spec":{"every":"1s"}}')
    for side in sides:
        until(
            f"{side.name} to be Ready again",
            lambda side=side: (r := _ready(side)) is not None and r["status"] == "True",
            timeout=60,
        )


def _token(side: Side, run: str) -> int:
    """The fencing token of the run's (first try's) Pod in ``side``."""
    pod = side.cluster.get("pod", run)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}
    return int(env["ANARCHON_FENCING_TOKEN"])


def test_a_lost_cluster_run_is_relaunched_in_the_other_and_it_takes_part_again(sides: tuple[Side, Side]) -> None:
    """east dies with a run in hand: west relaunches it (greater token) and runs the next slots;
    east comes back, deletes its stale Pod, shows the run as west's, and no slot has run twice."""
    east, west = sides
    job = "relay"
    manifest = job_manifest(
        job,
        every="2s",
        sharedName="relay.billing",
        overlap="Allow",  # slots go on while the runs last
        successfulRunsHistoryLimit=100,
        annotations={"anarchon.test/run-seconds": "25"},
    )
    for side in sides:
        side.cluster.apply(manifest)

    def running_in_east() -> dict[str, Any] | None:
        return next((r for r in east.cluster.runs(job) if _ran_here(r) and r["status"]["phase"] == "Running"), None)

    lost = until("a run of east's running", running_in_east, timeout=60)
    east.replicas.kill("east-1")  # every replica of east: gone, its Pods live on
    killed_ms = int(time.time() * 1000)
    name = lost["metadata"]["name"]
    east_token = _token(east, name)

    def relaunched() -> dict[str, Any] | None:
        run = west.cluster.get("anarchonrun", name) or {}
        status = run.get("status") or {}
        return run if status.get("attempt") == 2 and not status.get("cluster") and status.get("podName") else None

    run = until(f"{name} relaunched in west", relaunched, timeout=60)
    assert run["status"]["instance"] == "west/west-1", run["status"]
    assert _token(west, name) > east_token, "the relaunch must fence the lost Pod's writes"
    # The next slots run in west, from a lease (4 s) after the kill on.
    until(
        "west to run 3 slots after the kill",
        lambda: len([r for r in west.cluster.runs(job) if _ran_here(r) and int(r["spec"]["slot"]) > killed_ms]) >= 3,
        timeout=60,
    )
    first_west = min(
        int(r["spec"]["slot"]) for r in west.cluster.runs(job) if _ran_here(r) and int(r["spec"]["slot"]) > killed_ms
    )
    assert first_west - killed_ms <= 4_000 + 2_000 + 3_000, "west took more than a lease and a slot to go on"

    # east is back: its stale Pod goes, its object shows the run as west's; it runs slots again.
    east.replicas.start("east-1", *east.options)
    back_ms = int(time.time() * 1000)
    until(f"east's stale Pod of {name} to go", lambda: east.cluster.get("pod", name) is None, timeout=60)
    moved = until(
        f"east to show {name} as west's",
        lambda: (r := east.cluster.get("anarchonrun", name)) and (r.get("status") or {}).get("cluster") == "west" and r,
        timeout=60,
    )
    assert moved["status"]["attempt"] == 2, moved["status"]
    until(
        "east to run a slot again",
        lambda: any(_ran_here(r) and int(r["spec"]["slot"]) > back_ms for r in east.cluster.runs(job)),
        timeout=90,
    )
    _ran_once(sides, job)


def test_slots_run_in_the_other_cluster_while_one_api_server_is_out_of_reach(
    sides: tuple[Side, Side], east_api: ApiFaultProxy
) -> None:
    """east's replicas live on, but their API server does not answer: west runs the slots; once it
    answers again, east takes part again, and no slot has run in both."""
    east, west = sides
    job = "beacon"
    manifest = job_manifest(
        job, every="2s", sharedName="beacon.billing", overlap="Allow", successfulRunsHistoryLimit=100
    )  # Allow: a run east had in hand (relaunched in west two leases later) holds no slot up
    for side in sides:
        side.cluster.apply(manifest)
    until("east to run a slot", lambda: any(_ran_here(r) for r in east.cluster.runs(job)), timeout=60)
    east_api.stop()
    try:
        cut_ms = int(time.time() * 1000)
        # east's replicas hold the job back once their API server has not answered for 3 s
        # (kube/reach.py): from a slot on, every slot runs in west, on time.
        held_ms = cut_ms + 3_000 + 2_000
        expected = [held_ms - held_ms % 2_000 + 2_000 * i for i in range(1, 5)]

        def in_west() -> bool:
            ran = {int(r["spec"]["slot"]) for r in west.cluster.runs(job) if _ran_here(r)}
            return set(expected) <= ran

        until(f"west to run the slots {expected}", in_west, timeout=60)
        for r in west.cluster.runs(job):
            if int(r["spec"]["slot"]) in expected:
                assert r["status"]["attempt"] == 1, r["status"]  # claimed there at once, not taken over
    finally:
        east_api.start()
    back_ms = int(time.time() * 1000)
    until(
        "east to run a slot again",
        lambda: any(_ran_here(r) and int(r["spec"]["slot"]) > back_ms for r in east.cluster.runs(job)),
        timeout=90,
    )
    _ran_once(sides, job)
