"""EventPoster against the real API server: repeated Events are counted on one Event object,
as Kubernetes' own components do, and a deleted Event is created again."""

from __future__ import annotations

import asyncio
from typing import Any

from anarchon.kube.api.client import Kube
from anarchon.kube.report.kube_events import EventPoster

UID = "0b5c1f5e-6a7e-4e8e-9a55-1c0f00000001"


async def events(kube: Kube, namespace: str) -> list[Any]:
    listing = await kube.core.list_namespaced_event(namespace)
    return sorted(listing.items, key=lambda e: (e.reason, e.source.host or ""))


def post(poster: EventPoster, namespace: str, reason: str, message: str, **kw: Any) -> Any:
    return poster.post(namespace=namespace, name="nightly", uid=UID, reason=reason, message=message, **kw)


async def test_an_outage_posts_one_event_per_reason_and_replica_with_counts(kube: Kube, namespace: str) -> None:
    replicas = [EventPoster(kube, instance=f"replica-{i}") for i in range(2)]
    # Every slot of an outage missed, on both replicas, many at once; a few runs failed too.
    await asyncio.gather(
        *(post(r, namespace, "Missed", f"slot {s}: missed", warning=True) for r in replicas for s in range(30)),
        *(post(replicas[0], namespace, "RunFailed", f"run {s} failed", warning=True) for s in range(5)),
    )
    await post(replicas[0], namespace, "Missed", "slot 99: missed", warning=True)
    got = await events(kube, namespace)
    assert [(e.reason, e.source.host, e.count) for e in got] == [
        ("Missed", "replica-0", 31),
        ("Missed", "replica-1", 30),
        ("RunFailed", "replica-0", 5),
    ]
    latest = got[0]
    assert latest.message == "slot 99: missed", "the Event says the latest occurrence"
    assert latest.type == "Warning" and latest.involved_object.uid == UID
    assert latest.last_timestamp >= latest.first_timestamp


async def test_a_deleted_event_is_created_again_and_a_restarted_replica_counts_on(kube: Kube, namespace: str) -> None:
    poster = EventPoster(kube, instance="replica-0")
    for s in range(3):
        await post(poster, namespace, "Skipped", f"slot {s}: skipped")
    [first] = await events(kube, namespace)
    assert first.count == 3
    # Someone deleted it (or its TTL ran out): the patch the poster tries first finds nothing.
    await kube.core.delete_namespaced_event(first.metadata.name, namespace)
    await post(poster, namespace, "Skipped", "slot 3: skipped")
    [again] = await events(kube, namespace)
    assert again.count == 1 and again.message == "slot 3: skipped"
    assert again.metadata.uid != first.metadata.uid
    # The replica restarts with the same instance id and nothing remembered: its create is
    # refused as AlreadyExists, and it counts on the Event it had posted.
    restarted = EventPoster(kube, instance="replica-0")
    await post(restarted, namespace, "Skipped", "slot 4: skipped")
    [counted] = await events(kube, namespace)
    assert counted.count == 2 and counted.metadata.uid == again.metadata.uid
    # Changed by another writer since the poster wrote it (a conflict): it reads and counts on.
    await kube.core.patch_namespaced_event(counted.metadata.name, namespace, {"count": 10})
    await post(restarted, namespace, "Skipped", "slot 5: skipped")
    [last] = await events(kube, namespace)
    assert last.count == 11 and last.message == "slot 5: skipped"
