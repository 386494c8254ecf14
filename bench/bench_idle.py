#!/usr/bin/env python
"""What N jobs with nothing due cost one instance: CPU, store queries per second, memory.

Run from the repository root (see bench/README.md)::

    PYTHONPATH=operator:. python bench/bench_idle.py [--backends sqlite,redis,postgres] [--jobs 1000,10000]

For each lease store (``bench/cases/<name>.py``, each on its own fresh server) and each N, one
:class:`Scheduler` (one instance, the engine alone: no Kubernetes) gets N jobs on a schedule
that is not due during the run (``0 0 1 1 *``, heartbeat 2 s, the engine's default). Once
every job has started (each reads its schedule and history once), the process is watched for
``--seconds``: CPU time of the whole process (store client and, for SQLite, the store itself)
per second of wall time, store calls per second by operation (counted at the engine's store
boundary, :mod:`anarchon.engine.observed`), and the resident memory at the end.

Targets (issue 13): at 10,000 jobs, at most 5 % of a core and 10 store queries a second per
instance; memory is shown, the operator's own target (150 MB per replica) includes the watches and
the Kubernetes client and is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "operator"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from anarchon.engine import LeaseBackend, RunContext, Scheduler  # noqa: E402 - after the path set-up
from anarchon.engine.observed import observed  # noqa: E402
from bench.cases import CaseUnavailable, lease_store  # noqa: E402

LEASE_STORES = ("sqlite", "redis", "postgres")
TARGET_CPU = 0.05  # of one core, per instance, at 10,000 jobs
TARGET_QPS = 10.0  # store queries a second, per instance, at 10,000 jobs


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def never(ctx: RunContext) -> None:
    raise AssertionError(f"{ctx.job}: no slot is due during the benchmark")


async def measure(backend: LeaseBackend, jobs: int, seconds: float) -> dict[str, object]:
    calls: Counter[str] = Counter()
    started = asyncio.Event()

    def count(operation: str, _seconds: float, _error: BaseException | None) -> None:
        calls[operation] += 1
        if calls["schedule_since"] >= jobs:
            started.set()

    store = observed(backend, count)
    scheduler = Scheduler(store, instance_id=f"bench-idle-{uuid.uuid4().hex[:6]}")
    prefix = f"idle-{uuid.uuid4().hex[:8]}"
    for i in range(jobs):
        scheduler.cron(f"{prefix}-{i}", "0 0 1 1 *", never)
    t0 = time.monotonic()
    await scheduler.start()
    # Starting: every job notes its schedule once (and with catch-up, reads its last slot).
    await started.wait()
    started_s = time.monotonic() - t0
    await asyncio.sleep(2)  # let the start-up's stragglers settle
    calls.clear()
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    counted = dict(calls)
    memory = rss_mb()
    await scheduler.stop()
    for i in range(jobs):  # leave the store as it was
        await backend.forget_job(f"{prefix}-{i}")
    return {
        "jobs": jobs,
        "start_s": started_s,
        "cpu": cpu / wall,
        "qps": sum(counted.values()) / wall,
        "ops": {op: n / wall for op, n in sorted(counted.items())},
        "rss_mb": memory,
    }


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(LEASE_STORES))
    parser.add_argument("--jobs", default="1000,10000", help="numbers of idle jobs, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each N is watched")
    args = parser.parse_args()
    sizes = [int(n) for n in args.jobs.split(",")]
    print(
        f"{'backend':10} {'jobs':>7} {'start s':>8} {'CPU % core':>11} {'queries/s':>10} {'RSS MB':>7}"
        "  store calls/s by operation"
    )
    missed = 0
    for name in args.backends.split(","):
        try:
            async with lease_store(name) as backend:
                for jobs in sizes:
                    print(f"{name}: {jobs} idle jobs, {args.seconds:.0f} s ...", file=sys.stderr, flush=True)
                    m = await measure(backend, jobs, args.seconds)
                    cpu, qps = float(m["cpu"]), float(m["qps"])  # type: ignore[arg-type]
                    marks = ""
                    if jobs >= 10_000:
                        marks = f" {verdict(cpu <= TARGET_CPU)}/{verdict(qps <= TARGET_QPS)}"
                        missed += (cpu > TARGET_CPU) + (qps > TARGET_QPS)
                    ops = ", ".join(f"{op} {rate:.2f}" for op, rate in m["ops"].items())  # type: ignore[attr-defined]
                    print(
                        f"{name:10} {jobs:>7} {m['start_s']:>8.1f} {100 * cpu:>11.2f} {qps:>10.2f}"
                        f" {m['rss_mb']:>7.0f}{marks}  {ops}",
                        flush=True,
                    )
        except (CaseUnavailable, ImportError) as exc:
            print(f"{name:10} unavailable: {exc}")
    print(f"\ntargets at 10,000 jobs: CPU <= {100 * TARGET_CPU:.0f} % of a core, <= {TARGET_QPS:.0f} queries/s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
