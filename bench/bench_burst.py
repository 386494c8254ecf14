#!/usr/bin/env python
"""N jobs due at the same moment on one instance: claims batched vs sent one by one, side by side.

Run from the repository root (see bench/README.md)::

    PYTHONPATH=operator:. python bench/bench_burst.py [--backends redis,sqlite,postgres] [--jobs 1000]

For each lease store (``bench/cases/<name>.py``, on its own fresh server) one
:class:`Scheduler` gets N jobs on ``every 10s`` with jitter 0, so that all are due at once, and
claims one slot of each; twice, in a shuffled order: once through the instance's claim
batcher (:mod:`anarchon.engine.batch`, the default), once with every claim sent on its own
(as before the batcher). Printed per mode: claims won, claim errors, store round trips of
claims, and slot→claim-answer delay p50/p99/max. The ratio batched/one-by-one of p99 is the
number to read: both modes run on the same machine, the same store, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "operator"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from anarchon.engine import (  # noqa: E402 - after the path set-up
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    EngineListener,
    LeaseBackend,
    RunContext,
    Scheduler,
)
from anarchon.engine.batch import ClaimBatcher  # noqa: E402
from bench.bench_claims import percentile  # noqa: E402
from bench.cases import CaseUnavailable, lease_store  # noqa: E402

PERIOD = "10s"


class Delays(EngineListener):
    """Collects slot→claim delays and claim errors."""

    def __init__(self) -> None:
        self.delays_ms: list[int] = []
        self.won = 0
        self.errors = 0

    def claimed(self, job: str, slot: int, outcome: ClaimOutcome, delay_ms: int) -> None:
        self.delays_ms.append(delay_ms)
        self.won += outcome is ClaimOutcome.WON

    def store_error(self, operation: str, job: str, error: str) -> None:
        self.errors += operation == "claim"


class OneByOne(ClaimBatcher):
    """Every claim on its own round trip, as before the batcher."""

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        return await self.backend.claim(request)


async def burst(backend: LeaseBackend, jobs: int, batched: bool) -> dict[str, float]:
    trips = 0
    real_claim, real_many = backend.claim, backend.claim_many

    async def claim(request: ClaimRequest) -> ClaimResult:
        nonlocal trips
        trips += 1
        return await real_claim(request)

    async def claim_many(requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        nonlocal trips
        trips += 1
        return await real_many(requests)

    backend.claim, backend.claim_many = claim, claim_many  # type: ignore[method-assign]
    listener = Delays()
    scheduler = Scheduler(backend, instance_id=f"burst-{uuid.uuid4().hex[:6]}", listener=listener)
    if not batched:
        scheduler._claims = OneByOne(backend)  # the one thing this benchmark varies
    done = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        if listener.won >= jobs:
            done.set()

    prefix = f"burst-{uuid.uuid4().hex[:8]}"
    for i in range(jobs):
        scheduler.every(f"{prefix}-{i}", PERIOD, handler, jitter=0)
    await scheduler.start()
    try:
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.sleep(0.5)
    finally:
        await scheduler.stop(handover=False)
        backend.claim, backend.claim_many = real_claim, real_many  # type: ignore[method-assign]
    first = listener.delays_ms[:jobs]
    for i in range(jobs):
        await backend.forget_job(f"{prefix}-{i}")
    return {
        "won": listener.won,
        "errors": listener.errors,
        "trips": trips,
        "p50": percentile([float(d) for d in first], 0.5),
        "p99": percentile([float(d) for d in first], 0.99),
        "max": max(first),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="redis,sqlite,postgres")
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    print(
        f"{'backend':10} {'mode':12} {'won':>6} {'errors':>6} {'round trips':>11}"
        f" {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}"
    )
    for name in args.backends.split(","):
        try:
            async with lease_store(name) as backend:
                results = {}
                for batched in random.sample([True, False], 2):
                    mode = "batched" if batched else "one by one"
                    print(f"{name}: {args.jobs} jobs due at once, {mode} ...", file=sys.stderr, flush=True)
                    results[mode] = r = await burst(backend, args.jobs, batched)
                    print(
                        f"{name:10} {mode:12} {r['won']:>6.0f} {r['errors']:>6.0f} {r['trips']:>11.0f}"
                        f" {r['p50']:>7.0f} {r['p99']:>7.0f} {r['max']:>7.0f}",
                        flush=True,
                    )
                ratio = results["batched"]["p99"] / max(results["one by one"]["p99"], 1.0)
                print(f"{name:10} p99 batched / one by one: {ratio:.2f}")
        except (CaseUnavailable, ImportError) as exc:
            print(f"{name:10} unavailable: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
