"""One attempt of a run, in-process, for the runner's tests against the real API server.

The lease is scripted (what ``ctx.confirm()``, the heartbeat that tells an attempt it still holds
the lease, answers); everything else is real: the AnarchonJob, the AnarchonRun, the Pods (KWOK).
"""

from __future__ import annotations

from anarchon.engine import RunContext
from anarchon.kube.run.podwatch import PodWatch
from tests.harness.until import until_async

#: The slot every such test runs (a manual trigger's: far from any scheduled one).
SLOT = 1_800_000_000_000
#: What confirm() answers when the lease holds throughout.
YES = [True] * 100
#: A fault's aim (tests/faults/apiproxy.py) at the run's status writes.
RUN_STATUS = {"resource": "anarchonruns", "subresource": "status"}


def attempt(n: int, *answers: bool) -> RunContext:
    """Attempt ``n`` whose successive confirm() calls answer ``answers`` (then False)."""
    ctx = RunContext(job="fenced", slot=SLOT, attempt=n, token=f"t{n}", instance=f"runner-{n}")
    script = iter(answers)

    async def confirm() -> bool:
        return next(script, False)

    ctx.confirm = confirm
    return ctx


async def started(pods: PodWatch) -> PodWatch:
    """``pods`` started, once its watch is up."""
    pods.start()
    await until_async("the Pod watch to start", lambda: pods.healthy, timeout=10, interval=0.05)
    return pods
