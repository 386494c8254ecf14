"""Each cluster's spec of a shared job, held against every real lease store (sqlite, redis, postgres).

The notes decide which clusters claim (:func:`anarchon.engine.shared.agreed`): a store that lost a
note's ``since``, or kept a gone cluster's note, would let two specs of one job claim at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from anarchon.engine import LeaseBackend
from anarchon.engine.shared import SharedSide, agreed, cluster_of, instance_id

NOW = 1_800_000_000_000
TTL = 30_000
SPEC_A = "schedule=every 10s; overlap=Skip"
SPEC_B = "schedule=every 20s; overlap=Skip"


def _by_cluster(sides: list[SharedSide]) -> dict[str, tuple[str, int, int]]:
    return {s.cluster: (s.fingerprint, s.since, s.seen_ms) for s in sides}


async def test_notes_keep_since_while_the_spec_stays(lease_backend: LeaseBackend, job_name: str) -> None:
    first = await lease_backend.note_shared_spec(job_name, "east", SPEC_A, NOW, TTL)
    assert _by_cluster(first) == {"east": (SPEC_A, 1, NOW)}
    # west's clock is behind: the order is the store's, not the clusters' clocks.
    both = await lease_backend.note_shared_spec(job_name, "west", SPEC_B, NOW - 5_000, TTL)
    assert _by_cluster(both) == {"east": (SPEC_A, 1, NOW), "west": (SPEC_B, 2, NOW - 5_000)}
    assert agreed(both) == SPEC_A  # east held it first: west waits
    again = await lease_backend.note_shared_spec(job_name, "east", SPEC_A, NOW + 2_000, TTL)
    assert _by_cluster(again)["east"] == (SPEC_A, 1, NOW + 2_000)
    # east is edited to west's spec: it comes after every note now, and both agree on it.
    edited = await lease_backend.note_shared_spec(job_name, "east", SPEC_B, NOW + 3_000, TTL)
    assert _by_cluster(edited)["east"] == (SPEC_B, 3, NOW + 3_000)
    assert agreed(edited) == SPEC_B


async def test_a_gone_cluster_note_runs_out_and_a_dropped_one_goes(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.note_shared_spec(job_name, "east", SPEC_A, NOW, TTL)
    await lease_backend.note_shared_spec(job_name, "west", SPEC_B, NOW, TTL)
    later = await lease_backend.note_shared_spec(job_name, "west", SPEC_B, NOW + TTL + 1, TTL)
    assert _by_cluster(later) == {"west": (SPEC_B, 2, NOW + TTL + 1)}
    await lease_backend.note_shared_spec(job_name, "east", SPEC_A, NOW + TTL + 2, TTL)
    await lease_backend.drop_shared_spec(job_name, "east")
    await lease_backend.drop_shared_spec(job_name, "east")  # idempotent
    assert set(_by_cluster(await lease_backend.note_shared_spec(job_name, "west", SPEC_B, NOW + TTL + 3, TTL))) == {
        "west"
    }


async def test_forget_job_forgets_the_notes(lease_backend: LeaseBackend, job_name: str) -> None:
    await lease_backend.note_shared_spec(job_name, "east", SPEC_A, NOW, TTL)
    await lease_backend.forget_job(job_name)
    assert _by_cluster(await lease_backend.note_shared_spec(job_name, "west", SPEC_B, NOW + 1, TTL)) == {
        "west": (SPEC_B, 1, NOW + 1)
    }


async def test_clusters_noting_at_once_agree(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    """Two clusters noting at once: whatever the order, the later sees the earlier, so no two specs both win."""
    east, west = make_backend(), make_backend()
    await asyncio.gather(east.setup(), west.setup())
    try:
        for n in range(10):
            job = f"{job_name}-{n}"
            a, b = await asyncio.gather(
                east.note_shared_spec(job, "east", SPEC_A, NOW, TTL),
                west.note_shared_spec(job, "west", SPEC_B, NOW, TTL),
            )
            winners = {fp for sides, fp in ((a, SPEC_A), (b, SPEC_B)) if agreed(sides) == fp}
            assert len(winners) == 1 and len(a) + len(b) == 3, (a, b)
    finally:
        await asyncio.gather(east.close(), west.close())


def test_instance_ids_name_their_cluster() -> None:
    assert instance_id("east", "anarchon-7d9f-x2") == "east/anarchon-7d9f-x2"
    assert instance_id(None, "host:12") == "host:12"
    assert cluster_of("east/anarchon-7d9f-x2") == "east"
    assert cluster_of("host:12") is None
    assert cluster_of("Not A Cluster/x") is None
