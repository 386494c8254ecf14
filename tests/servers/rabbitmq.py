"""A real, private ``rabbitmq-server`` node on 127.0.0.1 for tests and benchmarks (see README.md).

The node shares nothing with a system RabbitMQ: its own node name
(``anarchon-test-<port>@localhost``), AMQP and distribution ports, Mnesia, log and config in
a temporary directory, ``HOME`` there too (so the Erlang cookie is private) and its own
``epmd`` on a private port (``ERL_EPMD_PORT``), which :meth:`RabbitMQServer.stop` kills
again. It runs as the current user: ``/usr/sbin/rabbitmq-server`` would switch to the
``rabbitmq`` user, so the script under ``/usr/lib/rabbitmq/bin`` is started directly.

RabbitMQ boots slowly (10-20 s; more on a busy machine), hence the 90 s default timeout.
:meth:`RabbitMQServer.restart` stops and starts the node on the same ports and data, as a
broker restart would (durable queues and persistent messages survive).
"""

from __future__ import annotations

import contextlib
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

DEBIAN_PACKAGE = "rabbitmq-server"
_BIN_DIR = Path("/usr/lib/rabbitmq/bin")
# AMQP 0-9-1 protocol header; a ready broker answers with a Connection.Start method frame (type 1).
_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


class ServerBinaryMissing(RuntimeError):
    """The server's executable is not installed; the message names the Debian package."""


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RabbitMQServer:
    """One private RabbitMQ node, with its own epmd."""

    def __init__(self, *, port: int | None = None, startup_timeout_s: float = 90.0) -> None:
        server = _BIN_DIR / "rabbitmq-server"
        ctl = _BIN_DIR / "rabbitmqctl"
        if not server.exists() or not ctl.exists() or shutil.which("erl") is None:
            raise ServerBinaryMissing(
                f"rabbitmq-server not found under {_BIN_DIR}: install the Debian package {DEBIAN_PACKAGE!r}"
                f" (apt-get install -y {DEBIAN_PACKAGE})"
            )
        self.server_bin = str(server)
        self.ctl_bin = str(ctl)
        self.port = port or free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.host = "127.0.0.1"
        self.node = f"anarchon-test-{self.port}@localhost"
        self.startup_timeout_s = startup_timeout_s
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._watcher: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _env(self) -> dict[str, str]:
        assert self._dir is not None
        env = dict(os.environ)
        env.update(
            HOME=str(self._dir),
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS=self.host,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self._dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self._dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self._dir / "rabbitmq"),  # .conf is appended
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self._dir / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self._dir / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self._dir / "rabbitmq.pid"),
        )
        return env

    def start(self) -> RabbitMQServer:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="anarchon-rabbitmq-"))
            (self._dir / "enabled_plugins").write_text("[].\n")
            (self._dir / "advanced.config").write_text("[].\n")
            # The guest user is allowed from loopback only, which is where the tests connect.
            (self._dir / "rabbitmq.conf").write_text("log.console = false\nlog.file.level = info\n")
        log = open(self._dir / "server.log", "ab")  # noqa: SIM115 - handed to the child process
        try:
            self._proc = subprocess.Popen(
                [self.server_bin],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                env=self._env(),
                start_new_session=True,  # a process group of our own, to kill all of it on stop
            )
        finally:
            log.close()
        self._watcher = _watch(os.getpid(), self._proc.pid, self._env())
        self._wait_ready()
        return self

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        try:
            return (self._dir / "server.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the broker answers the AMQP protocol header with Connection.Start."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                sock.sendall(_AMQP_HEADER)
                return sock.recv(1)[:1] == b"\x01"
        except OSError:
            return False

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited with {self._proc.returncode}:\n{self._log_tail()}")
            if self.ping(1.0):
                return
            time.sleep(0.25)
        self._kill_node()
        raise RuntimeError(f"rabbitmq-server on port {self.port} was not ready in time:\n{self._log_tail()}")

    def ctl(self, *args: str, timeout_s: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <node> <args>`` against this node; returns its output."""
        result = subprocess.run(
            [self.ctl_bin, "-n", self.node, *args],
            env=self._env(),
            cwd=self._dir,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {result.stdout!r} {result.stderr!r}")
        return result.stdout.decode(errors="replace")

    def _kill_node(self) -> None:
        """Stop the node: politely via rabbitmqctl, then its whole process group."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.kill()
            watcher.wait(timeout=10)
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, OSError):
                self.ctl("stop", timeout_s=60)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created: beam, its helpers
        proc.wait(timeout=10)

    def _kill_epmd(self) -> None:
        """Kill the epmd the node started on our private port (``epmd -daemon`` leaves our group)."""
        epmd = shutil.which("epmd")
        if epmd is None or self._dir is None:
            return
        subprocess.run([epmd, "-kill"], env=self._env(), capture_output=True, timeout=10, check=False)

    def restart(self) -> None:
        """Stop the node and start it again on the same ports with the same data."""
        self._kill_node()
        self.start()

    def stop(self) -> None:
        """Stop the node and its epmd and delete the directory; safe to call twice."""
        self._kill_node()
        self._kill_epmd()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RabbitMQServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _watch(owner_pid: int, group: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A tiny watchdog that kills the node's process group and its epmd if ``owner_pid`` dies.

    A test run killed without clean-up (SIGKILL, or SIGTERM from ``timeout``) would otherwise
    leave a 200 MB Erlang VM and an epmd behind. The watchdog is in a session of its own, so
    a normal stop kills it first and then the group.
    """
    epmd = shutil.which("epmd") or "epmd"
    script = (
        f"while kill -0 {owner_pid} 2>/dev/null; do sleep 2; done;"
        f" kill -KILL -{group} 2>/dev/null;"
        # epmd refuses -kill while the dead node is still registered; that takes a moment.
        f" for i in 1 2 3 4 5; do sleep 1; {epmd} -kill >/dev/null 2>&1 && break; done"
    )
    return subprocess.Popen(
        ["sh", "-c", script],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def start_or_fail(**kwargs: object) -> RabbitMQServer:
    """Start a server, or fail the test (never skip) naming the package to install."""
    try:
        server = RabbitMQServer(**kwargs)  # type: ignore[arg-type]
    except ServerBinaryMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise


_RUNNING: dict[str, RabbitMQServer] = {}


def server_for(url: str) -> RabbitMQServer:
    """The session server behind ``url``, for tests that restart it or call rabbitmqctl."""
    return _RUNNING[url]


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """The URL of one private RabbitMQ node shared by the session (tests use distinct jobs)."""
    server = start_or_fail()
    _RUNNING[server.url] = server
    try:
        yield server.url
    finally:
        _RUNNING.pop(server.url, None)
        server.stop()
