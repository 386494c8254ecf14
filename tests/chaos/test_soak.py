"""The chaos soak: at least 3,000 slots with every kind of fault, zero broken promises.

It is part of ``bash tests/run.sh`` (and so of CI); ``bash tests/run.sh tests/chaos`` runs only it,
``ANARCHON_SOAK=0`` leaves it out.

``ANARCHON_SOAK_SLOTS`` sets the size (default 3,000; e.g. 20,000 for a long run),
``ANARCHON_SOAK_SEED`` the random seed of the faults and ``ANARCHON_SOAK_STORE`` the store:
``postgres`` (the default) or ``redis`` (with the append-only file, as the chart runs it).
Store faults are the server's (frozen, crashed and restarted) and toxiproxy's TCP faults in front of
it; ``ANARCHON_SOAK_STORE_FAULTS=server`` keeps only the server's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from tests.faults.apiproxy import ApiFaultProxy
from tests.faults.toxiproxy import Toxiproxy
from tests.operator.conftest import Cluster, Replicas
from tests.servers.postgres import PostgresServer
from tests.servers.postgres import start_or_fail as start_postgres_or_fail
from tests.servers.redis import RedisServer
from tests.servers.redis import start_or_fail as start_redis_or_fail

from .soak import RULES, SoakStore, soak

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture
def soak_store(toxiproxy: Toxiproxy) -> Iterator[SoakStore]:
    """A store of the soak's own behind toxiproxy: it is frozen, crashed and cut off, so it must
    not be the session's. Redis keeps its append-only file, as the chart's bundled Redis does."""
    kind = os.environ.get("ANARCHON_SOAK_STORE", "postgres")
    server: PostgresServer | RedisServer
    if kind == "postgres":
        server = start_postgres_or_fail()
    elif kind == "redis":
        server = start_redis_or_fail(extra_args=["--appendonly", "yes", "--appendfsync", "everysec"])
    else:
        raise ValueError(f"ANARCHON_SOAK_STORE={kind!r}: postgres or redis")
    proxy = toxiproxy.proxy(server.port, label=f"soak-{kind}")
    try:
        yield SoakStore(server, proxy)
    finally:
        proxy.delete()
        with contextlib.suppress(Exception):
            server.resume()  # a soak that failed may leave it frozen
        server.stop()


async def test_chaos_soak(cluster: Cluster, replicas_factory, soak_store: SoakStore, capsys) -> None:
    slots = int(os.environ.get("ANARCHON_SOAK_SLOTS", "3000"))
    seed = int(os.environ.get("ANARCHON_SOAK_SEED", "1"))
    replicas: Replicas = replicas_factory(soak_store.url)
    with ApiFaultProxy(cluster.cp, seed=seed) as proxy:
        report = await soak(cluster, replicas, proxy, soak_store, slots=slots, seed=seed)
    with capsys.disabled():
        print("\n" + report.text())
    assert report.slots >= slots * 0.95, "the soak ran fewer slots than asked"
    assert report.kills and report.store_faults and sum(report.api_faults.values()), "every kind of fault must fire"
    broken = {rule: report.violations.get(rule, 0) for rule in RULES if report.violations.get(rule, 0)}
    assert not broken, f"broken promises: {broken}\n{report.text()}\n{report.evidence}"
