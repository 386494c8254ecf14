"""A real ``nats-server`` with JetStream on 127.0.0.1 for tests and benchmarks (see README.md).

JetStream stores in a private temporary directory (``-sd``), so every start is an empty store
and nothing touches the system's state. :meth:`NatsServer.restart` keeps the directory (the
streams survive, as after a real restart); :meth:`NatsServer.kill` simulates a crash.
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

DEBIAN_PACKAGE = "nats-server"


class ServerBinaryMissing(RuntimeError):
    """The server's executable is not installed; the message names the Debian package."""


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsServer:
    """One ``nats-server -js`` process with its own store directory."""

    def __init__(self, *, port: int | None = None, startup_timeout_s: float = 30.0) -> None:
        binary = shutil.which("nats-server") or next(
            (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.path.exists(p)), None
        )
        if binary is None:
            raise ServerBinaryMissing(
                f"nats-server not found: install the Debian package {DEBIAN_PACKAGE!r}"
                f" (apt-get install -y {DEBIAN_PACKAGE})"
            )
        self.binary = binary
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.startup_timeout_s = startup_timeout_s
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._watcher: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> NatsServer:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="anarchon-nats-"))
        log = open(self._dir / "nats.log", "ab")  # noqa: SIM115 - handed to the child process
        try:
            self._proc = subprocess.Popen(
                [self.binary, "-js", "-sd", str(self._dir / "jetstream"), "-a", self.host, "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,  # its own group, for the watchdog
            )
        finally:
            log.close()
        self._watcher = _watch(os.getpid(), self._proc.pid)
        self._wait_ready()
        return self

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "nats.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server greets a client with its INFO line (raw protocol, no client)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                return sock.recv(16).startswith(b"INFO ")
        except OSError:
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}:\n{self._log_tail()}")
            if self.ping(0.5):
                return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server on port {self.port} did not answer:\n{self._log_tail()}")

    def _stop_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill()
            watcher.wait(timeout=10)

    def kill(self) -> None:
        """Die at once, as on a crash (the store directory stays)."""
        self._stop_watcher()
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
            self._proc.kill()
        self._proc.wait(timeout=10)
        self._proc = None

    def restart(self) -> None:
        """Kill if running, then start again on the same port with the same store."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Stop the server and delete its directory; safe to call twice."""
        self._stop_watcher()
        if self._proc is not None:
            if self._proc.poll() is None:
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

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _watch(owner_pid: int, group: int) -> subprocess.Popen[bytes]:
    """A tiny watchdog that kills the server if ``owner_pid`` dies without cleaning up.

    A test run killed by SIGKILL, or SIGTERM from ``timeout``, never reaches the fixture's
    teardown. The watchdog is in a session of its own; a normal stop kills it first.
    """
    return subprocess.Popen(
        ["sh", "-c", f"while kill -0 {owner_pid} 2>/dev/null; do sleep 2; done; kill -KILL -{group} 2>/dev/null"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def start_or_fail(**kwargs: object) -> NatsServer:
    """Start a server, or fail the test (never skip) naming the package to install."""
    try:
        server = NatsServer(**kwargs)  # type: ignore[arg-type]
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    return server.start()


_RUNNING: dict[str, NatsServer] = {}


def server_for(url: str) -> NatsServer:
    """The session server behind ``url``, for tests that restart or kill it."""
    return _RUNNING[url]


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """The URL of one nats-server with JetStream shared by the session (tests use distinct jobs)."""
    server = start_or_fail()
    _RUNNING[server.url] = server
    try:
        yield server.url
    finally:
        _RUNNING.pop(server.url, None)
        server.stop()
