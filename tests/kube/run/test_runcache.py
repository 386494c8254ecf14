"""RunCache against the real API server: a job's runs read from one watch, our own writes at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from controlplane import ControlPlane

from anarchon.kube.api.client import Kube
from anarchon.kube.constants import API_VERSION, GROUP, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, RUN_KIND, RUNS, VERSION
from anarchon.kube.job.spec import slot_time
from anarchon.kube.run import cache as runcache
from anarchon.kube.run.cache import RunCache
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.controlplane import typed_connect
from tests.harness.until import until_async


def _run(job: str, slot: int) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {
            "name": f"{job}-{slot}",
            "labels": {LABEL_JOB: job, LABEL_MANAGED_BY: MANAGED_BY},
        },
        "spec": {"job": job, "slot": slot, "slotTime": slot_time(slot), "trigger": "Schedule"},
    }


def _slots(cache: RunCache, namespace: str, job: str) -> list[int] | None:
    found = cache.runs_of(namespace, job)
    return None if found is None else [int(r["spec"]["slot"]) for r in found]


def _phase(cache: RunCache, namespace: str, job: str, slot: int) -> str | None:
    for r in cache.runs_of(namespace, job) or []:
        if r["spec"]["slot"] == slot:
            return str(r["status"].get("phase"))
    return None


@pytest.fixture
async def cache(crds: ControlPlane, kube: Kube, namespace: str) -> AsyncIterator[RunCache]:
    # Made before the cache starts: the listing must bring them in.
    for job, slot in (("a", 3_000), ("a", 1_000), ("b", 2_000)):
        await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, _run(job, slot))
    runs = RunCache(kube, [namespace])
    assert runs.runs_of(namespace, "a") is None, "not listed yet: the caller must list"
    runs.start()
    await until_async("the watch", lambda: runs.healthy)
    yield runs
    await runs.stop()
    assert runs.runs_of(namespace, "a") is None


async def test_runs_by_job_and_slot_from_the_listing_then_the_watch(
    kube: Kube, namespace: str, cache: RunCache
) -> None:
    assert _slots(cache, namespace, "a") == [1_000, 3_000]
    assert _slots(cache, namespace, "b") == [2_000]
    assert _slots(cache, namespace, "nobody") == []
    assert all("managedFields" not in r["metadata"] for r in cache.runs_of(namespace, "a") or [])
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, _run("a", 2_000))
    await until_async("the new run", lambda: _slots(cache, namespace, "a") == [1_000, 2_000, 3_000])
    assert not cache.deleted(namespace, "a-1000")
    await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, "a-1000")
    await until_async("the deletion", lambda: _slots(cache, namespace, "a") == [2_000, 3_000])
    assert cache.deleted(namespace, "a-1000"), "mending must know a deleted run was not lost"


async def _write_phase(kube: Kube, namespace: str, name: str, phase: str) -> dict[str, Any]:
    body = dict(await kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, name))
    body["status"] = {"phase": phase}
    return dict(await kube.custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, RUNS, name, body))


async def test_our_write_is_read_at_once_and_never_hides_a_later_one(
    kube: Kube, namespace: str, cache: RunCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not delivered yet (the watch is a moment behind): our copy is what a refresh must see.
    written = await _write_phase(kube, namespace, "b-2000", "Running")
    ahead = {**written, "metadata": {**written["metadata"], "resourceVersion": "ahead"}, "status": {"phase": "Mine"}}
    cache.wrote(ahead)
    assert _phase(cache, namespace, "b", 2_000) == "Mine"
    # Events of other versions (older ones on their way, or this one) do not drop it...
    await _write_phase(kube, namespace, "b-2000", "Succeeded")
    await asyncio.sleep(1)
    assert _phase(cache, namespace, "b", 2_000) == "Mine"
    # ... but it is read for a bounded time only: then the watch's copy, the newest, wins.
    monkeypatch.setattr(runcache, "WRITTEN_FOR_S", 0.0)
    assert _phase(cache, namespace, "b", 2_000) == "Succeeded"
    # The usual case: the reply noted, the watch delivers that very version, a later write by
    # someone else is seen (a noted copy that was already delivered is not kept at all).
    monkeypatch.setattr(runcache, "WRITTEN_FOR_S", 3600.0)
    cache.wrote(await _write_phase(kube, namespace, "b-2000", "Failed"))
    assert _phase(cache, namespace, "b", 2_000) == "Failed"
    await _write_phase(kube, namespace, "b-2000", "Interrupted")
    await until_async("the later write", lambda: _phase(cache, namespace, "b", 2_000) == "Interrupted")


async def test_a_watch_cut_again_and_again_is_noticed_and_misses_no_run(
    crds: ControlPlane, control_plane: ControlPlane, namespace: str
) -> None:
    """Behind the fault proxy the watch is cut three times while runs are created: each cut makes
    the cache unhealthy (callers list instead), and once it is healthy again it has every run."""
    with ApiFaultProxy(control_plane) as proxy:
        kube = await typed_connect(str(proxy.kubeconfig))
        runs = RunCache(kube, [namespace])
        cut = proxy.add(Fault("cut_watch", seconds=0.4, resource="anarchonruns", times=3))
        runs.start()
        unhealthy_seen = 0
        try:
            for slot in range(1_000, 13_000, 1_000):
                await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, _run("c", slot))
                for _ in range(4):
                    unhealthy_seen += not runs.healthy
                    await asyncio.sleep(0.05)
            expected = list(range(1_000, 13_000, 1_000))
            await until_async(
                "every run, after the cuts", lambda: runs.healthy and _slots(runs, namespace, "c") == expected
            )
            assert cut.fired == 3, cut.fired
            assert unhealthy_seen, "a cut watch must make the cache say it cannot be trusted"
        finally:
            await runs.stop()
            await kube.close()


async def _write_status(kube: Kube, namespace: str, name: str, status: dict[str, Any]) -> None:
    body = dict(await kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, name))
    body["status"] = status
    await kube.custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, RUNS, name, body)


async def test_who_acted_is_who_added_an_attempt_or_skipped_a_slot(
    kube: Kube, namespace: str, crds: ControlPlane
) -> None:
    """What tells the replicas at work (see anarchon.kube.job.sharing): an attempt added names its own
    replica, a run turned Skipped its writer. Other writes naming a replica (the run's end, written
    on a run that names an earlier attempt) are no act of it, and a listing shows no act."""
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, _run("d", 1_000))
    first = [{"attempt": 1, "instance": "r-old", "podName": "d-1000"}]
    await _write_status(kube, namespace, "d-1000", {"phase": "Running", "instance": "r-old", "attempts": first})
    runs = RunCache(kube, [namespace])
    runs.start()
    try:
        await until_async("the listing", lambda: _slots(runs, namespace, "d") == [1_000])
        assert runs.acted() == {}, "a listing shows what was written, maybe long ago"
        taken = [*first, {"attempt": 2, "instance": "r2", "podName": "d-1000"}]
        await _write_status(kube, namespace, "d-1000", {"phase": "Running", "instance": "r2", "attempts": taken})
        await until_async("r2's attempt", lambda: "r2" in runs.acted())
        await _write_status(kube, namespace, "d-1000", {"phase": "Succeeded", "instance": "r2", "attempts": taken})
        await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, RUNS, _run("d", 2_000))
        await _write_status(kube, namespace, "d-2000", {"phase": "Skipped", "instance": "r3", "attempt": 0})
        await until_async("r3's skip", lambda: "r3" in runs.acted())
        assert set(runs.acted()) == {"r2", "r3"}
        assert runs.acted()["r2"] <= runs.acted()["r3"]
    finally:
        await runs.stop()
