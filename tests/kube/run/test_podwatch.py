"""PodWatch against the real API server: it wakes interest in a Pod when that Pod changes,
selects Anarchon's Pods server-side (a replica's own, by their follower label), and reports
whether it is watching."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from anarchon.kube.api.client import Kube
from anarchon.kube.run.pods import follower_label
from anarchon.kube.run.podwatch import PodWatch
from tests.harness.runs import started


def _pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": {"anarchon.test/run-seconds": "1"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]},
    }


OURS = {"app.kubernetes.io/managed-by": "anarchon"}


@pytest.fixture
async def watch(kube: Kube, namespace: str) -> AsyncIterator[PodWatch]:
    pods = await started(PodWatch(kube, [namespace]))
    yield pods
    await pods.stop()
    assert not pods.healthy


def _followed_by(follower: str) -> dict[str, str]:
    return {**OURS, "anarchon.io/follower": follower}


async def test_a_replica_watches_only_the_pods_it_follows(kube: Kube, namespace: str) -> None:
    """Each replica decoded every replica's Pod events (half the bytes of its watches at 1,000 jobs)."""
    mine = await started(PodWatch(kube, [namespace], follower="replica-a"))
    try:
        with mine.interest(namespace, "ours") as ours, mine.interest(namespace, "theirs") as theirs:
            await kube.core.create_namespaced_pod(namespace, _pod("theirs", _followed_by("replica-b")))  # type: ignore[arg-type]
            await kube.core.create_namespaced_pod(namespace, _pod("ours", _followed_by("replica-a")))  # type: ignore[arg-type]
            await asyncio.wait_for(ours.wait(), 30)
            with pytest.raises(TimeoutError):  # it runs 1 s and ends: nothing of it reaches us
                await asyncio.wait_for(theirs.wait(), 4)
        assert mine.covers({"metadata": {"labels": _followed_by("replica-a")}})
        assert not mine.covers({"metadata": {"labels": _followed_by("replica-b")}})
        assert not mine.covers({"metadata": {"labels": OURS}}), "a Pod of an older version has no follower"
    finally:
        await mine.stop()


async def test_a_pod_whose_follower_moved_away_is_read_again_not_taken_for_deleted(kube: Kube, namespace: str) -> None:
    """The Pod leaves the old follower's selection with a DELETED event: the Pod lives on."""
    mine = await started(PodWatch(kube, [namespace], follower="replica-a"))
    try:
        long_lived = _pod("moved", _followed_by("replica-a"))
        long_lived["metadata"]["annotations"]["anarchon.test/run-seconds"] = "-1"
        with mine.interest(namespace, "moved") as changed:
            await kube.core.create_namespaced_pod(namespace, long_lived)  # type: ignore[arg-type]
            await asyncio.wait_for(changed.wait(), 30)
        with mine.interest(namespace, "moved") as changed:
            await kube.core.patch_namespaced_pod("moved", namespace, {"metadata": {"labels": _followed_by("b")}})
            while not changed.is_set() or changed.delivered:  # the changes before the move are delivered
                assert not (changed.is_set() and changed.pod is None), "the Pod was taken for deleted"
                changed.clear()
                await asyncio.wait_for(changed.wait(), 30)
            assert changed.pod is None and not changed.delivered  # whoever waited reads it afresh
        # A real deletion says no more (the event looks the same): the reader then hears 404.
        await kube.core.patch_namespaced_pod("moved", namespace, {"metadata": {"labels": _followed_by("replica-a")}})
        with mine.interest(namespace, "moved") as changed:
            await kube.core.delete_namespaced_pod("moved", namespace, grace_period_seconds=0)
            while not changed.is_set() or changed.delivered:
                assert not (changed.is_set() and changed.pod is None)
                changed.clear()
                await asyncio.wait_for(changed.wait(), 30)
    finally:
        await mine.stop()


