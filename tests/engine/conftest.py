"""The lease-backend matrix: every test taking ``lease_backend`` runs once per real store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from anarchon.engine import LeaseBackend
from anarchon.engine.backends import from_url

LEASE_STORES = ["sqlite", "redis", "postgres"]


def _url_for(request: pytest.FixtureRequest, store: str, tmp_path: Path) -> str:
    if store == "sqlite":
        return f"sqlite://{tmp_path / 'anarchon.db'}"
    if store == "redis":
        return str(request.getfixturevalue("redis_url"))
    if store == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    raise AssertionError(store)


@pytest.fixture(params=LEASE_STORES)
def lease_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of a real lease store, one per parameter."""
    return _url_for(request, str(request.param), tmp_path)


@pytest.fixture
def make_backend(lease_store_url: str) -> Callable[[], LeaseBackend]:
    """A factory of fresh connections to the same store (as separate instances would have)."""

    def make() -> LeaseBackend:
        backend = from_url(lease_store_url)
        assert isinstance(backend, LeaseBackend)
        return backend

    return make


@pytest.fixture
async def lease_backend(make_backend: Callable[[], LeaseBackend]) -> AsyncIterator[LeaseBackend]:
    backend = make_backend()
    await backend.setup()
    yield backend
    await backend.close()


@pytest.fixture
async def private_lease_backend(lease_store_url: str) -> AsyncIterator[LeaseBackend]:
    """A store no other test writes to: a Redis key prefix, a PostgreSQL table of its own (a SQLite
    file is the test's already). For calls over the whole store (forget_unserved), which would
    otherwise meet the jobs an earlier test of the session left there."""
    own = f"t{uuid.uuid4().hex[:10]}"
    scheme = lease_store_url.split(":", 1)[0]
    options = {"redis": {"prefix": own}, "postgresql": {"table": f"{own}_runs"}}.get(scheme, {})
    backend = from_url(lease_store_url, **options)
    assert isinstance(backend, LeaseBackend)
    await backend.setup()
    yield backend
    await backend.close()


@pytest.fixture
def job_name() -> str:
    """A job name no other test uses, so tests share a store without seeing each other."""
    return f"job-{uuid.uuid4().hex[:10]}"
