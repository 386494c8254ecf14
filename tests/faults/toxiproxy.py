"""TCP faults in front of a real store, with toxiproxy (Shopify/toxiproxy v2).

A store fails in production by its connection failing: refused, reset, frozen, slow, or cut
after the server did the work. :class:`Toxiproxy` runs one ``toxiproxy-server`` on
127.0.0.1 (a free port, its log in a temporary directory, a watchdog like the servers in
``tests/servers``); :meth:`Toxiproxy.proxy` puts a :class:`StoreProxy` in front of one
server port, and a client pointed at :attr:`StoreProxy.listen` reaches the server through
it until a fault is put in the way::

    proxied = redis_behind_proxy                       # the fixture: url, proxy, server
    backend = from_url(proxied.url)
    with proxied.proxy.stall():                        # the server no longer answers
        with pytest.raises(StoreError):
            await backend.ping()
    await backend.ping()                               # healthy again

Each fault method applies the fault at once and returns a :class:`Fault`: use it as a
context manager to remove the fault at the end of the block, or call :meth:`Fault.remove`,
or :meth:`StoreProxy.clear` to remove every fault. Faults apply to open connections too.

What the client sees, and whether the server acted:

- ``down()``: open connections closed, new ones refused. The server saw nothing.
- ``stall()``: nothing, ever (requests and replies dropped, connections open). Nothing.
- ``reset()``: its next write answered by a TCP reset. Nothing.
- ``lose_replies()``: the connection closed as the reply comes. The server executed it.
- ``lose_replies(hang=True)``: no reply, ever (until the client's own timeout). Executed.
- ``latency(ms, jitter)``: every reply ``ms`` (± ``jitter``) late. Executed.

A connection opened during ``stall()``, ``reset()`` or ``lose_replies()`` fails its own
handshake (redis-py's first commands, PostgreSQL's startup), so the server never sees a request on it:
to make the server execute a call whose reply is lost, the client must already hold an
open connection (call ``ping()`` first).

The binary is built from the Go module proxy by ``e2e/controlplane/build-toxiproxy.sh``
(which ``tests/run.sh`` runs) into a cache outside the repository; when it is missing the
fixture fails with that command, it never skips.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.servers import process
from tests.servers.postgres import PostgresServer
from tests.servers.postgres import start_or_fail as start_postgres_or_fail
from tests.servers.process import ServerBinaryMissing, ServerProcess
from tests.servers.redis import RedisServer
from tests.servers.redis import start_or_fail as start_redis

__all__ = [
    "BUILD_COMMAND",
    "Fault",
    "ProxiedStore",
    "StoreProxy",
    "Toxiproxy",
    "ToxiproxyError",
    "ToxiproxyMissing",
    "find_binary",
    "postgres_behind_proxy",
    "proxied_postgres_server",
    "redis_behind_proxy",
    "toxiproxy",
]

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "e2e" / "controlplane" / "build-toxiproxy.sh"
BUILD_COMMAND = "bash e2e/controlplane/build-toxiproxy.sh"
HOST = "127.0.0.1"
_LOOPBACK = {"127.0.0.1", "localhost"}


class ToxiproxyMissing(ServerBinaryMissing):
    """``toxiproxy-server`` is not built yet; the message says how to build it."""


class ToxiproxyError(RuntimeError):
    """The toxiproxy API refused a request (the message has its status and answer)."""


def bin_dir() -> Path:
    """Where build-toxiproxy.sh puts ``toxiproxy-server``; ``ANARCHON_TOXIPROXY_BIN_DIR`` overrides it.

    Asked of the script, as ``controlplane.bin_dir()`` asks build.sh: the version (the cache
    key) stays in one place.
    """
    override = os.environ.get("ANARCHON_TOXIPROXY_BIN_DIR")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], check=True, capture_output=True, text=True, timeout=30
    )
    return Path(out.stdout.strip().splitlines()[-1])


def find_binary() -> Path:
    """The ``toxiproxy-server`` executable, or :class:`ToxiproxyMissing` naming the build command."""
    directory = bin_dir()
    binary = directory / "toxiproxy-server"
    if not os.access(binary, os.X_OK):
        raise ToxiproxyMissing(
            f"toxiproxy-server not found in {directory}: build it with `{BUILD_COMMAND}` "
            "(needs Go; a few seconds, from the Go module proxy; tests/run.sh does it)"
        )
    return binary


def _loopback_only(host: str) -> None:
    if host not in _LOOPBACK:
        raise ValueError(f"toxiproxy is for 127.0.0.1 only, not {host!r}")


class Toxiproxy(ServerProcess):
    """One ``toxiproxy-server`` on 127.0.0.1 and a client for its HTTP API (stdlib urllib only)."""

    name = "toxiproxy-server"
    log_name = "toxiproxy.log"
    own_group = True  # watched: a killed test run does not leave it behind
    ping_timeout_s = 0.5
    poll_interval_s = 0.05
    not_ready = "did not answer GET /version"
    api_timeout_s: ClassVar[float] = 10.0

    def __init__(self, *, binary: Path | None = None, port: int | None = None, startup_timeout_s: float = 10.0) -> None:
        self.binary = binary or find_binary()
        super().__init__(port=port, startup_timeout_s=startup_timeout_s)
        # No proxy from the environment (http_proxy...): the API is on loopback, always.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._names = itertools.count(1)

    @property
    def url(self) -> str:
        """The HTTP API's base URL."""
        return f"http://{self.host}:{self.port}"

    def _command(self, directory: Path) -> list[str]:
        return [str(self.binary), "-host", self.host, "-port", str(self.port)]

    def ping(self, timeout_s: float = 1.0) -> bool:
        try:
            self.request("GET", "/version", timeout_s=timeout_s)
            return True
        except (OSError, ToxiproxyError):
            return False

    # -- the HTTP API ---------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> Any:
        """One API call; the decoded JSON answer (None when empty). Errors raise :class:`ToxiproxyError`."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(req, timeout=timeout_s or self.api_timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(f"toxiproxy {method} {path}: HTTP {exc.code}: {detail}") from None
        if not raw:
            return None
        text = raw.decode()
        try:
            return json.loads(text)
        except ValueError:
            return text  # /version answers plain text in some versions

    def version(self) -> str:
        answer = self.request("GET", "/version")
        return str(answer["version"]) if isinstance(answer, dict) else str(answer)

    def proxies(self) -> dict[str, Any]:
        """Every proxy by name, as the API describes it (listen, upstream, enabled, toxics)."""
        answer = self.request("GET", "/proxies")
        return dict(answer)

    def proxy(self, upstream: int | str, *, label: str = "store") -> StoreProxy:
        """A new proxy to ``upstream`` (a port on 127.0.0.1, or ``"127.0.0.1:PORT"``), on a free port.

        Its name (in the server's log) is ``<label>-<upstream port>-<n>``.
        """
        target = f"{HOST}:{upstream}" if isinstance(upstream, int) else upstream
        host, _, port = target.rpartition(":")
        _loopback_only(host)
        name = f"{label}-{port}-{next(self._names)}"
        created = self.request(
            "POST", "/proxies", {"name": name, "listen": f"{HOST}:0", "upstream": target, "enabled": True}
        )
        return StoreProxy(self, name, str(created["listen"]), target)

    def reset_all(self) -> None:
        """Every proxy enabled, every toxic removed (the API's ``POST /reset``)."""
        self.request("POST", "/reset")


@dataclass
class Fault:
    """A fault applied to a proxy; a context manager that removes it at the end of the block."""

    proxy: StoreProxy
    toxics: list[str]
    disabled: bool = False

    def remove(self) -> None:
        """Remove this fault (only this one); safe to call twice, or after :meth:`StoreProxy.clear`."""
        for toxic in self.toxics:
            self.proxy.remove_toxic(toxic, missing_ok=True)
        self.toxics = []
        if self.disabled:
            self.proxy.up()
            self.disabled = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()


class StoreProxy:
    """One toxiproxy proxy: clients connect to :attr:`listen`, it forwards to :attr:`upstream`."""

    def __init__(self, api: Toxiproxy, name: str, listen: str, upstream: str) -> None:
        self.api = api
        self.name = name
        self.listen = listen  # "127.0.0.1:PORT"
        self.upstream = upstream
        host, _, port = listen.rpartition(":")
        self.host = host
        self.port = int(port)
        self._toxic_names = itertools.count(1)

    def __repr__(self) -> str:
        return f"StoreProxy({self.name!r}, {self.listen} -> {self.upstream})"

    @property
    def _path(self) -> str:
        return f"/proxies/{self.name}"

    def url_for(self, server_url: str) -> str:
        """``server_url`` (e.g. ``redis://127.0.0.1:6379/0``) with its host and port replaced by :attr:`listen`."""
        parts = urlsplit(server_url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{self.listen}"))

    def describe(self) -> dict[str, Any]:
        """The proxy as the API describes it (``enabled``, ``toxics``...)."""
        return dict(self.api.request("GET", self._path))

    # -- toxics -------------------------------------------------------------------------

    def add_toxic(self, kind: str, *, stream: str = "downstream", toxicity: float = 1.0, **attributes: Any) -> str:
        """Add a toxic of any type the server knows (``bandwidth``, ``slicer``...); returns its name.

        ``stream``: ``upstream`` is client -> server (requests), ``downstream`` server -> client
        (replies).
        """
        if stream not in ("upstream", "downstream"):
            raise ValueError(f"stream must be 'upstream' or 'downstream', not {stream!r}")
        name = f"{kind}-{stream}-{next(self._toxic_names)}"
        self.api.request(
            "POST",
            f"{self._path}/toxics",
            {"name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes},
        )
        return name

    def remove_toxic(self, name: str, *, missing_ok: bool = False) -> None:
        try:
            self.api.request("DELETE", f"{self._path}/toxics/{name}")
        except ToxiproxyError as exc:
            if not (missing_ok and "HTTP 404" in str(exc)):
                raise

    def toxics(self) -> list[dict[str, Any]]:
        return list(self.api.request("GET", f"{self._path}/toxics"))

    # -- faults -------------------------------------------------------------------------

    def down(self) -> Fault:
        """Disable the proxy: open connections are closed, new ones refused (the port is closed)."""
        self.api.request("POST", self._path, {"enabled": False})
        return Fault(self, [], disabled=True)

    def up(self) -> None:
        """Enable the proxy again, on the same port."""
        self.api.request("POST", self._path, {"enabled": True})

    def latency(self, ms: int, jitter: int = 0, *, stream: str = "downstream") -> Fault:
        """Every chunk of data on ``stream`` (the replies by default) arrives ``ms`` ± ``jitter`` ms late."""
        return Fault(self, [self.add_toxic("latency", stream=stream, latency=ms, jitter=jitter)])

    def stall(self) -> Fault:
        """A frozen server: requests never reach it and nothing comes back; connections stay open.

        The ``timeout`` toxic with ``timeout=0`` on both streams. Data sent meanwhile is
        dropped, not delayed: after the fault ends, a connection that was used during it is
        out of step (clients throw away a connection whose call timed out anyway).
        """
        return Fault(
            self,
            [self.add_toxic("timeout", stream="upstream", timeout=0), self.add_toxic("timeout", timeout=0)],
        )

    def reset(self) -> Fault:
        """The client's next write is answered by a TCP reset (``reset_peer``); the server never sees it."""
        return Fault(self, [self.add_toxic("reset_peer", stream="upstream", timeout=0)])

    def lose_replies(self, *, hang: bool = False) -> Fault:
        """Requests reach the server and are executed; their replies never reach the client.

        By default (``limit_data`` with ``bytes=0`` on the replies) the connection is closed
        as the first byte of a reply would pass: the client hears "connection closed" at
        once, after the server acted, which is the ambiguous failure a store client must
        handle. ``hang=True`` (``timeout`` with ``timeout=0`` on the replies) drops the
        replies and keeps the connection open: the client waits for its own timeout.
        """
        if hang:
            return Fault(self, [self.add_toxic("timeout", timeout=0)])
        return Fault(self, [self.add_toxic("limit_data", bytes=0)])

    def clear(self) -> None:
        """Remove every fault: every toxic removed, the proxy enabled."""
        for toxic in self.toxics():
            self.remove_toxic(str(toxic["name"]), missing_ok=True)
        self.up()

    def delete(self) -> None:
        """Remove the proxy from the server (its connections are closed); safe to call twice."""
        try:
            self.api.request("DELETE", self._path)
        except ToxiproxyError as exc:
            if "HTTP 404" not in str(exc):
                raise


S = TypeVar("S")


@dataclass
class ProxiedStore(Generic[S]):
    """A real server with a proxy in front: what the ``*_behind_proxy`` fixtures give."""

    url: str
    """The server's URL through the proxy: what the code under test uses."""
    proxy: StoreProxy
    server: S
    """The server itself (``restart()``, ``kill()``...)."""
    direct_url: str
    """The server's own URL, bypassing the proxy: for checking what the server really holds."""


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    """One toxiproxy-server for the session; tests make their own proxies on it."""
    server = process.start_or_fail(Toxiproxy)  # fails (never skips) with the build command if missing
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_behind_proxy(toxiproxy: Toxiproxy) -> Iterator[ProxiedStore[RedisServer]]:
    """A private redis-server (empty; ``server.restart()`` empties it again) behind a fresh proxy."""
    server = start_redis()
    try:
        proxy = toxiproxy.proxy(server.port, label="redis")
        try:
            yield ProxiedStore(proxy.url_for(server.url), proxy, server, server.url)
        finally:
            proxy.delete()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def proxied_postgres_server() -> Iterator[PostgresServer]:
    """The PostgreSQL server of :func:`postgres_behind_proxy`, one per session (initdb takes seconds).

    Not the ``postgres_url`` server: the tests here may kill and restart this one.
    """
    server = start_postgres_or_fail()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_behind_proxy(
    toxiproxy: Toxiproxy, proxied_postgres_server: PostgresServer
) -> Iterator[ProxiedStore[PostgresServer]]:
    """The session's proxied PostgreSQL server behind a fresh proxy; tests share its database.

    Use your own job names. A test may ``server.kill()`` or ``restart()`` it: it is started
    again (same port, same data) after the test.
    """
    server = proxied_postgres_server
    server.start()  # a no-op unless an earlier test left it killed
    proxy = toxiproxy.proxy(server.port, label="postgres")
    try:
        yield ProxiedStore(proxy.url_for(server.url), proxy, server, server.url)
    finally:
        try:
            proxy.delete()
        finally:
            server.start()
