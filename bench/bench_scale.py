#!/usr/bin/env python
"""N jobs on ``* * * * *``: CronJob's controller and Anarchon side by side on one control plane.

Run from the repository root, after ``bash tests/run.sh`` has built the control plane once::

    PYTHONPATH=operator:. python bench/bench_scale.py [--jobs 100,1000] [--minutes 3] [--store redis]

One test control plane (kube-apiserver with an audit log, kube-controller-manager at its default
client limits, KWOK nodes: Pods "run" 1 s) serves both sides in turn, each N (below). Its 3 nodes
hold the largest N's Pods each: at a real node's 110, the cluster held 330 Pods at once, and at
N = 1,000 a third of Anarchon's Pods (started within seconds of their slot, where CronJob's
trickle in) waited Unschedulable ("Too many pods"); each runner then wrote the reason to its run
and posted an Event, and wrote again when the Pod started: 0.64 status writes and 0.32 Events per
run that measured the fake cluster's size, not the controllers. Each N:

0. **Ceiling**: N Pods created straight away at each minute through the operator's client, 48 in
   flight (no runs, no store, no bookkeeping): what the API server and the nodes take here at all;
   ``--no-ceiling`` leaves it out. The other sides' Pods are also printed as fractions of it.
1. **CronJob**: N CronJobs, ``successfulJobsHistoryLimit: 10`` so that every Pod of the window is
   still there to count; kube-controller-manager's cronjob and job controllers make the Pods.
2. **Anarchon**: 3 replicas (processes of this checkout) on a fresh store (``--store``), N
   AnarchonJobs with jitter 0 and ``successfulRunsHistoryLimit: 10``.

Each side is watched over ``--minutes`` whole minutes (the "window", its slots are the ones
counted as due) plus ``--grace`` seconds for late Pods; then its jobs are deleted (their Pods are
left: counting is done by listing them) and the next side starts. Printed per side: Pods seen
/ due (slots of the window with a Pod by the end of the grace), duplicates (a slot with more
than one Pod), runs given up, slot→Pod delay p50/p99/max (Pod creation time - slot, whole
seconds), API requests of the controller within the window per Pod created within it (from the
audit log: the user kube-controller-manager for CronJob, the replicas for Anarchon; by verb and
resource with ``--verbose``), the controller's CPU seconds within the window (and per such Pod,
in ms), its peak resident memory, and how long creating the N jobs took (for Anarchon: until
every job's status showed its schedule). Beside the replicas', the store's own load over Anarchon's
window (PostgreSQL and Redis; read from the server, see :class:`StoreLoad`): statements per second,
its most client connections and its CPU seconds. The last line gives the ratios Anarchon/CronJob.
The idle cost of N jobs with nothing due is ``bench/bench_idle.py``'s.

Both sides run on the same machine in the same run: read the ratios, not the absolute numbers
(these machines have 2 cores and are noisy). Targets (issue 13) at N = 1,000: Pods seen >=
CronJob's, p99 <= 0.5x, API requests per run <= 1.0x, controller CPU per run <= 1.0x; 0
duplicates and 0 runs given up at any N.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "operator", ROOT / "e2e" / "controlplane"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from controlplane import ControlPlane  # noqa: E402 - after the path set-up
from tests.harness.cluster import Replicas  # noqa: E402
from tests.harness.controlplane import wait_established  # noqa: E402

from anarchon.kube.constants import LABEL_JOB, LABEL_SLOT  # noqa: E402

#: The audit log's name for kube-controller-manager (its static token user, see controlplane.py).
KCM_USER = "system:kube-controller-manager"


@dataclass
class Side:
    """What one side did over its window."""

    name: str
    due: int = 0
    seen: int = 0
    duplicates: int = 0
    given_up: int = 0
    delays_s: list[float] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0
    rss_mb: float = 0.0
    setup_s: float = 0.0

    #: Pods created within the window (of any slot): what the window's requests and CPU paid for.
    made: int = 0
    #: Whether the controller's cost (requests, CPU, memory, set-up) was measured: not the ceiling's.
    costed: bool = True
    #: The store's own load over the window (Anarchon's side).
    store: StoreLoad | None = None

    @property
    def per_run(self) -> float:
        return sum(self.requests.values()) / max(self.made, 1)

    @property
    def cpu_per_run(self) -> float:
        return self.cpu_s / max(self.made, 1)

    def p99(self) -> float:
        d = sorted(self.delays_s)
        return d[int(0.99 * (len(d) - 1))] if d else float("nan")

    def row(self) -> str:
        d = sorted(self.delays_s) or [float("nan")]
        p = (statistics.quantiles(d, n=100) if len(d) > 1 else d * 99)[:99]
        cpu_ms = 1000 * self.cpu_per_run
        cost = (
            f" {self.per_run:>8.1f} {self.cpu_s:>8.1f} {cpu_ms:>7.1f} {self.rss_mb:>7.0f} {self.setup_s:>7.1f}"
            if self.costed
            else f" {'-':>8} {'-':>8} {'-':>7} {'-':>7} {'-':>7}"
        )
        return (
            f"{self.name:<22} {self.seen:>6}/{self.due:<6} {self.duplicates:>4} {self.given_up:>8}"
            f" {p[49]:>7.1f} {p[98]:>7.1f} {d[-1]:>7.1f}" + cost
        )


HEADER = (
    f"{'side':<22} {'Pods seen/due':>13} {'dups':>4} {'given up':>8} {'p50 s':>7} {'p99 s':>7} {'max s':>7}"
    f" {'req/run':>8} {'CPU s':>8} {'ms/run':>7} {'RSS MB':>7} {'setup s':>7}"
)


def kubectl(cp: ControlPlane, *args: str, stdin: str | None = None, timeout: float = 600) -> str:
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(cp.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    )
    return out.stdout


def apply_list(cp: ControlPlane, items: list[dict[str, Any]]) -> None:
    for i in range(0, len(items), 200):  # kubectl sends one request per object; 200 per call keeps memory low
        chunk = {"apiVersion": "v1", "kind": "List", "items": items[i : i + 200]}
        kubectl(cp, "apply", "-f", "-", stdin=json.dumps(chunk))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks (USER_HZ = 100)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def next_minute(after: float) -> float:
    return (int(after) // 60 + 1) * 60


def audit_requests(cp: ControlPlane, start: float, end: float, who: Any) -> Counter[str]:
    """Requests that ended in [start, end) and that ``who(event)`` claims, by "verb resource"
    (and " <code>" for those the server refused: a 409 is a request spent on nothing).

    The API server rotates its audit log every 100 MB (``--audit-log-maxsize=0`` is
    lumberjack's default size, not "never"): the rotated files (``audit-<time>.log``) are read
    too. At N = 3,000 a window's events had been rotated out once, and counted as none.
    """
    assert cp.audit_log is not None
    counts: Counter[str] = Counter()
    for path in sorted(cp.audit_log.parent.glob("audit*.log")):
        with path.open() as log:
            for line in log:
                event = json.loads(line)
                at = datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
                if not start <= at < end or not who(event) or event.get("verb") == "watch":
                    continue
                ref = event.get("objectRef") or {}
                resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                code = int((event.get("responseStatus") or {}).get("code") or 200)
                counts[f"{event['verb']} {resource}" + (f" {code}" if code >= 300 else "")] += 1
    return counts


def delay_of(pod: dict[str, Any], slot_s: float) -> float:
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
    return created - slot_s


def wait_window(minutes: int, pids: list[int], load: StoreLoad | None = None) -> tuple[float, float, float]:
    """Sleep to the next minute and through ``minutes`` minutes: the window's ends, and the CPU
    seconds ``pids`` used within it; ``load`` measures the store's over the same window."""
    start = next_minute(time.time() + 5)
    end = start + 60 * minutes
    print(f"  window {datetime.fromtimestamp(start, UTC):%H:%M:%S} + {minutes} min", file=sys.stderr)
    time.sleep(max(0.0, start - time.time()))
    cpu0 = sum(cpu_seconds(p) for p in pids)
    if load is not None:
        load.begin()
    time.sleep(max(0.0, end - time.time()))
    cpu = sum(cpu_seconds(p) for p in pids) - cpu0
    if load is not None:
        load.end()
    return start, end, cpu


def count_pods(side: Side, pods: list[dict[str, Any]], start: float, end: float, slot_of: Any) -> None:
    """Fill in the side's Pods: per slot of the window (seen, duplicates, delays), and made within it."""
    per_slot: Counter[tuple[str, float]] = Counter()
    for pod in pods:
        created = delay_of(pod, 0.0)
        side.made += start <= created < end
        key = slot_of(pod)
        if key is not None and start <= key[1] < end:
            per_slot[key] += 1
            side.delays_s.append(created - key[1])
    side.seen = len(per_slot)
    side.duplicates = sum(1 for c in per_slot.values() if c > 1)


def cronjob_side(cp: ControlPlane, n: int, minutes: int, grace_s: float) -> Side:
    side = Side("CronJob (kcm)")
    ns = f"cron-{n}"
    kubectl(cp, "create", "namespace", ns)
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
    }
    items = [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": f"c{i}", "namespace": ns},
            "spec": {
                "schedule": "* * * * *",
                "successfulJobsHistoryLimit": 10,
                "jobTemplate": {
                    "spec": {
                        "backoffLimit": 0,
                        "template": {"metadata": {"annotations": {"anarchon.test/run-seconds": "1"}}, "spec": pod_spec},
                    }
                },
            },
        }
        for i in range(n)
    ]
    t0 = time.time()
    apply_list(cp, items)
    side.setup_s = time.time() - t0
    kcm = next(c for c in cp.components if c.name == "kube-controller-manager").proc.pid
    start, end, side.cpu_s = wait_window(minutes, [kcm])
    side.rss_mb = peak_rss_mb(kcm)
    time.sleep(grace_s)
    side.requests = audit_requests(cp, start, end, lambda e: e["user"]["username"] == KCM_USER)
    pods = json.loads(kubectl(cp, "get", "pods", "-n", ns, "-o", "json"))["items"]
    # Its CronJobs, Jobs and Pods go before the other side starts: at N = 3,000 their deletion
    # kept the API server busy for minutes, which Anarchon's side then paid for.
    t0 = time.time()
    kubectl(cp, "delete", "namespace", ns, "--wait=false")
    kubectl(cp, "wait", "--for=delete", f"namespace/{ns}", "--timeout=900s", timeout=960)
    print(f"  namespace {ns} deleted in {time.time() - t0:.0f} s", file=sys.stderr)

    def slot_of(pod: dict[str, Any]) -> tuple[str, float] | None:
        # A CronJob's Job is named <cronjob>-<scheduled time in minutes since 1970>.
        cron, _, minute = str((pod["metadata"].get("labels") or {}).get("job-name", "")).rpartition("-")
        return (cron, int(minute) * 60.0) if minute.isdigit() else None

    count_pods(side, pods, start, end, slot_of)
    side.due = n * minutes
    return side


