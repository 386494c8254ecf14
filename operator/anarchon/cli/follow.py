"""Following one run to its end, for ``trigger --wait``: a line per change, then the outcome.

It polls the AnarchonRun (once a second) rather than watching it: the run may not exist yet
(no replica has claimed the slot), and a poll needs no resumable watch to survive an API
server restart. A run is over when its object says so (:attr:`anarchon.kube.run.runstatus.RunStatus.ended`):
an Interrupted run without a finish time still waits for its next attempt.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .common import Failure

if TYPE_CHECKING:
    from ..engine import RunState
    from ..kube.api.client import Kube

POLL_S = 1.0


def _progress(run: dict[str, Any]) -> tuple[Any, ...]:
    from ..kube.run.runstatus import RunStatus

    status = RunStatus.of(run.get("status"))
    return (status.phase, status.attempt, status.instance, status.reason)


def _line(run: dict[str, Any]) -> str:
    from ..engine import RunState
    from ..kube.run.runstatus import RunStatus

    status = RunStatus.of(run.get("status"))
    text = str(status.phase or "Created")
    if status.attempt:
        text += f", attempt {status.attempt}"
    if status.instance:
        text += f" on {status.instance}"
    if status.pod_name and status.phase is RunState.RUNNING:
        text += f", Pod {status.pod_name}"
    if status.reason:
        text += f" ({status.reason})"
    if status.message:
        text += f": {' '.join(status.message.split())}"
    return text


def _say(text: str) -> None:
    print(f"{datetime.now(UTC).strftime('%H:%M:%SZ')} {text}", flush=True)


async def follow(
    kube: Kube,
    namespace: str,
    name: str,
    timeout_s: float | None,
    *,
    absent_s: float | None = None,
    claimed: bool = False,
) -> RunState | None:
    """Print the run's changes until it is over; its final phase (raises :class:`Failure` on timeout).

    None if ``absent_s`` is given and the run has not appeared by then: a caller that knows
    the slot's trigger was handled learns that no run is coming (the store had decided the slot).
    A ``claimed`` run (one being cancelled) exists already: nothing is said of waiting for it.
    """
    from ..engine.durations import format_duration
    from ..kube.api.client import ApiException, call, path
    from ..kube.constants import RUNS
    from ..kube.run.runstatus import RunStatus

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    took = "" if timeout_s is None else format_duration(round(timeout_s * 1000))
    absent_deadline = None if absent_s is None else time.monotonic() + absent_s
    seen: tuple[Any, ...] | None = None
    if not claimed:
        _say(f"waiting for a replica to claim run {name}")
    while True:
        try:
            run = dict(
                await call(
                    f"reading run {name}",
                    lambda: kube.request("GET", path(RUNS, namespace, name)),
                )
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            run = None
        if run is not None:
            if _progress(run) != seen:
                seen = _progress(run)
                _say(_line(run))
            if (status := RunStatus.of(run.get("status"))).ended:
                return status.phase
        if run is None and absent_deadline is not None and time.monotonic() >= absent_deadline:
            return None
        if deadline is not None and time.monotonic() >= deadline:
            where = "no replica has claimed it yet" if run is None else f"it is {_line(run)}, and goes on"
            raise Failure(f"run {name} is not over after --timeout {took}: {where}")
        await asyncio.sleep(POLL_S)