def test_a_follower_label_is_a_valid_label_value_of_its_instance_alone() -> None:
    valid = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
    assert follower_label("anarchon-7d9f8b-x2k4q") == "anarchon-7d9f8b-x2k4q"  # the chart's: a Pod name
    instances = ["host:123", "host:124", "host-123", "", ":::", "a" * 70, "a" * 70 + "b", "ü-node"]
    labels = [follower_label(i) for i in instances]
    assert all(valid.fullmatch(label) for label in labels), labels
    assert len(set(labels)) == len(labels), "two instances never share a label"
    assert labels[0].startswith("host-123-")  # still readable


async def test_a_change_to_the_pod_wakes_its_interest(kube: Kube, namespace: str, watch: PodWatch) -> None:
    with watch.interest(namespace, "p1") as changed, watch.interest(namespace, "p2") as other:
        await kube.core.create_namespaced_pod(namespace, _pod("p1", OURS))  # type: ignore[arg-type]
        await asyncio.wait_for(changed.wait(), 30)
        assert not other.is_set(), "only the Pod that changed wakes its waiters"
    with watch.interest(namespace, "p1") as changed:  # it runs for 1 s on KWOK, then succeeds
        await asyncio.wait_for(changed.wait(), 30)


async def test_a_wake_up_carries_the_pod_as_delivered_and_deletion_as_none(
    kube: Kube, namespace: str, watch: PodWatch
) -> None:
    """The runner acts on the delivered Pod instead of reading it again: it must be the Pod."""
    with watch.interest(namespace, "carried") as changed:
        await kube.core.create_namespaced_pod(namespace, _pod("carried", OURS))  # type: ignore[arg-type]
        await asyncio.wait_for(changed.wait(), 30)
        assert changed.delivered and changed.pod is not None
        assert changed.pod["metadata"]["name"] == "carried" and changed.pod["kind"] == "Pod"
    # KWOK runs it for 1 s, then it succeeds: the last state delivered says so.
    for _ in range(60):
        with watch.interest(namespace, "carried") as changed:
            await asyncio.wait_for(changed.wait(), 30)
            assert changed.delivered and changed.pod is not None
            if changed.pod["status"].get("phase") == "Succeeded":
                break
    else:
        raise AssertionError("never delivered as Succeeded")
    with watch.interest(namespace, "carried") as changed:
        await kube.core.delete_namespaced_pod("carried", namespace, grace_period_seconds=0)
        while not (changed.is_set() and changed.delivered and changed.pod is None):
            changed.clear()
            await asyncio.wait_for(changed.wait(), 30)


async def test_pods_without_our_label_are_not_watched(kube: Kube, namespace: str, watch: PodWatch) -> None:
    with watch.interest(namespace, "foreign") as changed:
        await kube.core.create_namespaced_pod(namespace, _pod("foreign", {"app": "else"}))  # type: ignore[arg-type]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(changed.wait(), 3)
        # Labelled as ours, it enters the server-side selection: that is a change we hear of.
        await kube.core.patch_namespaced_pod("foreign", namespace, {"metadata": {"labels": OURS}})
        await asyncio.wait_for(changed.wait(), 30)


async def test_a_large_pod_is_one_readable_watch_line(kube: Kube, namespace: str, watch: PodWatch) -> None:
    """aiohttp refuses lines over twice its read buffer; kubernetes_asyncio sets that to 2 MB,
    above etcd's 1.5 MB object limit. A 200 KB Pod (over aiohttp's default) must pass."""
    big = _pod("big", OURS)
    big["metadata"]["annotations"]["example.com/blob"] = "x" * 200_000
    with watch.interest(namespace, "big") as changed:
        await kube.core.create_namespaced_pod(namespace, big)  # type: ignore[arg-type]
        await asyncio.wait_for(changed.wait(), 30)
    with watch.interest(namespace, "after") as changed:  # the watch is still up and reading
        await kube.core.create_namespaced_pod(namespace, _pod("after", OURS))  # type: ignore[arg-type]
        await asyncio.wait_for(changed.wait(), 30)
    assert watch.healthy


async def test_interest_is_forgotten_on_exit(namespace: str, watch: PodWatch) -> None:
    with watch.interest(namespace, "p"), watch.interest(namespace, "p"):
        assert len(watch._waiters[(namespace, "p")]) == 2
    assert (namespace, "p") not in watch._waiters
