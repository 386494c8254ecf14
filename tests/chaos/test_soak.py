"""The chaos soak: at least 3,000 slots with every kind of fault, zero broken promises.

It is part of ``bash tests/run.sh`` (and so of CI); ``bash tests/run.sh tests/chaos`` runs only it,
``ANARCHON_SOAK=0`` leaves it out.

``ANARCHON_SOAK_SLOTS`` sets the size (default 3,000; e.g. 20,000 for a long run) and
``ANARCHON_SOAK_SEED`` the random seed of the faults.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.faults.apiproxy import ApiFaultProxy
from tests.operator.conftest import Cluster, Replicas
from tests.servers.postgres import PostgresServer
from tests.servers.postgres import start_or_fail as start_postgres_or_fail

from .soak import RULES, soak

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A store of the soak's own: it is frozen and crashed, so it must not be the session's."""
    server = start_postgres_or_fail()
    yield server
    server.resume()
    server.stop()


async def test_chaos_soak(cluster: Cluster, replicas_factory, private_postgres: PostgresServer, capsys) -> None:
    slots = int(os.environ.get("ANARCHON_SOAK_SLOTS", "3000"))
    seed = int(os.environ.get("ANARCHON_SOAK_SEED", "1"))
    replicas: Replicas = replicas_factory(private_postgres.url)
    with ApiFaultProxy(cluster.cp, seed=seed) as proxy:
        report = await soak(cluster, replicas, proxy, private_postgres, slots=slots, seed=seed)
    with capsys.disabled():
        print("\n" + report.text())
    assert report.slots >= slots * 0.95, "the soak ran fewer slots than asked"
    assert report.kills and report.store_faults and sum(report.api_faults.values()), "every kind of fault must fire"
    broken = {rule: report.violations.get(rule, 0) for rule in RULES if report.violations.get(rule, 0)}
    assert not broken, f"broken promises: {broken}\n{report.text()}\n{report.evidence}"