#: Pod creates the ceiling keeps in flight: the replicas' own bound summed over three
#: (``--api-concurrency`` 16 each).
CEILING_IN_FLIGHT = 48


def ceiling_side(cp: ControlPlane, n: int, minutes: int, grace_s: float) -> Side:
    """The most any controller could do here: at each minute, N Pods created straight away (no
    runs, no store, no bookkeeping), CEILING_IN_FLIGHT at a time, through the operator's client.
    The other sides are read as fractions of it."""
    from anarchon.kube.api.client import connect, path

    side = Side("ceiling (bare creates)", costed=False)
    ns = f"ceiling-{n}"
    kubectl(cp, "create", "namespace", ns)

    def pod(i: int, slot_s: float) -> dict[str, Any]:
        labels = {LABEL_JOB: f"c{i}", LABEL_SLOT: str(int(slot_s * 1000))}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"c{i}-{int(slot_s) // 60}",
                "labels": labels,
                "annotations": {"anarchon.test/run-seconds": "1"},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
            },
        }

    async def create_each_minute(start: float, end: float) -> None:
        kube = await connect(str(cp.kubeconfig), api_concurrency=CEILING_IN_FLIGHT)
        try:
            slot = start
            while slot < end:
                await asyncio.sleep(max(0.0, slot - time.time()))
                creates = (kube.request("POST", path("pods", ns), pod(i, slot)) for i in range(n))
                await asyncio.gather(*creates, return_exceptions=True)  # a failed create is a Pod not seen
                slot += 60
        finally:
            await kube.close()

    start = next_minute(time.time() + 5)
    end = start + 60 * minutes
    print(f"  window {datetime.fromtimestamp(start, UTC):%H:%M:%S} + {minutes} min", file=sys.stderr)
    asyncio.run(create_each_minute(start, end))
    time.sleep(max(0.0, end + grace_s - time.time()))
    pods = json.loads(kubectl(cp, "get", "pods", "-n", ns, "-o", "json"))["items"]
    t0 = time.time()
    kubectl(cp, "delete", "namespace", ns, "--wait=false")
    kubectl(cp, "wait", "--for=delete", f"namespace/{ns}", "--timeout=900s", timeout=960)
    print(f"  namespace {ns} deleted in {time.time() - t0:.0f} s", file=sys.stderr)

    def slot_of(pod: dict[str, Any]) -> tuple[str, float] | None:
        labels = pod["metadata"].get("labels") or {}
        return (labels.get(LABEL_JOB, ""), int(labels[LABEL_SLOT]) / 1000) if LABEL_SLOT in labels else None

    count_pods(side, pods, start, end, slot_of)
    side.due = n * minutes
    return side


