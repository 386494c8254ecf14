"""One instance in its own OS process, for the multi-process tests.

Writes one line per event to ``--out`` (flushed at once, so a SIGKILL loses nothing
written before it): ``start <slot> <attempt> <instance>``, ``end <slot> <attempt> <reason>``;
in mode ``dup`` the slot is written ``<job>@<slot>``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from anarchon.engine import RunContext, RunInterrupted, Scheduler
from anarchon.engine.backends import from_url


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=["dup", "long"], required=True)
    p.add_argument("--jobs", type=int, default=50, help="mode dup: this many jobs, each every second")
    args = p.parse_args()
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def write(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    async def quick(ctx: RunContext) -> None:
        write(f"start {ctx.job}@{ctx.slot} {ctx.attempt} {ctx.instance}")

    async def long(ctx: RunContext) -> None:
        write(f"start {ctx.slot} {ctx.attempt} {ctx.instance}")
        try:
            await asyncio.wait_for(ctx.stop.wait(), 12)
        except TimeoutError:
            write(f"end {ctx.slot} {ctx.attempt} done")
            return
        write(f"end {ctx.slot} {ctx.attempt} {ctx.stop_reason}")
        if ctx.stop_reason == "shutdown":
            raise RunInterrupted("stopping")

    async def run() -> None:
        scheduler = Scheduler(from_url(args.store), instance_id=args.instance)
        if args.mode == "dup":
            # Many jobs each every second (the shortest period), rather than one job every 20 ms:
            # the same rate of slots, within the engine's limits.
            for i in range(args.jobs):
                scheduler.every(f"{args.job}-{i}", "1s", quick, jitter="10ms", overlap="Allow", heartbeat="1s")
        else:
            scheduler.every(args.job, "3s", long, jitter="200ms", heartbeat="500ms", lease="2s", max_attempts=5)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with scheduler:
            write(f"ready {args.instance}")
            await stop.wait()

    asyncio.run(run())
    sys.exit(0)


if __name__ == "__main__":
    main()
