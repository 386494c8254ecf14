"""The chaos soak: every kind of fault at once, zero broken promises.

It is part of ``bash tests/run.sh`` (and so of CI); ``bash tests/run.sh tests/chaos`` runs only it,
``ANARCHON_SOAK=0`` leaves it out.

``ANARCHON_SOAK_PROFILE`` chooses how hard (soak.py): ``harsh`` (the default: issue 25's mix, lease
3 s, Pods of 15-60 s, stalls past the lease, Redis restarted without its data, an outage of every
replica; 5-7 min a store) runs on Redis without persistence and on PostgreSQL; ``gentle`` (the
soak as it was: lease 8 s, Pods of at most 5 s, 3,000 slots, ~11 min) on PostgreSQL.
``ANARCHON_SOAK_STORE`` runs the profile on one store only: ``postgres`` or ``redis`` (with the
append-only file, as the chart runs it, under ``gentle``; without persistence under ``harsh``).
``ANARCHON_SOAK_SLOTS`` sets the size (default: the profile's), ``ANARCHON_SOAK_SEED`` the random
seed of the faults. Store faults are the server's (frozen, crashed and restarted) and
toxiproxy's TCP faults in front of it; ``ANARCHON_SOAK_STORE_FAULTS=server`` keeps only the server's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.apiproxy import ApiFaultProxy
from tests.faults.toxiproxy import Toxiproxy
from tests.harness.cluster import Cluster, Replicas
from tests.servers.postgres import PostgresServer
from tests.servers.postgres import start_or_fail as start_postgres_or_fail
from tests.servers.redis import RedisServer
from tests.servers.redis import start_or_fail as start_redis_or_fail

from .soak import RULES, Profile, SoakStore, profile_named, soak

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def _cases() -> list[Any]:
    profile = profile_named(os.environ.get("ANARCHON_SOAK_PROFILE", "harsh"))
    chosen = os.environ.get("ANARCHON_SOAK_STORE")
    stores = [chosen] if chosen else list(profile.stores)
    return [pytest.param(profile, kind, id=f"{profile.name}-{kind}") for kind in stores]


@pytest.fixture
def soak_store(toxiproxy: Toxiproxy, profile: Profile, store_kind: str) -> Iterator[SoakStore]:
    """A store of the soak's own behind toxiproxy: it is frozen, crashed and cut off, so it must
    not be the session's. Redis keeps its append-only file, as the chart's bundled Redis does,
    unless the profile runs it without persistence (a restart then empties it)."""
    server: PostgresServer | RedisServer
    keeps_data = True
    if store_kind == "postgres":
        server = start_postgres_or_fail()
    elif store_kind == "redis":
        keeps_data = profile.redis_persistent
        extra = ["--appendonly", "yes", "--appendfsync", "everysec"] if keeps_data else []
        server = start_redis_or_fail(extra_args=extra)
    else:
        raise ValueError(f"ANARCHON_SOAK_STORE={store_kind!r}: postgres or redis")
    proxy = toxiproxy.proxy(server.port, label=f"soak-{store_kind}")
    try:
        yield SoakStore(server, proxy, kind=store_kind, keeps_data=keeps_data)
    finally:
        proxy.delete()
        with contextlib.suppress(Exception):
            server.resume()  # a soak that failed may leave it frozen
        server.stop()


@pytest.mark.parametrize(("profile", "store_kind"), _cases())
async def test_chaos_soak(
    cluster: Cluster,
    replicas_factory: Callable[[str], Replicas],
    soak_store: SoakStore,
    profile: Profile,
    store_kind: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    slots = int(os.environ.get("ANARCHON_SOAK_SLOTS", str(profile.default_slots)))
    seed = int(os.environ.get("ANARCHON_SOAK_SEED", "1"))
    replicas = replicas_factory(soak_store.url)
    with ApiFaultProxy(cluster.cp, seed=seed) as proxy:
        report = await soak(cluster, replicas, proxy, soak_store, slots=slots, seed=seed, profile=profile)
    with capsys.disabled():
        print("\n" + report.text())
    assert report.slots >= slots * 0.95, "the soak ran fewer slots than asked"
    assert report.kills and report.store_faults and sum(report.api_faults.values()), "every kind of fault must fire"
    if profile.outage_s:
        assert report.outage != "none", "the outage of every replica must happen"
    if profile.redis_wipe_every_s and not soak_store.keeps_data:
        assert report.store_faults.get("restarted without its data"), "Redis must lose its data"
    broken = {rule: report.violations.get(rule, 0) for rule in RULES if report.violations.get(rule, 0)}
    assert not broken, f"broken promises: {broken}\n{report.text()}\n{report.evidence}"
