"""Built-in backends. Each module imports its client library lazily, so the engine itself
depends on none of them; :func:`anarchon.engine.backends.from_url` picks one by URL."""

from __future__ import annotations

from ..backend import Backend
from ..errors import ConfigError
from ._urls import check_hosts, sqlite_path


def from_url(url: str, **options: object) -> Backend:
    """Make a backend from a URL.

    ``sqlite:///path/to/file.db``, ``redis://host:6379/0`` (lease strategy),
    ``redis+script://``, ``redis+stream://``, ``redis+idmp://`` (claim-only strategies),
    ``postgresql://user@host/db``, ``nats://host:4222``, ``amqp://user:pw@host/``.

    A URL that cannot work (a port that is not a number, a relative SQLite path) raises
    :class:`ConfigError` here, before any connection is tried.
    """
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from .sqlite import SqliteBackend

        return SqliteBackend(sqlite_path(url), **options)  # type: ignore[arg-type]
    if "://" in url:
        check_hosts(url)
    if scheme in ("redis", "rediss"):
        from .redis import RedisBackend

        return RedisBackend(url, **options)  # type: ignore[arg-type]
    if scheme.startswith("redis+") or scheme.startswith("rediss+"):
        from .redis_claim import redis_claim_backend

        return redis_claim_backend(url, **options)
    if scheme in ("postgres", "postgresql"):
        from .postgres import PostgresBackend

        return PostgresBackend(url, **options)  # type: ignore[arg-type]
    if scheme in ("nats", "tls"):
        from .nats import NatsBackend

        return NatsBackend(url, **options)  # type: ignore[arg-type]
    if scheme in ("amqp", "amqps"):
        from .rabbitmq import RabbitMQBackend

        return RabbitMQBackend(url, **options)  # type: ignore[arg-type]
    raise ConfigError(
        f"unknown store URL scheme {scheme!r}; use sqlite, redis, redis+script, redis+stream, redis+idmp,"
        " postgresql, nats or amqp"
    )