def start_store(store: str, log_dir: Path, n: int) -> tuple[Any, str]:
    """A fresh store for one side: (its server to stop, or None for SQLite; its URL)."""
    if store == "redis":
        from tests.servers.redis import RedisServer

        server: Any = RedisServer().start()
        return server, str(server.url)
    if store == "postgres":
        from tests.servers.postgres import PostgresServer

        server = PostgresServer().start()
        return server, str(server.url)
    return None, f"sqlite://{log_dir / f'store-{n}.db'}"


@dataclass
class StoreLoad:
    """The store server's own load over a window, read from the server: statements served,
    client connections (their most, sampled every second), and its processes' CPU seconds.

    PostgreSQL: statements are its transactions (``pg_stat_database``; the backend runs every
    statement in autocommit, one transaction each), connections the client backends in
    ``pg_stat_activity``, CPU the postmaster's and every backend's (those that ended within the
    window included, through the postmaster's children's times). Redis: commands processed,
    connected clients and ``used_cpu_*`` from INFO. SQLite has no server: nothing is measured.
    """

    store: str
    url: str
    server: Any
    statements: int = 0
    connections: int = 0
    cpu_s: float = 0.0
    seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None
    _start: tuple[int, float, float] = (0, 0.0, 0.0)

    @property
    def measured(self) -> bool:
        return self.store in ("postgres", "redis")

    def _read(self) -> tuple[int, int, float]:
        """Statements served so far, client connections now, CPU seconds so far."""
        if self.store == "redis":
            import redis

            client = redis.Redis.from_url(self.url)
            try:
                info = client.info()
            finally:
                client.close()
            cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
            return int(info["total_commands_processed"]), int(info["connected_clients"]) - 1, cpu
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT (SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database"
                " WHERE datname = current_database()),"
                " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                " AND datname = current_database() AND pid <> pg_backend_pid())"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), self._postgres_cpu_s()

    def _postgres_cpu_s(self) -> float:
        total = 0.0
        for pid in self.server._pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(f) for f in fields[11:15]) / 100  # utime, stime, cutime, cstime
        return total

    def begin(self) -> None:
        if not self.measured:
            return
        statements, self.connections, cpu = self._read()
        self._start = (statements, cpu, time.time())
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):  # a sample missed under load is not a measurement
                self.connections = max(self.connections, self._read()[1])

    def end(self) -> None:
        if not self.measured:
            return
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        statements, connections, cpu = self._read()
        self.connections = max(self.connections, connections)
        statements0, cpu0, t0 = self._start
        # The reads of this class are statements too: a handful, against thousands.
        self.statements, self.cpu_s, self.seconds = statements - statements0, cpu - cpu0, time.time() - t0

    def row(self, runs: int, replicas_cpu_s: float) -> str:
        if not self.measured:
            return f"store ({self.store}): no server to measure"
        per_s = self.statements / max(self.seconds, 1e-9)
        return (
            f"store ({self.store}), its own load over the window: {per_s:.0f} statements/s"
            f" ({self.statements / max(runs, 1):.1f} per Pod), {self.connections} connections at most,"
            f" server CPU {self.cpu_s:.1f} s ({1000 * self.cpu_s / max(runs, 1):.1f} ms per Pod;"
            f" the replicas' {replicas_cpu_s:.1f} s)"
        )


