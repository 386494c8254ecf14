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
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

DEBIAN_PACKAGE = "redis-server"


class ServerBinaryMissing(RuntimeError):
    """The server's executable is not installed; the message names the Debian package."""


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process in its own temporary directory."""

    def __init__(
        self, *, port: int | None = None, startup_timeout_s: float = 10.0, extra_args: list[str] | None = None
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerBinaryMissing(
                f"redis-server not found on PATH: install the Debian package {DEBIAN_PACKAGE!r}"
                f" (apt-get install -y {DEBIAN_PACKAGE})"
            )
        self.binary = binary
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args or [])  # e.g. ["--cluster-enabled", "yes"]
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> RedisServer:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="anarchon-redis-"))
        log = open(self._dir / "redis.log", "ab")  # noqa: SIM115 - handed to the child process
        try:
            self._proc = subprocess.Popen(
                [
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
                    str(self._dir),
                    "--daemonize",
                    "no",
                    "--logfile",
                    "",
                    *self.extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
            )
        finally:
            log.close()
        self._wait_ready()
        return self

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "redis.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server answers PING (a raw RESP exchange, no client library)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}:\n{self._log_tail()}")
            if self.ping(0.2):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING:\n{self._log_tail()}")

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
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a paused process must be able to die
            self._proc.kill()
        self._proc.wait(timeout=10)
        self._proc = None

    def restart(self) -> None:
        """Kill if running, then start again on the same port with an empty store."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Stop the server and delete its directory; safe to call twice."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGCONT)
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_or_fail(**kwargs: object) -> RedisServer:
    """Start a server, or fail the test (never skip) naming the package to install."""
    try:
        server = RedisServer(**kwargs)  # type: ignore[arg-type]
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    return server.start()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of one redis-server shared by the session; tests isolate by key prefix."""
    server = start_or_fail()
    try:
        yield server.url
    finally:
        server.stop()
