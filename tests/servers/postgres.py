"""A real, throwaway PostgreSQL server for the tests and the benchmarks.

``initdb`` into a temporary directory, start on 127.0.0.1 with a free port, and create the
``anarchon`` database. The cluster is tuned for tests, not for safety: ``fsync=off`` and
``full_page_writes=off`` make commits cheap, which is fine for data that is deleted at the
end of the run. ``synchronous_commit`` stays on: with fsync off it costs one write() to the
page cache per commit, and it makes a committed transaction survive :meth:`kill`, as it
would survive a real crash. Authentication is ``trust`` so that no password exists to leak
into logs.

PostgreSQL refuses to run as root. When the tests run as root (containers, CI), every
server command runs as the ``postgres`` system user (created by Debian's ``postgresql``
package, or here if it is missing) and the temporary directory is handed to that user.

:meth:`PostgresServer.kill` and :meth:`PostgresServer.restart` simulate an outage: an
immediate shutdown (SIGQUIT, no checkpoint, every backend dies as in a crash) and a start
again on the same port, so that clients holding the old URL can reconnect.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.servers.process import free_port

PACKAGE_HINT = "install the Debian package `postgresql` (apt-get install postgresql), which .ci/run does"
SERVICE_USER = "postgres"


class ServerUnavailable(RuntimeError):
    """The server binaries are missing or the server did not come up."""


def _find_bindir() -> Path:
    """The directory holding initdb and pg_ctl: on PATH, else Debian's versioned directory.

    Debian puts the server binaries in /usr/lib/postgresql/<major>/bin and only some client
    wrappers on PATH, so PATH alone is not enough; the newest major version wins.
    """
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("pg_ctl") is not None:
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if not candidates:
        raise ServerUnavailable(f"PostgreSQL server binaries (initdb, pg_ctl) not found; {PACKAGE_HINT}")
    return Path(candidates[-1]).parent


def _service_account() -> pwd.struct_passwd | None:
    """The account to run the server as, or None to run as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        # Debian's package creates this user; without the package (binaries copied in some
        # other way) make a system account, since postgres will not start as root.
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory; ``.url`` once started.

    Usable as a context manager (the benchmarks) or through the session fixture
    :func:`postgres_url` (the tests).
    """

    database = "anarchon"

    def __init__(self, *, port: int | None = None, max_connections: int = 300, start_timeout_s: float = 60.0) -> None:
        self._bindir = _find_bindir()
        self._account = _service_account()
        self._requested_port = port
        self.port = 0
        self._max_connections = max_connections
        self._start_timeout_s = start_timeout_s
        self._tmp: Path | None = None
        self._running = False

    # -- paths and commands -------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._tmp is None or not self.port:
            raise ServerUnavailable("PostgresServer.url read before start()")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def admin_url(self) -> str:
        """The maintenance database, for creating and dropping databases."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def _data(self) -> Path:
        assert self._tmp is not None
        return self._tmp / "data"

    @property
    def _log(self) -> Path:
        assert self._tmp is not None
        return self._tmp / "server.log"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a server binary, as the postgres user when we are root."""
        assert self._tmp is not None
        kwargs: dict[str, Any] = {}
        if self._account is not None:
            kwargs = {"user": self._account.pw_uid, "group": self._account.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "HOME": str(self._tmp)}
        proc = subprocess.run(
            [str(self._bindir / args[0]), *args[1:]],
            cwd=self._tmp,  # root's cwd may not be readable by the postgres user
            env=env,
            capture_output=True,
            text=True,
            check=False,
            **kwargs,
        )
        if check and proc.returncode != 0:
            output = proc.stderr.strip() or proc.stdout.strip()
            raise ServerUnavailable(f"{args[0]} failed ({proc.returncode}): {output}\n{self._log_tail()}")
        return proc

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> PostgresServer:
        """initdb, start, create the database; returns self once it accepts connections."""
        if self._running:
            return self
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="anarchon-pg-"))
            if self._account is not None:
                os.chown(self._tmp, self._account.pw_uid, self._account.pw_gid)
            self._run(
                "initdb",
                "-D",
                str(self._data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
        # A free port can be taken by someone else between our probe and the bind; the
        # first start retries on another port (restarts must keep theirs).
        attempts = 1 if (self._requested_port or self.port) else 5
        for attempt in range(attempts):
            self.port = self._requested_port or self.port or free_port()
            try:
                self._pg_ctl_start()
                break
            except ServerUnavailable:
                if attempt == attempts - 1:
                    raise
                self.port = 0
        self._running = True
        self._create_database()
        return self

    def _pg_ctl_start(self) -> None:
        assert self._tmp is not None
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                f"-c unix_socket_directories={self._tmp}",
                f"-c max_connections={self._max_connections}",
                "-c fsync=off",
                "-c full_page_writes=off",
                "-c shared_buffers=64MB",
            ]
        )
        self._run(
            "pg_ctl",
            "start",
            "-D",
            str(self._data),
            "-l",
            str(self._log),
            "-w",
            "-t",
            str(int(self._start_timeout_s)),
            "-o",
            options,
        )

    def _create_database(self) -> None:
        """Create the database once the server answers (pg_ctl -w already waited for it)."""
        import psycopg

        deadline = time.monotonic() + self._start_timeout_s
        while True:
            try:
                with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
                    if exists is None:
                        conn.execute(f'CREATE DATABASE "{self.database}"')
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise ServerUnavailable(f"postgres on port {self.port} did not accept connections: {exc}") from exc
                time.sleep(0.1)

    def kill(self) -> None:
        """Stop at once, like a crash: every connection breaks, nothing is checkpointed."""
        if self._running:
            self._run("pg_ctl", "stop", "-D", str(self._data), "-m", "immediate", "-w")
            self._running = False

    def _pids(self) -> list[int]:
        """The postmaster and every process it forked (backends, writers)."""
        try:
            postmaster = int((self._data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(stat.parent.name))
        return pids

    def pause(self) -> None:
        """Freeze the whole server (SIGSTOP to every process): connections open, nothing answers."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def restart(self) -> None:
        """Start again on the same port with the same data (after :meth:`kill` or not)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Shut down and delete the cluster."""
        if self._running:
            self._run("pg_ctl", "stop", "-D", str(self._data), "-m", "fast", "-w", check=False)
            self._running = False
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_or_fail() -> PostgresServer:
    """A started server of the caller's own, or the test fails (never skips) saying why."""
    server: PostgresServer | None = None
    try:
        server = PostgresServer()
        return server.start()
    except ServerUnavailable as exc:
        if server is not None:
            server.stop()
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of one PostgreSQL server shared by the whole session.

    Tests share the database, so each must use its own job names (or its own table).
    Missing binaries fail the session's postgres tests rather than skipping them.
    """
    server = start_or_fail()
    try:
        yield server.url
    finally:
        server.stop()
