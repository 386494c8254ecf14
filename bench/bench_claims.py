#!/usr/bin/env python
"""Claims per second of each backend beside its store's raw round trip, and slot→claim delay.

Run from the repository root (see bench/README.md)::

    PYTHONPATH=operator:. python bench/bench_claims.py [--backends redis,sqlite] [--n 5000]

Two measurements per backend, each case (``bench/cases/<name>.py``) on its own server:

1. Throughput, sequential (one caller, one request in flight, as one instance claiming its
   slots does). Three kinds of operation are timed one call at a time: the store's raw
   "insert unless present" round trip, a claim with ``Overlap.ALLOW`` and a claim with the
   default ``Overlap.SKIP`` (which also reads the job's active runs), each on distinct slots
   so every claim wins. They run in small blocks in a shuffled order, so that whatever else
   the machine does hits all kinds alike, and the ratio claim/raw is what to read: it does
   not depend on how fast the machine is. Every won run of a lease backend is finished
   right away (timed separately, the ``finish`` column), so each claim meets the steady
   state of a real job: no earlier run still active.

2. Slot→claim delay: a real ``every(period)`` loop on the system clock, jitter 0: sleep until
   the slot, claim it, and record (time the claim returned) - slot. It is the sum of the
   wake-up lateness of the event loop (shown as ``wake``) and the claim's round trip (shown
   as ``rt``, per slot: delay - wake), so a busy machine can be told from a slow store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "operator"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from anarchon.engine import (  # noqa: E402 - after the path set-up, so it runs without PYTHONPATH too
    Backend,
    ClaimRequest,
    LeaseBackend,
    Overlap,
    RunState,
    SystemClock,
    every,
    new_token,
    parse_duration,
)
from bench.cases import BenchCase, CaseUnavailable  # noqa: E402

LEASE_MS = 30_000
INSTANCE = "bench"


def discover() -> list[str]:
    """The case names: every ``bench/cases/<name>.py`` not starting with ``_``."""
    return sorted(p.stem for p in (ROOT / "bench" / "cases").glob("*.py") if not p.stem.startswith("_"))


def percentile(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method; NaN when there is no sample."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass
class Timings:
    """Durations of one kind of operation, in seconds, one per call."""

    samples: list[float] = field(default_factory=list)

    @property
    def ops_per_s(self) -> float:
        total = sum(self.samples)
        return len(self.samples) / total if total > 0 else float("nan")

    def summary(self) -> dict[str, float]:
        return {
            "ops": len(self.samples),
            "ops_per_s": self.ops_per_s,
            "p50_us": percentile(self.samples, 0.50) * 1e6,
            "p99_us": percentile(self.samples, 0.99) * 1e6,
        }


@dataclass
class Result:
    name: str
    raw_label: str = ""
    timings: dict[str, Timings] = field(default_factory=dict)
    delays_ms: list[float] = field(default_factory=list)
    wakes_ms: list[float] = field(default_factory=list)
    idle_raw_ms: list[float] = field(default_factory=list)
    target_ratio: float | None = None
    target_p99_ms: float | None = None
    unavailable: str | None = None
    contended: Timings | None = None  # --contenders: time until all K answered, per slot
    contenders: int = 0
    contended_note: str = ""

    @property
    def round_trips_ms(self) -> list[float]:
        """Per slot, the part of the delay spent in the claim: delay - wake-up lateness."""
        return [d - w for d, w in zip(self.delays_ms, self.wakes_ms, strict=True)]

    def ratio(self, kind: str) -> float:
        raw = self.timings.get("raw")
        claim = self.timings.get(kind)
        if raw is None or claim is None:
            return float("nan")
        return claim.ops_per_s / raw.ops_per_s

    def median_ratio(self, kind: str) -> float:
        """raw p50 ÷ claim p50: the same ratio from typical calls, blind to stalls of the machine."""
        raw = self.timings.get("raw")
        claim = self.timings.get(kind)
        if raw is None or claim is None or not claim.samples:
            return float("nan")
        return percentile(raw.samples, 0.5) / percentile(claim.samples, 0.5)


class Claimer:
    """Claims distinct slots of one job, timing each claim, and finishes what it won."""

    def __init__(self, backend: Backend, overlap: Overlap, timings: Timings, finish: Timings) -> None:
        self.backend = backend
        self.overlap = overlap
        self.job = f"bench-{overlap.value.lower()}-{uuid.uuid4().hex[:8]}"
        self.timings = timings
        self.finish_timings = finish
        self.slot = 0
        self.clock = SystemClock()

    async def once(self, record: bool) -> None:
        self.slot += 1
        request = ClaimRequest(self.job, self.slot, INSTANCE, new_token(), self.clock.now_ms(), LEASE_MS, self.overlap)
        started = time.perf_counter()
        result = await self.backend.claim(request)
        elapsed = time.perf_counter() - started
        if not result.won:
            raise RuntimeError(f"{self.job}: claim of fresh slot {self.slot} was {result.outcome}, not won")
        if record:
            self.timings.samples.append(elapsed)
        if isinstance(self.backend, LeaseBackend):
            started = time.perf_counter()
            ok = await self.backend.finish(self.job, self.slot, request.token, self.clock.now_ms(), RunState.SUCCEEDED)
            elapsed = time.perf_counter() - started
            if not ok:
                raise RuntimeError(f"{self.job}: finish of slot {self.slot} was refused")
            if record:
                self.finish_timings.samples.append(elapsed)


async def measure_throughput(case: BenchCase, result: Result, n: int, block: int, warmup: int, budget_s: float) -> None:
    """Up to ``n`` timed operations of each kind, stopping early after ``budget_s`` seconds.

    The budget keeps the default run short on a slow store or a busy machine; the blocks are
    whole, so every kind still gets the same number of operations.
    """
    raw_t = result.timings.setdefault("raw", Timings())
    finish_t = Timings()
    counter = iter(range(1 << 62))

    async def raw_once(record: bool) -> None:
        i = next(counter)
        started = time.perf_counter()
        await case.raw(i)
        elapsed = time.perf_counter() - started
        if record:
            raw_t.samples.append(elapsed)

    kinds: dict[str, Callable[[bool], Awaitable[None]]] = {"raw": raw_once}
    allow = Claimer(case.backend, Overlap.ALLOW, result.timings.setdefault("claim Allow", Timings()), finish_t)
    kinds["claim Allow"] = allow.once
    if case.backend.capabilities.leases:
        skip = Claimer(case.backend, Overlap.SKIP, result.timings.setdefault("claim Skip", Timings()), finish_t)
        kinds["claim Skip"] = skip.once
        result.timings["finish"] = finish_t

    for op in kinds.values():  # warm connections, caches, prepared statements; ~1 s at most each
        warm_until = time.monotonic() + 1.0
        for _ in range(warmup):
            await op(False)
            if time.monotonic() > warm_until:
                break
    rng = random.Random(0)
    order = list(kinds.values())
    done = 0
    deadline = time.monotonic() + budget_s
    while done < n and time.monotonic() < deadline:
        size = min(block, n - done)
        rng.shuffle(order)
        for op in order:
            for _ in range(size):
                await op(True)
        done += size


async def measure_delay(case: BenchCase, result: Result, period_ms: int, slots: int, warmup: int) -> None:
    """Claim every slot of ``every(period_ms)`` at its time; half a period later, one raw op.

    The raw op, timed alone, is the yardstick of the delay: after ~half a period of idling,
    processes and caches are cold (on a VM, waking a sleeping process alone can take a
    millisecond), so a claim here is slower than in the tight throughput loop, and so is the
    raw round trip: ``raw@idle`` shows how much of the delay the store's plain round trip
    would have cost anyway.
    """
    backend = case.backend
    clock = SystemClock()
    schedule = every(period_ms)
    job = f"bench-delay-{uuid.uuid4().hex[:8]}"
    slot = schedule.next_after(clock.now_ms())
    for k in range(warmup + slots):
        await clock.sleep_until(slot)
        woke_ns = time.time_ns()
        request = ClaimRequest(job, slot, INSTANCE, new_token(), clock.now_ms(), LEASE_MS, Overlap.SKIP)
        claimed = await backend.claim(request)
        done_ns = time.time_ns()
        if not claimed.won:
            raise RuntimeError(f"{job}: claim of slot {slot} was {claimed.outcome}, not won")
        if k >= warmup:
            result.delays_ms.append(done_ns / 1e6 - slot)
            result.wakes_ms.append(woke_ns / 1e6 - slot)
        if isinstance(backend, LeaseBackend):
            await backend.finish(job, slot, request.token, clock.now_ms(), RunState.SUCCEEDED)
        await clock.sleep_until(slot + period_ms // 2)
        started = time.perf_counter()
        await case.raw(10**12 + k)  # far above the throughput phase's numbers
        if k >= warmup:
            result.idle_raw_ms.append((time.perf_counter() - started) * 1e3)
        # Every slot is claimed, even late: a claim that overran a period shows up as delay.
        slot = schedule.next_after(slot)


async def measure_contended(case: BenchCase, result: Result, contenders: int, slots: int) -> None:
    """``contenders`` instances (own connections) claim each slot at the same moment.

    That is the normal case in production: every instance computes the same slot and, with
    jitter 0, claims it at once. Exactly one must win; the time is until all have their
    answer, which is how long the losers wait to learn that they lost.
    """
    if case.make_backend is None:
        result.contended_note = "case gives no make_backend"
        return
    backends = [case.make_backend() for _ in range(contenders)]
    await asyncio.gather(*(b.setup() for b in backends))
    timings = Timings()
    clock = SystemClock()
    job = f"bench-contended-{uuid.uuid4().hex[:8]}"
    try:
        for slot in range(slots + 10):
            now = clock.now_ms()
            requests = [
                ClaimRequest(job, slot, f"i{n}", new_token(), now, LEASE_MS, Overlap.SKIP) for n in range(contenders)
            ]
            started = time.perf_counter()
            results = await asyncio.gather(*(b.claim(r) for b, r in zip(backends, requests, strict=True)))
            elapsed = time.perf_counter() - started
            winners = [n for n, r in enumerate(results) if r.won]
            if len(winners) != 1:
                raise RuntimeError(f"{job}: slot {slot} had {len(winners)} winners")
            if slot >= 10:
                timings.samples.append(elapsed)
            backend = backends[winners[0]]
            if isinstance(backend, LeaseBackend):
                await backend.finish(job, slot, requests[winners[0]].token, clock.now_ms(), RunState.SUCCEEDED)
    finally:
        await asyncio.gather(*(b.close() for b in backends))
    result.contended = timings
    result.contenders = contenders


@contextlib.asynccontextmanager
async def open_case(name: str) -> AsyncIterator[BenchCase]:
    module = importlib.import_module(f"bench.cases.{name}")
    factory: Callable[[], contextlib.AbstractAsyncContextManager[BenchCase]] = module.case
    async with factory() as case:
        yield case


async def bench_one(name: str, args: argparse.Namespace) -> Result:
    result = Result(name)
    try:
        async with open_case(name) as case:
            result.raw_label = case.raw_label
            result.target_ratio = case.target_ratio
            result.target_p99_ms = case.target_p99_ms
            print(
                f"[{name}] throughput: {args.n} ops of each kind (at most {args.budget:g} s) ...",
                file=sys.stderr,
                flush=True,
            )
            await measure_throughput(case, result, args.n, args.block, args.warmup, args.budget)
            print(
                f"[{name}] slot→claim delay: {args.slots} slots of every {args.period} ...",
                file=sys.stderr,
                flush=True,
            )
            await measure_delay(case, result, parse_duration(args.period), args.slots, warmup=10)
            if args.contenders > 1:
                print(f"[{name}] contended: {args.contenders} instances x {args.slots} slots ...", file=sys.stderr)
                await measure_contended(case, result, args.contenders, args.slots)
    except (CaseUnavailable, ImportError) as exc:
        result.unavailable = str(exc)
    return result


def _fmt(value: float, spec: str = ".0f") -> str:
    return "-" if value != value else format(value, spec)  # NaN check without math


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ok" if ok else " MISS")


def report(results: list[Result]) -> str:
    lines = []
    header = (
        f"{'backend':<13} {'n':>6} {'raw op':<18} {'raw/s':>8} {'Allow/s':>8} {'ratio':>9} {'Skip/s':>8} {'ratio':>9}"
        f" {'p50 ratio A/S':>13}"
        f" {'finish/s':>8}   {'claim p50/p99 µs':>16}   {'delay p50/p99/max ms':>21} {'wake p50/p99':>12}"
        f" {'rt p99':>6} {'raw@idle p50/p99':>16}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for r in results:
        if r.unavailable:
            lines.append(f"{r.name:<13} unavailable: {r.unavailable}")
            continue
        t = r.timings
        allow = t.get("claim Allow", Timings())
        skip = t.get("claim Skip", Timings())
        ratio_a, ratio_s = r.ratio("claim Allow"), r.ratio("claim Skip")
        target = r.target_ratio

        def ratio_mark(value: float, target: float | None = target) -> str:
            return "" if target is None or value != value else _mark(value >= target)

        p99 = percentile(r.delays_ms, 0.99)
        delay_ok = None if r.target_p99_ms is None else p99 <= r.target_p99_ms
        claim_lat = f"{_fmt(percentile(allow.samples, 0.5) * 1e6)}/{_fmt(percentile(allow.samples, 0.99) * 1e6)}"
        delays = (
            f"{_fmt(percentile(r.delays_ms, 0.5), '.2f')}/{_fmt(p99, '.2f')}"
            f"/{_fmt(max(r.delays_ms, default=float('nan')), '.2f')}"
        )
        lines.append(
            f"{r.name:<13} {len(t['raw'].samples):>6} {r.raw_label:<18}"
            f" {_fmt(t['raw'].ops_per_s):>8} {_fmt(allow.ops_per_s):>8}"
            f" {_fmt(ratio_a, '.2f') + ratio_mark(ratio_a):>9} {_fmt(skip.ops_per_s):>8}"
            f" {_fmt(ratio_s, '.2f') + ratio_mark(ratio_s):>9}"
            f" {_fmt(r.median_ratio('claim Allow'), '.2f') + '/' + _fmt(r.median_ratio('claim Skip'), '.2f'):>13}"
            f" {_fmt(t.get('finish', Timings()).ops_per_s):>8}   {claim_lat:>16}"
            f"   {delays + _mark(delay_ok):>21}"
            f" {_fmt(percentile(r.wakes_ms, 0.5), '.2f') + '/' + _fmt(percentile(r.wakes_ms, 0.99), '.2f'):>12}"
            f" {_fmt(percentile(r.round_trips_ms, 0.99), '.2f'):>6}"
            f" {_fmt(percentile(r.idle_raw_ms, 0.5), '.2f') + '/' + _fmt(percentile(r.idle_raw_ms, 0.99), '.2f'):>16}"
        )
    for r in results:
        if r.contended is not None:
            c = r.contended
            lines.append(
                f"{r.name:<13} contended: {r.contenders} instances claim each slot at once:"
                f" {_fmt(c.ops_per_s)} slots/s, all answered in p50 {_fmt(percentile(c.samples, 0.5) * 1e3, '.2f')}"
                f" / p99 {_fmt(percentile(c.samples, 0.99) * 1e3, '.2f')} ms, one winner each"
            )
        elif r.contended_note:
            lines.append(f"{r.name:<13} contended: not measured ({r.contended_note})")
    targets = sorted(
        {f"{r.name}: ratio ≥ {r.target_ratio}" for r in results if r.target_ratio is not None and not r.unavailable}
        | {f"{r.name}: delay p99 ≤ {r.target_p99_ms} ms" for r in results if r.target_p99_ms and not r.unavailable}
    )
    if targets:
        lines.append("targets: " + "; ".join(targets))
    return "\n".join(lines)


def to_json(results: list[Result]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in results:
        item: dict[str, Any] = {"backend": r.name}
        if r.unavailable:
            item["unavailable"] = r.unavailable
        else:
            item |= {
                "raw_label": r.raw_label,
                "kinds": {k: v.summary() for k, v in r.timings.items()},
                "ratio_allow": r.ratio("claim Allow"),
                "ratio_skip": r.ratio("claim Skip"),
                "median_ratio_allow": r.median_ratio("claim Allow"),
                "median_ratio_skip": r.median_ratio("claim Skip"),
                "delay_ms": {
                    "n": len(r.delays_ms),
                    "p50": percentile(r.delays_ms, 0.5),
                    "p99": percentile(r.delays_ms, 0.99),
                    "max": max(r.delays_ms, default=float("nan")),
                    "mean": statistics.fmean(r.delays_ms) if r.delays_ms else float("nan"),
                },
                "wake_ms": {"p50": percentile(r.wakes_ms, 0.5), "p99": percentile(r.wakes_ms, 0.99)},
                "round_trip_ms_p99": percentile(r.round_trips_ms, 0.99),
                "raw_at_idle_ms": {"p50": percentile(r.idle_raw_ms, 0.5), "p99": percentile(r.idle_raw_ms, 0.99)},
                "contended": None if r.contended is None else {"instances": r.contenders, **r.contended.summary()},
            }
        out.append(item)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    available = discover()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--backends",
        default=",".join(available),
        help=f"comma-separated cases from bench/cases/ (default: all of {', '.join(available)})",
    )
    parser.add_argument("--n", type=int, default=5000, help="timed operations of each kind (default 5000)")
    parser.add_argument(
        "--budget", type=float, default=5.0, help="seconds of throughput measurement per backend at most (default 5)"
    )
    parser.add_argument("--block", type=int, default=10, help="operations per block between kinds (default 10)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed operations of each kind first (~1 s at most)")
    parser.add_argument("--slots", type=int, default=200, help="slots measured for the delay (default 200)")
    parser.add_argument("--period", default="50ms", help="period of the delay loop's schedule (default 50ms)")
    parser.add_argument(
        "--contenders",
        type=int,
        default=0,
        help="also let this many instances claim each of --slots slots at once (default: off)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in names if b not in available]
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; cases in bench/cases/: {', '.join(available)}")
    args.names = names
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = [await bench_one(name, args) for name in args.names]
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(to_json(results), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
