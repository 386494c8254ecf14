"""A real ``redis-server`` on 127.0.0.1 for tests and benchmarks (see README.md here).

Persistence is off (``--save '' --appendonly no``): every start is an empty store, and
nothing is written to disk while benchmarks measure. Outage tests use :meth:`pause`
(SIGSTOP: the port accepts connections but nothing answers, like a frozen server),
:meth:`kill` (SIGKILL: connections are refused) and :meth:`restart` (same port, so the
clients' URL stays valid, and an empty store, like a failover to a fresh replica).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import process
from tests.servers.process import ServerBinaryMissing, ServerProcess, free_port

__all__ = ["DEBIAN_PACKAGE", "RedisServer", "ServerBinaryMissing", "free_port", "redis_url", "start_or_fail"]

DEBIAN_PACKAGE = "redis-server"


class RedisServer(ServerProcess):
    """One ``redis-server`` process in its own temporary directory."""

    name = "redis-server"
    log_name = "redis.log"
    own_group = False  # not watched: redis-server forks nothing
    ping_timeout_s = 0.2
    poll_interval_s = 0.02
    not_ready = "did not answer PING"

    def __init__(
        self, *, port: int | None = None, startup_timeout_s: float = 10.0, extra_args: list[str] | None = None
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise process.missing("redis-server not found on PATH", DEBIAN_PACKAGE)
        self.binary = binary
        super().__init__(port=port, startup_timeout_s=startup_timeout_s)
        self.extra_args = list(extra_args or [])  # e.g. ["--cluster-enabled", "yes"]

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _command(self, directory: Path) -> list[str]:
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--daemonize",
            "no",
            "--logfile",
            "",
            *self.extra_args,
        ]

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server answers PING (a raw RESP exchange, no client library)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _signal(self, sig: signal.Signals) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("redis-server is not running")
        os.kill(self._proc.pid, sig)

    def pause(self) -> None:
        """Freeze the server: connections are accepted by the kernel, nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """Die at once, as on a crash: connections are reset, new ones refused."""
        self._kill()


def start_or_fail(**kwargs: object) -> RedisServer:
    """Start a server, or fail the test (never skip) naming the package to install."""
    return process.start_or_fail(RedisServer, **kwargs)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of one redis-server shared by the session; tests isolate by key prefix."""
    yield from process.serve(start_or_fail())