@contextlib.contextmanager
def three_replicas(
    cp: ControlPlane, ns: str, store: str, log_dir: Path, n: int
) -> Iterator[tuple[Replicas, str, StoreLoad]]:
    """A new namespace and a fresh store, 3 replicas of this checkout on them; the store's URL
    and what measures its load."""
    kubectl(cp, "create", "namespace", ns)
    server, url = start_store(store, log_dir, n)
    replicas = Replicas(cp, ns, url, log_dir)
    try:
        for i in range(3):
            replicas.start(f"{ns}-{i}")
        yield replicas, url, StoreLoad(store, url, server)
    finally:
        replicas.stop_all()
        if server is not None:
            server.stop()


def from_replicas(event: dict[str, Any]) -> bool:
    """An audit event of the replicas: they use the admin kubeconfig, as does this script's
    kubectl (not run within a measured window)."""
    return event["user"]["username"] == "admin" and not str(event.get("userAgent")).startswith("kubectl")


def create_jobs(cp: ControlPlane, ns: str, n: int, cron: str, *, suspended: bool = False) -> float:
    """N AnarchonJobs on ``cron``, ``suspended`` or not; the seconds until every job's status
    showed its schedule (the replicas had taken each up)."""
    items = [
        {
            "apiVersion": "anarchon.io/v1alpha1",
            "kind": "AnarchonJob",
            "metadata": {"name": f"a{i}", "namespace": ns},
            "spec": {
                "cron": cron,
                "jitter": "0s",
                "successfulRunsHistoryLimit": 10,
                "suspend": suspended,
                "catchUp": {"policy": "None"},  # what was due while it was suspended is not run
                "template": {
                    "metadata": {"annotations": {"anarchon.test/run-seconds": "1"}},
                    "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["true"]}]},
                },
            },
        }
        for i in range(n)
    ]
    t0 = time.time()
    apply_list(cp, items)
    while True:  # every job scheduled by the replicas (its status says so)
        jobs = json.loads(kubectl(cp, "get", "anarchonjobs", "-n", ns, "-o", "json"))["items"]
        if sum(1 for j in jobs if (j.get("status") or {}).get("schedule")) >= n or time.time() - t0 > 1800:
            return time.time() - t0
        time.sleep(2.0 if n <= 1000 else 10.0)  # a listing of 10,000 jobs is 30 MB


