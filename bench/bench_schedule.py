"""How long one ``Cron.next_after`` takes, per class of expression (issue 10).

The unit tests bound the work by counting croniter steps (never by the clock); this prints
the time, over a year of starting instants including every clock change of the zone.

    PYTHONPATH=operator:. python bench/bench_schedule.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

from anarchon.engine import cron
from anarchon.engine.schedule import Cron

CLASSES = [
    "* * * * * *",
    "*/7 * * * * *",
    "* * * * *",
    "*/15 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "0 8,20 * * 1-5",
    "0 0 1 * *",
    "0 0 29 2 *",
    "0 0 * 2 1#5",
]


def measure(sched: Cron, starts: list[int]) -> tuple[float, float, int]:
    """Mean and max µs per call, and the most croniter steps one call took."""
    times, steps = [], 0
    for t in starts:
        began = time.perf_counter_ns()
        _, n = sched._search(t)
        times.append((time.perf_counter_ns() - began) / 1000)
        steps = max(steps, n)
    return statistics.fmean(times), max(times), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zones", default="UTC,Europe/Paris,Australia/Lord_Howe")
    parser.add_argument("--starts", type=int, default=2000, help="starting instants over the year 2026")
    args = parser.parse_args()
    year = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    starts = [year + i * (365 * 86_400_000 // args.starts) + 7 for i in range(args.starts)]
    print(f"{'expression':<18} {'zone':<20} {'mean µs':>8} {'max µs':>8} {'steps':>5}")
    for expr in CLASSES:
        for tz in args.zones.split(","):
            mean, worst, steps = measure(cron(expr, tz), starts)
            print(f"{expr:<18} {tz:<20} {mean:8.1f} {worst:8.1f} {steps:5d}")


if __name__ == "__main__":
    main()
