"""Replicas that do not share one store notice it and say so, without a write storm meanwhile.

Each replica on a store of its own wins every slot in it. Pod names keep it to one Pod a slot,
but on main the replicas then fought over the Pod's follower label (1,293 events of one Pod in
10 s for three replicas on three SQLite files), contradicted each other in Events, and the job
said Ready=True. Here, with a check every 0.2 s (its window: 4 s), the job must say
Ready=False StoreNotShared, with a Warning Event and the metric, and the API server must see a
bounded number of writes; the same replicas on one store never say it.

Every replica talks to the API server through the fault proxy (no fault set), which counts the
requests.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.faults.apiproxy import ApiFaultProxy
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.harness.until import until
from tests.servers.process import free_port

CHECK = "200ms"
#: From the job's creation to StoreNotShared at most: the first window (4 s), a period after the
#: first check that found a replica absent, two strikes, a slot or two, and a loaded machine.
NOTICED_WITHIN_S = 40
#: API writes per run of an every-2s job, all the replicas together, once they know. Measured:
#: about 20 for three replicas on stores of their own, 14 for two (each writes its attempt and
#: its Events); on main, about 800 for one run in 8 s, nearly all of them Pod label moves.
WRITES_PER_RUN = 30
WRITES = frozenset({"create", "update", "patch", "delete"})


def _not_shared(cluster: Cluster, job: str) -> dict[str, Any] | None:
    conds = ((cluster.get("anarchonjob", job) or {}).get("status") or {}).get("conditions") or []
    ready = next((c for c in conds if c["type"] == "Ready"), None)
    return ready if ready is not None and ready["reason"] == "StoreNotShared" else None


def _gauge(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        text = rsp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "anarchon_store_not_shared":
                return float(sample.value)
    raise AssertionError("no anarchon_store_not_shared in /metrics")


@pytest.fixture
def proxy(control_plane: Any) -> Iterator[ApiFaultProxy]:
    """Asked for before ``replicas_factory``: it outlives the replicas, which it serves to the end."""
    with ApiFaultProxy(control_plane) as p:
        yield p


@dataclass
class Started:
    replicas: Replicas
    name: str
    metrics: int


def _start(replicas_factory: Callable[[str], Replicas], proxy: ApiFaultProxy, store: str, name: str) -> Started:
    started = Started(replicas_factory(store), name, free_port())
    started.replicas.start(
        name, "--kubeconfig", str(proxy.kubeconfig), "--store-check", CHECK, "--metrics-port", str(started.metrics)
    )
    return started


def _writes(proxy: ApiFaultProxy) -> Counter[str]:
    return Counter(
        f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}{' (new)' if r.upstream == 201 else ''}"
        for r in proxy.requests
        if r.verb in WRITES and r.forwarded
    )


def _notice_then_bounded_writes(
    cluster: Cluster, proxy: ApiFaultProxy, started: list[Started], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.apply(job_manifest("split", every="2s", annotations={"anarchon.test/run-seconds": "0.5"}))
    begun = time.monotonic()
    ready = until("StoreNotShared", lambda: _not_shared(cluster, "split"), timeout=NOTICED_WITHIN_S)
    noticed_s = time.monotonic() - begun
    assert "do not share one store" in ready["message"], ready
    warnings = [
        e for e in cluster.events("StoreNotShared") if e["type"] == "Warning" and e["involvedObject"]["name"] == "split"
    ]
    assert warnings, "a Warning Event on the job"
    until("every replica's metric", lambda: all(_gauge(s.metrics) > 0 for s in started), timeout=20)
    for s in started:
        assert "StoreNotShared: the replicas do not share one store" in s.replicas.log(s.name), s.name
    # Every replica knows: from now on they write a bounded amount, and move no Pod label.
    proxy.clear_requests()
    time.sleep(6)
    writes = _writes(proxy)
    runs = writes["create anarchonruns (new)"]
    table = "\n".join(f"  {n:4d}  {kind}" for kind, n in writes.most_common())
    with capsys.disabled():
        print(f"\nnoticed in {noticed_s:.1f}s; writes in 6 s ({runs} runs), {len(started)} replicas:\n{table}")
    assert runs >= 2, f"the runs go on:\n{table}"
    assert writes["patch pods"] == 0, f"a Pod label moved by a replica that knows:\n{table}"
    assert sum(writes.values()) <= WRITES_PER_RUN * runs, table
    assert _not_shared(cluster, "split"), "it stays said while the replicas stay apart"


@pytest.mark.parametrize("stores", ["three SQLite files", "two Redis databases"])
def test_replicas_on_stores_of_their_own(
    stores: str,
    cluster: Cluster,
    proxy: ApiFaultProxy,
    replicas_factory: Callable[[str], Replicas],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if stores == "three SQLite files":
        urls = [f"sqlite://{tmp_path / f's{i}.db'}" for i in range(3)]
    else:
        server = str(request.getfixturevalue("redis_url")).rsplit("/", 1)[0]
        urls = [f"{server}/4", f"{server}/5"]  # not 0: the engine tests forget every job noted there
    started = [_start(replicas_factory, proxy, url, f"r{i}") for i, url in enumerate(urls)]
    _notice_then_bounded_writes(cluster, proxy, started, capsys)


def test_replicas_on_one_store_never_say_it(
    cluster: Cluster, proxy: ApiFaultProxy, replicas_factory: Callable[[str], Replicas], redis_url: str
) -> None:
    """The control: three replicas on one Redis database, watched for longer than the split ones
    took to notice, through a rolling restart (one replica replaced by a new one) and a Redis that
    loses every record (FLUSHDB, as a restart without persistence): never StoreNotShared."""
    store = redis_url.rsplit("/", 1)[0] + "/3"
    started = [_start(replicas_factory, proxy, store, f"r{i}") for i in range(3)]
    cluster.apply(job_manifest("shared", every="2s", annotations={"anarchon.test/run-seconds": "0.5"}))
    until("a run", lambda: cluster.phases("shared")["Succeeded"] >= 1, timeout=30)
    begun = time.monotonic()
    restarted = flushed = False
    while (elapsed := time.monotonic() - begun) < 14:
        if elapsed > 3 and not restarted:
            started[0].replicas.kill("r0", signal.SIGTERM)
            started[0] = _start(replicas_factory, proxy, store, "r3")
            restarted = True
        if elapsed > 7 and not flushed:
            subprocess.run(["redis-cli", "-u", store, "flushdb"], check=True, capture_output=True, timeout=10)
            flushed = True
        assert not _not_shared(cluster, "shared"), f"after {elapsed:.1f}s"
        time.sleep(0.5)
    assert all(_gauge(s.metrics) == 0 for s in started)
    assert not cluster.events("StoreNotShared")
    assert cluster.phases("shared")["Succeeded"] >= 3, cluster.phases("shared")