def resume_jobs(cp: ControlPlane, ns: str, n: int) -> float:
    """Resume the N suspended jobs right after a minute began, 32 patches at a time; the seconds
    it took. kubectl sends one at a time: at N = 3,000 the jobs created first ran for minutes
    while the last ones were still being created, and that load slowed the creates down more."""
    from anarchon.kube.api.client import connect

    async def resume() -> None:
        kube = await connect(str(cp.kubeconfig), api_concurrency=32)
        try:
            await asyncio.gather(*(kube.patch_job(ns, f"a{i}", {"spec": {"suspend": False}}) for i in range(n)))
        finally:
            await kube.close()

    if time.time() % 60 > 5:
        time.sleep(next_minute(time.time()) - time.time() + 0.5)
    t0 = time.time()
    asyncio.run(resume())
    return time.time() - t0


def anarchon_side(cp: ControlPlane, n: int, minutes: int, grace_s: float, store: str, log_dir: Path) -> Side:
    side = Side(f"Anarchon ({store})")
    ns = f"anarchon-{n}"
    with three_replicas(cp, ns, store, log_dir, n) as (replicas, _, load):
        # Created suspended and resumed together, as CronJob's side starts all at once (its
        # creates take seconds; these take a minute or more with the replicas at work on them).
        created_s = create_jobs(cp, ns, n, "* * * * *", suspended=True)
        resumed_s = resume_jobs(cp, ns, n)
        print(f"  {n} jobs created and taken up in {created_s:.0f} s, resumed in {resumed_s:.0f} s", file=sys.stderr)
        side.setup_s = created_s + resumed_s
        pids = [p.pid for p in replicas.procs.values()]
        start, end, side.cpu_s = wait_window(minutes, pids, load)
        side.rss_mb = max(peak_rss_mb(p) for p in pids)
        side.store = load
        time.sleep(grace_s)
        side.requests = audit_requests(cp, start, end, from_replicas)
        replicas.stop_all()
        runs = json.loads(kubectl(cp, "get", "anarchonruns", "-n", ns, "-o", "json"))["items"]
        side.given_up = sum(1 for r in runs if str((r.get("status") or {}).get("message", "")).startswith("gave up"))
        pods = json.loads(kubectl(cp, "get", "pods", "-n", ns, "-o", "json"))["items"]
        kubectl(cp, "delete", "anarchonjobs", "--all", "-n", ns, "--wait=false")  # their runs and Pods go too

    def slot_of(pod: dict[str, Any]) -> tuple[str, float] | None:
        labels = pod["metadata"].get("labels") or {}
        return (labels.get(LABEL_JOB, ""), int(labels[LABEL_SLOT]) / 1000) if LABEL_SLOT in labels else None

    count_pods(side, pods, start, end, slot_of)
    side.due = n * minutes
    return side


