"""The contract between ``bench/bench_claims.py`` and one store's benchmark case.

A case is a module ``bench/cases/<name>.py`` (names starting with ``_`` are ignored) that
defines::

    DESCRIPTION = "one line shown in the report"      # optional

    @contextlib.asynccontextmanager
    async def case() -> AsyncIterator[BenchCase]:
        # start the server (tests/servers/<name>.py), make the backend, set it up ...
        yield BenchCase(backend=..., raw=..., raw_label=...)
        # ... close the backend, stop the server

``raw(i)`` is one round trip of the store's own cheapest "insert unless present" through the
same client the backend uses (Redis ``SET NX``, PostgreSQL ``INSERT ... ON CONFLICT DO
NOTHING``, SQLite ``INSERT OR IGNORE``), with ``i`` unique per call (a non-negative int
below 2**53) so every call inserts.
It is the yardstick: the ratio claims/s ÷ raw ops/s says how much of the store's own speed
the backend keeps, independently of how fast the machine is.

Adding a store means adding one module here; ``bench_claims.py`` discovers it by name
(``--backends <name>``). A case whose server binary or client library is missing should
raise :class:`CaseUnavailable` (or any ImportError) from ``case()``: the run reports it and
goes on with the other stores; :func:`local_server` (and :func:`local_redis`) start a server
from ``tests/servers`` that way.
"""

from __future__ import annotations

import contextlib
import importlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from anarchon.engine import Backend, LeaseBackend

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from tests.servers.process import ServerProcess
    from tests.servers.redis import RedisServer

S = TypeVar("S", bound="ServerProcess")


class CaseUnavailable(RuntimeError):
    """This store cannot be benchmarked here (binary or library missing); the reason says why."""


@dataclass
class BenchCase:
    """A ready backend and its store's raw round trip, both on the same server."""

    backend: Backend
    raw: Callable[[int], Awaitable[object]]
    raw_label: str
    target_ratio: float | None = 0.5  # claims/s ÷ raw ops/s should reach this (issue 2)
    target_p99_ms: float | None = None  # slot→claim delay p99 target, if the store has one
    # Another, not yet set-up backend on the same store, as another instance would have; it
    # enables --contenders. The benchmark sets up and closes what it makes.
    make_backend: Callable[[], Backend] | None = None


@contextlib.contextmanager
def local_server(make: Callable[[], S]) -> Iterator[S]:
    """Run the server that ``make()`` creates (a ``tests/servers`` class) for the ``with`` block.

    A missing server binary (:class:`~tests.servers.process.ServerBinaryMissing` from ``make()``)
    becomes :class:`CaseUnavailable`; the server is started on entry and stopped on exit.
    """
    from tests.servers.process import ServerBinaryMissing

    try:
        server = make()
    except ServerBinaryMissing as exc:
        raise CaseUnavailable(str(exc)) from exc
    with server:
        yield server


@contextlib.contextmanager
def local_redis() -> Iterator[RedisServer]:
    """A local ``redis-server`` (default options) for the ``with`` block; see :func:`local_server`."""
    from tests.servers.redis import RedisServer

    with local_server(RedisServer) as server:
        yield server


def redis_set_nx(client: Redis) -> Callable[[int], Awaitable[object]]:
    """``raw`` for Redis: ``SET <key> 1 NX PX``, its cheapest "insert unless present" (one command, one round trip).

    Each ``i`` is its own key under a fresh prefix; ``client`` is the one the backend uses.
    """
    prefix = f"bench-raw-{uuid.uuid4().hex[:8]}:"

    async def raw(i: int) -> object:
        return await client.set(f"{prefix}{i}", "1", nx=True, px=600_000)

    return raw


@contextlib.asynccontextmanager
async def lease_store(name: str) -> AsyncIterator[LeaseBackend]:
    """The set-up lease backend of case ``name``, on its own fresh server, for benchmarks of the engine.

    Raises :class:`CaseUnavailable` (or ImportError) when it cannot run here, or the case's
    store keeps no leases.
    """
    module = importlib.import_module(f"bench.cases.{name}")
    async with module.case() as case:
        if not isinstance(case.backend, LeaseBackend):
            raise CaseUnavailable(f"{name} is not a lease store")
        yield case.backend
