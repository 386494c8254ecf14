"""PodWatch against the real API server: it wakes interest in a Pod when that Pod changes,
selects Anarchon's Pods server-side, and reports whether it is watching."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from anarchon.kube.client import Kube
from anarchon.kube.podwatch import PodWatch


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
    pods = PodWatch(kube, [namespace])
    pods.start()
    for _ in range(200):
        if pods.healthy:
            break
        await asyncio.sleep(0.05)
    assert pods.healthy, "the watch never started"
    yield pods
    await pods.stop()
    assert not pods.healthy


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
