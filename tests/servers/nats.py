"""A real ``nats-server`` with JetStream on 127.0.0.1 for tests and benchmarks (see README.md).

JetStream stores in a private temporary directory (``-sd``), so every start is an empty store
and nothing touches the system's state. :meth:`NatsServer.restart` keeps the directory (the
streams survive, as after a real restart); :meth:`NatsServer.kill` simulates a crash.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import process
from tests.servers.process import ServerBinaryMissing, ServerProcess, free_port

__all__ = [
    "DEBIAN_PACKAGE",
    "NatsServer",
    "ServerBinaryMissing",
    "free_port",
    "nats_url",
    "server_for",
    "start_or_fail",
]

DEBIAN_PACKAGE = "nats-server"


class NatsServer(ServerProcess):
    """One ``nats-server -js`` process with its own store directory."""

    name = "nats-server"
    log_name = "nats.log"

    def __init__(self, *, port: int | None = None, startup_timeout_s: float = 30.0) -> None:
        binary = shutil.which("nats-server") or next(
            (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.path.exists(p)), None
        )
        if binary is None:
            raise process.missing("nats-server not found", DEBIAN_PACKAGE)
        self.binary = binary
        super().__init__(port=port, startup_timeout_s=startup_timeout_s)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def _command(self, directory: Path) -> list[str]:
        return [self.binary, "-js", "-sd", str(directory / "jetstream"), "-a", self.host, "-p", str(self.port)]

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server greets a client with its INFO line (raw protocol, no client)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                return sock.recv(16).startswith(b"INFO ")
        except OSError:
            return False

    def kill(self) -> None:
        """Die at once, as on a crash (the store directory stays)."""
        self._kill()


def start_or_fail(**kwargs: object) -> NatsServer:
    """Start a server, or fail the test (never skip) naming the package to install."""
    return process.start_or_fail(NatsServer, **kwargs)


_RUNNING: dict[str, NatsServer] = {}


def server_for(url: str) -> NatsServer:
    """The session server behind ``url``, for tests that restart or kill it."""
    return _RUNNING[url]


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """The URL of one nats-server with JetStream shared by the session (tests use distinct jobs)."""
    yield from process.serve(start_or_fail(), _RUNNING)
