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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import process
from tests.servers.process import ServerBinaryMissing, ServerProcess, free_port

__all__ = [
    "DEBIAN_PACKAGE",
    "RabbitMQServer",
    "ServerBinaryMissing",
    "amqp_url",
    "free_port",
    "server_for",
    "start_or_fail",
]

DEBIAN_PACKAGE = "rabbitmq-server"
_BIN_DIR = Path("/usr/lib/rabbitmq/bin")
# AMQP 0-9-1 protocol header; a ready broker answers with a Connection.Start method frame (type 1).
_AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


class RabbitMQServer(ServerProcess):
    """One private RabbitMQ node, with its own epmd."""

    name = "rabbitmq-server"
    log_name = "server.log"
    log_tail_chars = 3000
    ping_timeout_s = 1.0
    poll_interval_s = 0.25
    not_ready = "was not ready in time"

    def __init__(self, *, port: int | None = None, startup_timeout_s: float = 90.0) -> None:
        server = _BIN_DIR / "rabbitmq-server"
        ctl = _BIN_DIR / "rabbitmqctl"
        if not server.exists() or not ctl.exists() or shutil.which("erl") is None:
            raise process.missing(f"rabbitmq-server not found under {_BIN_DIR}", DEBIAN_PACKAGE)
        self.server_bin = str(server)
        self.ctl_bin = str(ctl)
        super().__init__(port=port, startup_timeout_s=startup_timeout_s)
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"anarchon-test-{self.port}@localhost"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

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

    def _prepare(self, directory: Path) -> None:
        (directory / "enabled_plugins").write_text("[].\n")
        (directory / "advanced.config").write_text("[].\n")
        # The guest user is allowed from loopback only, which is where the tests connect.
        (directory / "rabbitmq.conf").write_text("log.console = false\nlog.file.level = info\n")

    def _command(self, directory: Path) -> list[str]:
        return [self.server_bin]

    def _watch(self, group: int) -> subprocess.Popen[bytes]:
        """The watchdog also kills the node's epmd: a 200 MB Erlang VM and an epmd are left otherwise."""
        epmd = shutil.which("epmd") or "epmd"
        # epmd refuses -kill while the dead node is still registered; that takes a moment.
        then = f"for i in 1 2 3 4 5; do sleep 1; {epmd} -kill >/dev/null 2>&1 && break; done"
        return process.watch(os.getpid(), group, env=self._env(), then=then)

    def ping(self, timeout_s: float = 1.0) -> bool:
        """True when the broker answers the AMQP protocol header with Connection.Start."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                sock.sendall(_AMQP_HEADER)
                return sock.recv(1)[:1] == b"\x01"
        except OSError:
            return False

    def _on_not_ready(self) -> None:
        self._kill_node()

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
        self._stop_watcher()
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
        self._remove_dir()


def start_or_fail(**kwargs: object) -> RabbitMQServer:
    """Start a server, or fail the test (never skip) naming the package to install."""
    return process.start_or_fail(RabbitMQServer, **kwargs)


_RUNNING: dict[str, RabbitMQServer] = {}


def server_for(url: str) -> RabbitMQServer:
    """The session server behind ``url``, for tests that restart it or call rabbitmqctl."""
    return _RUNNING[url]


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """The URL of one private RabbitMQ node shared by the session (tests use distinct jobs)."""
    yield from process.serve(start_or_fail(), _RUNNING)
