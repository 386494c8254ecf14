"""The process life cycle the server launchers here share (see README.md here).

:class:`ServerProcess` runs one server process in its own temporary directory on 127.0.0.1:
a free port, the server's output in a log file there, a wait until :meth:`~ServerProcess.ping`
answers (or the process exits, or the start-up time runs out, each reported with the log's
tail), and stop, kill and restart. A server may run in a process group of its own, watched
by :func:`watch`, so that a test run killed without clean-up does not leave it behind.
Each module (``redis.py``, ``nats.py``, ``rabbitmq.py``) adds the command line, the
readiness probe and the URL; :func:`start_or_fail` and :func:`serve` are the fixtures' part.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

import pytest


class ServerBinaryMissing(RuntimeError):
    """The server's executable is not installed; the message names the Debian package."""


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def missing(what: str, package: str) -> ServerBinaryMissing:
    """The error for a server that is not installed: ``what``, then the Debian package to install."""
    return ServerBinaryMissing(f"{what}: install the Debian package {package!r} (apt-get install -y {package})")


def watch(owner_pid: int, group: int, *, env: dict[str, str] | None = None, then: str = "") -> subprocess.Popen[bytes]:
    """A tiny watchdog that kills the process group ``group`` if ``owner_pid`` dies without cleaning up.

    A test run killed by SIGKILL, or SIGTERM from ``timeout``, never reaches the fixture's
    teardown. The watchdog is in a session of its own; a normal stop kills it first. ``then``
    is shell run after the kill (with ``env``), for what the server leaves outside its group.
    """
    script = f"while kill -0 {owner_pid} 2>/dev/null; do sleep 2; done; kill -KILL -{group} 2>/dev/null"
    if then:
        script = f"{script}; {then}"
    return subprocess.Popen(
        ["sh", "-c", script],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


class ServerProcess(ABC):
    """One server process with its own temporary directory; subclasses say how to run and probe it."""

    name: ClassVar[str]
    """The server as named in messages, e.g. ``redis-server``."""
    log_name: ClassVar[str]
    """The file in the directory that takes the server's stdout and stderr."""
    own_group: ClassVar[bool] = True
    """Run in a process group of its own, watched by :func:`watch`."""
    log_tail_chars: ClassVar[int] = 2000
    ping_timeout_s: ClassVar[float] = 0.5
    poll_interval_s: ClassVar[float] = 0.05
    not_ready: ClassVar[str] = "did not answer"
    """How the start-up error says that the server never answered :meth:`ping`."""

    def __init__(self, *, port: int | None, startup_timeout_s: float) -> None:
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.startup_timeout_s = startup_timeout_s
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._watcher: subprocess.Popen[bytes] | None = None

    @property
    @abstractmethod
    def url(self) -> str: ...

    @abstractmethod
    def _command(self, directory: Path) -> list[str]:
        """The command line that runs the server in the foreground."""

    @abstractmethod
    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the server answers on its port."""

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _prepare(self, directory: Path) -> None:
        """Fill a freshly made directory before the first start (config files); nothing by default."""
        return None

    def _env(self) -> dict[str, str] | None:
        """The server's environment; None inherits ours."""
        return None

    def _watch(self, group: int) -> subprocess.Popen[bytes]:
        return watch(os.getpid(), group)

    def _on_not_ready(self) -> None:
        """Called when the server did not answer in time, before the error is raised; nothing by default."""
        return None

    def start(self) -> Self:
        """Start the server (in the directory of an earlier start, if any) and wait until it answers."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"anarchon-{self.name.removesuffix('-server')}-"))
            self._prepare(self._dir)
        log = open(self._dir / self.log_name, "ab")  # noqa: SIM115 - handed to the child process
        try:
            self._proc = subprocess.Popen(
                self._command(self._dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                env=self._env(),
                start_new_session=self.own_group,  # a process group of our own, for the watchdog and stop
            )
        finally:
            log.close()
        if self.own_group:
            self._watcher = self._watch(self._proc.pid)
        self._wait_ready()
        return self

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / self.log_name).read_text(errors="replace")[-self.log_tail_chars :]
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode}:\n{self._log_tail()}")
            if self.ping(self.ping_timeout_s):
                return
            time.sleep(self.poll_interval_s)
        self._on_not_ready()
        raise RuntimeError(f"{self.name} on port {self.port} {self.not_ready}:\n{self._log_tail()}")

    def _stop_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill()
            watcher.wait(timeout=10)

    def _kill(self) -> None:
        """SIGKILL the server at once, as on a crash (the directory stays)."""
        self._stop_watcher()
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a paused process must be able to die
            self._proc.kill()
        self._proc.wait(timeout=10)
        self._proc = None

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def restart(self) -> None:
        """Kill if running, then start again on the same port (and in the same directory)."""
        self._kill()
        self.start()

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s) and delete its directory; safe to call twice."""
        self._stop_watcher()
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
        self._remove_dir()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


S = TypeVar("S", bound=ServerProcess)


def start_or_fail(cls: type[S], **kwargs: Any) -> S:
    """Start a server, or fail the test (never skip) naming the package to install."""
    try:
        server = cls(**kwargs)
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise


def serve(server: S, running: dict[str, S] | None = None) -> Iterator[str]:
    """A session fixture's body: yield the started server's URL, then stop it.

    With ``running``, the server is listed there by URL meanwhile (for ``server_for``).
    """
    if running is not None:
        running[server.url] = server
    try:
        yield server.url
    finally:
        if running is not None:
            running.pop(server.url, None)
        server.stop()