def current_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def store_operations(store: str, url: str) -> int | None:
    """Operations the store served so far: Redis commands, PostgreSQL transactions; None for SQLite."""
    if store == "redis":
        import redis

        client = redis.Redis.from_url(url)
        try:
            return int(client.info("stats")["total_commands_processed"])
        finally:
            client.close()
    if store == "postgres":
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database").fetchone()
            return int(row[0]) if row else None
    return None


def idle_run(cp: ControlPlane, n: int, seconds: int, store: str, log_dir: Path) -> None:
    """N AnarchonJobs with nothing due (``0 0 1 1 *``), 3 replicas: what each costs while they wait.

    Measured over ``seconds`` after the jobs were taken up and a settling minute (two resync
    periods: the periodic passes over every job are part of the idle cost): CPU per replica,
    its resident memory now and at its peak, store operations and API requests per second.
    """
    ns = f"idle-{n}"
    with three_replicas(cp, ns, store, log_dir, n) as (replicas, url, _):
        setup_s = create_jobs(cp, ns, n, "0 0 1 1 *")
        time.sleep(60)
        pids = [p.pid for p in replicas.procs.values()]
        cpu0, ops0, start = [cpu_seconds(p) for p in pids], store_operations(store, url), time.time()
        time.sleep(seconds)
        cpu1, ops1, end = [cpu_seconds(p) for p in pids], store_operations(store, url), time.time()
        rss = [current_rss_mb(p) for p in pids]
        peak = [peak_rss_mb(p) for p in pids]
        requests = sum(audit_requests(cp, start, end, from_replicas).values())
        kubectl(cp, "delete", "namespace", ns, "--wait=false")
    span = end - start
    cpu = [100 * (b - a) / span for a, b in zip(cpu0, cpu1, strict=True)]
    ops = "n/a" if ops0 is None or ops1 is None else f"{(ops1 - ops0) / span / 3:.1f}"
    print(f"\nN = {n} jobs idle ({store}), 3 replicas, {span:.0f} s after a settling minute", end="")
    print(f"; jobs taken up in {setup_s:.0f} s")
    print(f"{'replica':<10} {'CPU %':>6} {'RSS MB':>7} {'peak MB':>8}")
    for i, (c, r, p) in enumerate(zip(cpu, rss, peak, strict=True)):
        print(f"{i:<10} {c:>6.2f} {r:>7.0f} {p:>8.0f}")
    print(
        f"per replica: store operations/s {ops} (target <= 10), API requests/s {requests / span / 3:.2f};"
        f" CPU % of a core max {max(cpu):.2f} (target <= 5), RSS MB max {max(rss):.0f} (target <= 150)"
    )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="100,1000", help="numbers of jobs, comma-separated")
    parser.add_argument("--minutes", type=int, default=3, help="whole minutes watched per side")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds after the window for late Pods")
    parser.add_argument("--store", default="redis", choices=("redis", "postgres", "sqlite"))
    parser.add_argument("--verbose", action="store_true", help="requests per run by verb and resource")
    parser.add_argument("--anarchon-only", action="store_true", help="Anarchon's side alone, no ratios")
    parser.add_argument("--no-ceiling", action="store_true", help="leave out the bare-creates side (the ceiling)")
    parser.add_argument("--idle", type=int, help="instead: N jobs with nothing due, their idle cost (e.g. 10000)")
    parser.add_argument("--idle-seconds", type=int, default=60, help="seconds the idle cost is measured over")
    parser.add_argument("--logs", type=Path, help="keep the replicas' logs (and a SQLite store) in this directory")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="anarchon-bench-scale-")))
        tmp.mkdir(parents=True, exist_ok=True)
        jobs = [int(x) for x in args.jobs.split(",")]
        cp = stack.enter_context(ControlPlane(audit=True, pods_per_node=max(110, *jobs)))
        run(args, cp, tmp)


