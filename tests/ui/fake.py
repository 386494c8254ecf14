"""AnarchonRuns as a replica would have written them, created through the API without one: a kept
history of any size in seconds (tests/ui's job of 1,000 runs, bench/bench_ui.py's 10,000).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from anarchon.kube.api.client import Kube, connect, path
from anarchon.kube.constants import MERGE
from anarchon.kube.job.spec import run_name, slot_time

#: A run to create and the status to write on it.
Made = tuple[dict[str, Any], dict[str, Any]]


def mixed_phase(i: int) -> str:
    """The ``i``-th run's phase in a history of 8 in 10 Succeeded, 1 Failed, 1 Skipped."""
    return {8: "Skipped", 9: "Failed"}.get(i % 10, "Succeeded")


def fake_run(namespace: str, job: str, slot: int, i: int, phase: str | None = None) -> Made:
    """The ``i``-th run of ``job`` and its status: ``phase`` (else :func:`mixed_phase`); one in 50
    taken over by a second replica; a Failed run after a retry; a Running one still on its Pod."""
    phase = phase or mixed_phase(i)
    name = run_name(job, slot)
    start, end = slot_time(slot + 1500), slot_time(slot + 20_000)
    body = {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonRun",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"anarchon.io/job": job, "app.kubernetes.io/managed-by": "anarchon"},
        },
        "spec": {"job": job, "slot": slot, "slotTime": slot_time(slot), "trigger": "Schedule"},
    }
    if phase == "Skipped":
        return body, {"phase": "Skipped", "attempt": 0, "instance": "replica-x", "finishTime": start}
    attempts: list[dict[str, Any]] = [
        {"attempt": 1, "instance": "replica-x", "launched": True, "podName": name, "startTime": start}
    ]
    if i % 50 == 0:
        attempts.append({"attempt": 2, "instance": "replica-y", "adopted": True, "startTime": slot_time(slot + 9000)})
    tries: list[dict[str, Any]] = [{"try": 1, "podName": name, "startTime": start}]
    status: dict[str, Any] = {"phase": phase, "startTime": start, "message": ""}
    if phase != "Running":
        attempts[-1] |= {"outcome": phase, "finishTime": end}
        tries[0] |= {"outcome": phase, "finishTime": end}
        status["finishTime"] = end
    if phase == "Failed":
        tries.append({"try": 2, "podName": f"{name}-r1", "outcome": "Failed", "startTime": slot_time(slot + 10_000)})
        tries[-1]["finishTime"] = end
        status["message"] = "exit code 1"
    elif phase == "Cancelled":
        status["message"] = "cancelled by alice: wrong input"
    elif phase == "Interrupted":
        status["message"] = "the Pod was deleted"
    status |= {
        "attempt": len(attempts),
        "instance": attempts[-1]["instance"],
        "takeovers": len(attempts) - 1,
        "try": len(tries),
        "tries": tries,
        "attempts": attempts,
    }
    return body, status


async def create_all(kube: Kube, resource: str, made: list[Made], concurrency: int = 16) -> None:
    """Create each object, then write its status through the status subresource, ``concurrency``
    at a time (all at once, the last would time out waiting for a connection)."""
    turns = asyncio.Semaphore(concurrency)

    async def create(body: dict[str, Any], status: dict[str, Any]) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        async with turns:
            await kube.request("POST", path(resource, namespace), body)
            where = path(resource, namespace, name, "status")
            await kube.request("PATCH", where, {"status": status}, content_type=MERGE)

    await asyncio.gather(*(create(body, status) for body, status in made))


def write_runs(kubeconfig: Path, runs: list[Made]) -> None:
    """Create the runs and write their status, over one client's kept-alive connections."""

    async def write_all() -> None:
        kube = await connect(str(kubeconfig))
        try:
            await create_all(kube, "anarchonruns", runs)
        finally:
            await kube.close()

    asyncio.run(write_all())
