"""A store between regions: two clusters' replicas claim and heartbeat a shared job through 50 ms (± 25) of latency.

The store (PostgreSQL) is reached through toxiproxy, every reply 50 ms late, ± 25 ms
(tests/faults/toxiproxy.py): what a store in another region costs each call. Two clusters
(two namespaces with their own replicas and cluster names, as in test_shared_jobs.py), two
replicas each, run one job every second with the chart's lease and heartbeat ratios scaled
down (heartbeat 1 s, lease 4 s): each slot must run once, at its first attempt (no lease
lost to a late heartbeat), and soon after its slot. Checked from outside: the objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.faults.toxiproxy import ProxiedStore
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.controlplane import fresh_namespace
from tests.harness.until import until

JOB = "ledger"
SLOTS = 15


@pytest.fixture
def clusters(
    crds: Any, postgres_behind_proxy: ProxiedStore[Any], tmp_path: Path
) -> Iterator[list[tuple[str, Cluster]]]:
    """east and west, two replicas each, on the PostgreSQL store 50 ms away."""
    postgres_behind_proxy.proxy.latency(50, 25)
    made: list[Replicas] = []
    with fresh_namespace(crds, "east") as east_ns, fresh_namespace(crds, "west") as west_ns:
        try:
            for name, ns in (("east", east_ns), ("west", west_ns)):
                replicas = Replicas(crds, ns, postgres_behind_proxy.url, tmp_path)
                made.append(replicas)
                for n in (1, 2):
                    replicas.start(f"{name}-{n}", "--cluster-name", name, "--store-check", "1s")
            yield [("east", Cluster(crds, east_ns)), ("west", Cluster(crds, west_ns))]
        finally:
            for replicas in made:
                replicas.stop_all()


def _ms(rfc3339: str) -> int:
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def test_each_slot_runs_once_at_its_first_attempt_through_store_latency(clusters: list[tuple[str, Cluster]]) -> None:
    for _, cluster in clusters:
        cluster.apply(
            job_manifest(JOB, every="1s", sharedName="ledger.eu", overlap="Allow", successfulRunsHistoryLimit=100)
        )

    def own() -> dict[int, tuple[str, dict[str, Any]]]:
        runs: dict[int, tuple[str, dict[str, Any]]] = {}
        for name, cluster in clusters:
            for run in cluster.runs(JOB):
                status = run.get("status") or {}
                if status.get("phase") in ("Running", "Succeeded", "Failed") and not status.get("cluster"):
                    slot = int(run["spec"]["slot"])
                    assert slot not in runs, f"slot {slot} ran in {runs[slot][0]} and in {name}"
                    runs[slot] = (name, run)
        return runs

    ran = until(f"{SLOTS} slots run", lambda: len(r := own()) >= SLOTS and r, timeout=90)
    slots = sorted(ran)
    assert slots == list(range(slots[0], slots[0] + 1000 * len(slots), 1000)), "a slot was missed"
    for slot, (name, run) in ran.items():
        status = run["status"]
        assert status["attempt"] == 1, f"slot {slot} in {name} needed another attempt: {status}"
        # jitter (300 ms) + a claim and the run's writes through the latency, on a loaded machine
        assert _ms(status["startTime"]) - slot <= 5_000, (slot, status)
    assert {name for name, _ in ran.values()} == {"east", "west"}