def run(args: argparse.Namespace, cp: ControlPlane, tmp: Path) -> None:
    kubectl(cp, "apply", "-f", str(ROOT / "crds"))
    wait_established(cp, "anarchonjobs.anarchon.io", "anarchonruns.anarchon.io")
    if args.idle:
        idle_run(cp, args.idle, args.idle_seconds, args.store, tmp)
        return
    for n in (int(x) for x in args.jobs.split(",")):
        cron = ceiling = None
        if not args.anarchon_only and not args.no_ceiling:
            print(f"N = {n}: ceiling ...", file=sys.stderr)
            ceiling = ceiling_side(cp, n, args.minutes, args.grace)
        if not args.anarchon_only:
            print(f"N = {n}: CronJob ...", file=sys.stderr)
            cron = cronjob_side(cp, n, args.minutes, args.grace)
        print(f"N = {n}: Anarchon ({args.store}) ...", file=sys.stderr)
        anarchon = anarchon_side(cp, n, args.minutes, args.grace, args.store, tmp)
        print(f"\nN = {n} jobs on '* * * * *', {args.minutes} min + {args.grace:.0f} s grace")
        print(HEADER)
        for side in (ceiling, cron, anarchon):
            if side is None:
                continue
            print(side.row())
            if args.verbose:
                for kind, count in side.requests.most_common(12):
                    print(f"{'':<24}{count / max(side.seen, 1):6.2f}  {kind}")
        if anarchon.store is not None:
            print(anarchon.store.row(anarchon.made, anarchon.cpu_s))
        if ceiling is not None:
            per_minute = [f"{side.name} {side.seen / args.minutes:.0f}" for side in (ceiling, cron, anarchon) if side]
            print(
                f"Pods per minute: {', '.join(per_minute)}; fractions of the ceiling: Anarchon"
                f" {anarchon.seen / max(ceiling.seen, 1):.2f} (target >= 0.8), CronJob"
                f" {cron.seen / max(ceiling.seen, 1) if cron else float('nan'):.2f}"
            )
        if cron is None:
            sys.stdout.flush()
            continue
        pods = anarchon.seen / max(cron.seen, 1)
        p99 = anarchon.p99() / max(cron.p99(), 1.0)
        requests = anarchon.per_run / max(cron.per_run, 0.01)
        cpu = anarchon.cpu_per_run / max(cron.cpu_per_run, 1e-3)
        print(
            f"ratios Anarchon/CronJob: Pods seen {pods:.2f} (target >= 1), slot->Pod p99 {p99:.2f} (<= 0.5;"
            f" CronJob's taken as 1 s at least), API requests/run {requests:.2f} (<= 1.0),"
            f" CPU/run {cpu:.2f} (<= 1.0); duplicates {anarchon.duplicates}, given up {anarchon.given_up} (0)"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
