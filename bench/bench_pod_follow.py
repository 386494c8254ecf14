#!/usr/bin/env python
"""Following running Pods: reading each every second vs waking on the Pod watch (the runner's way).

Run from the repository root (needs the control plane built by e2e/controlplane/build.sh)::

    PYTHONPATH=operator:. python bench/bench_pod_follow.py [--pods 100]

It starts the test control plane (KWOK runs the Pods), creates ``--pods`` Pods that run for
5 to 15 s, and follows every Pod twice at once, side by side on the same Pods and machine:

- ``poll``: read the Pod, sleep ``POLL_S`` (1 s), again, until it is no longer live: what
  every runner did before the watch;
- ``watch``: take interest in the Pod on a :class:`~anarchon.kube.run.podwatch.PodWatch`, read
  it, and sleep until the watch says it changed (or ``RESYNC_S`` passed): what runners do now.

A third, separate watch notes when the API server announced each Pod's end: the lateness
of each mode is the time it saw the end minus that. Printed: API reads per mode (and the
ratio watch/poll: lower is better) and lateness p50/p99 per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e" / "controlplane"))

from controlplane import ControlPlane  # noqa: E402

from anarchon.kube.api.client import Kube, connect, path  # noqa: E402
from anarchon.kube.constants import LABEL_MANAGED_BY, MANAGED_BY  # noqa: E402
from anarchon.kube.run.pods import PodFate, fate_of, read_pod  # noqa: E402
from anarchon.kube.run.podwatch import PodWatch, interest_in, wait_for_change  # noqa: E402
from anarchon.kube.run.runner import PodRunner  # noqa: E402

POLL_S = PodRunner.__init__.__kwdefaults__["poll_s"]
RESYNC_S = PodRunner.__init__.__kwdefaults__["resync_s"]


def pod(name: str, seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {"anarchon.test/run-seconds": str(seconds)},
        },
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]},
    }


async def follow(kube: Kube, ns: str, name: str, watch: PodWatch | None, reads: list[int]) -> float:
    """The runner's loop (interest, read, wait_for_change) until the Pod is no longer live;
    returns when that was seen (monotonic). Without a watch it polls, as runners did before."""
    never = asyncio.Event()
    while True:
        with interest_in(watch, ns, name) as changed:
            view = fate_of(await read_pod(kube, ns, name))
            reads[0] += 1
            if view.fate is not PodFate.LIVE:
                return time.monotonic()
            await wait_for_change(watch, changed, never, poll_s=POLL_S, resync_s=RESYNC_S)


async def ends_announced(kube: Kube, ns: str, names: set[str], ended: dict[str, float]) -> None:
    """The reference: when the API server's watch announced each Pod's end."""
    raw = await kube.stream(path("pods", ns), {"watch": True, "labelSelector": f"{LABEL_MANAGED_BY}={MANAGED_BY}"}, 300)
    try:
        async for line in raw.content:
            event = json.loads(line)
            obj = event.get("object") or {}
            name = (obj.get("metadata") or {}).get("name")
            if name in names and name not in ended and (obj.get("status") or {}).get("phase") == "Succeeded":
                ended[name] = time.monotonic()
                if len(ended) == len(names):
                    return
    finally:
        raw.release()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(cp: ControlPlane, n: int) -> None:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", ns)
    kube = await connect(str(cp.kubeconfig))
    watch = PodWatch(kube, [ns])
    watch.start()
    try:
        for _ in range(600):
            if watch.healthy:
                break
            await asyncio.sleep(0.05)
        names = {f"p{i}" for i in range(n)}
        ended: dict[str, float] = {}
        reference = asyncio.create_task(ends_announced(kube, ns, names, ended))
        rng = random.Random(7)
        for name in sorted(names):
            await kube.request("POST", path("pods", ns), pod(name, rng.randint(5, 15)))
        poll_reads, watch_reads = [0], [0]
        polled = {name: asyncio.create_task(follow(kube, ns, name, None, poll_reads)) for name in names}
        watched = {name: asyncio.create_task(follow(kube, ns, name, watch, watch_reads)) for name in names}
        await asyncio.wait_for(asyncio.gather(reference, *polled.values(), *watched.values()), 120)
    finally:
        await watch.stop()
        await kube.close()
        cp.kubectl("delete", "namespace", ns, "--wait=false")

    def late(tasks: dict[str, asyncio.Task[float]]) -> list[float]:
        return [max(0.0, tasks[name].result() - ended[name]) * 1000 for name in names]

    print(f"{n} Pods running 5-15 s; poll every {POLL_S:g} s vs watch (resync {RESYNC_S:g} s)")
    print(f"{'mode':<6} {'API reads':>9} {'reads/Pod':>9} {'late p50 ms':>11} {'late p99 ms':>11}")
    for mode, reads, tasks in (("poll", poll_reads[0], polled), ("watch", watch_reads[0], watched)):
        lateness = late(tasks)
        p50, p99 = statistics.median(lateness), percentile(lateness, 0.99)
        print(f"{mode:<6} {reads:>9} {reads / n:>9.1f} {p50:>11.0f} {p99:>11.0f}")
    print(f"ratio  API reads watch/poll = {watch_reads[0] / poll_reads[0]:.2f} (lower is better)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    args = parser.parse_args()
    cp = ControlPlane(node_count=3)
    cp.start()
    try:
        asyncio.run(measure(cp, args.pods))
    finally:
        cp.stop()


if __name__ == "__main__":
    main()
