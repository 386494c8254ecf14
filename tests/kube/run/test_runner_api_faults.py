"""PodRunner with the API server failing under it: 500s, 503s, lost replies, an outage.

The runner talks to the real API server through tests/faults/apiproxy.py, which fails the
requests a test aims at. The lease is scripted as in test_runner_fencing.py. Whatever the
API server does, the run's recorded outcome is what its Pod did: a transient error is
retried; one that outlasts the retries interrupts the attempt (the next one adopts the Pod),
and never fails or succeeds the run by itself.

The record of a Skipped slot (runs.record_skipped: a create and a status write, with no
runner behind them) is held to the same faults at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from anarchon.engine import RunInterrupted, RunSkipped
from anarchon.engine.attempt import SHUTDOWN
from anarchon.kube.api import client as kube_client
from anarchon.kube.api.client import Kube
from anarchon.kube.job.spec import JobSpec, parse_job, run_name
from anarchon.kube.report.kube_events import EventPoster
from anarchon.kube.run import record as runs
from anarchon.kube.run.podwatch import PodWatch
from anarchon.kube.run.runner import PodRunner
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.runs import RUN_STATUS, SLOT, YES, attempt, started
from tests.harness.until import until


@pytest.fixture
def spec(cluster: Cluster) -> Iterator[JobSpec]:
    cluster.apply(job_manifest("api-faults", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "2"}))
    yield parse_job(cluster.get("anarchonjob", "api-faults"))


def _run(cluster: Cluster, spec: JobSpec) -> dict[str, Any]:
    return dict(cluster.get("anarchonrun", run_name(spec.name, SLOT)) or {})


def _pods(cluster: Cluster, spec: JobSpec) -> list[str]:
    return [p["metadata"]["name"] for p in cluster.pods(f"anarchon.io/run={run_name(spec.name, SLOT)}")]


async def _attempt(kube: Kube, spec: JobSpec) -> None:
    await asyncio.wait_for(PodRunner(kube, EventPoster(kube), lambda: spec)(attempt(1, *YES)), 60)


TRANSIENT = {
    "500 on the run's create": Fault("status", code=500, verb="create", resource="anarchonruns", times=1),
    "run created, reply lost": Fault("lost_reply", verb="create", resource="anarchonruns", times=1),
    "429 on the Pod's read": Fault("status", code=429, verb="get", resource="pods", times=2),
    "503 on the Pod's create": Fault("status", code=503, verb="create", resource="pods", times=2),
    "Pod created, reply lost": Fault("lost_reply", verb="create", resource="pods", times=1),
    "reset on a status write": Fault("reset", verb="update", times=1, **RUN_STATUS),
    "status written, reply lost": Fault("lost_reply", verb="update", times=2, **RUN_STATUS),
}


@pytest.mark.parametrize("what", list(TRANSIENT))
async def test_a_transient_api_fault_is_retried_and_the_run_ends_as_its_pod_did(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, what: str
) -> None:
    fault = proxy.add(dataclasses.replace(TRANSIENT[what]))  # a fresh copy: it counts its hits
    await _attempt(through_proxy, spec)
    assert fault.fired == fault.times, f"the fault ({what}) must have hit"
    status = _run(cluster, spec)["status"]
    assert status["phase"] == "Succeeded", status
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)], "one Pod, whatever was retried"


async def test_attempt_one_reads_its_pod_by_name_and_lists_no_pods(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube
) -> None:
    """A LIST by label makes the API server scan the namespace's Pods: a run's first attempt needs none."""
    await _attempt(through_proxy, spec)
    assert _run(cluster, spec)["status"]["phase"] == "Succeeded"
    assert proxy.count(verb="list", resource="pods") == 0
    assert proxy.count(verb="get", resource="pods", name=run_name(spec.name, SLOT)) >= 1


async def test_a_500_on_the_final_status_write_never_fails_a_succeeded_run(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube
) -> None:
    """The Pod succeeded; the write that says so meets 500s. Before, the run was recorded Failed."""
    task = asyncio.create_task(_attempt(through_proxy, spec))
    await asyncio.to_thread(until, "the Pod", lambda: _pods(cluster, spec), timeout=30)
    fault = proxy.add(Fault("status", code=500, verb="update", times=3, **RUN_STATUS))
    await task
    assert fault.fired == 3
    assert _run(cluster, spec)["status"]["phase"] == "Succeeded"


async def test_an_api_outage_past_the_retries_interrupts_the_attempt_and_leaves_the_pod(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Status writes fail for longer than the retries: the attempt is interrupted, never Failed or Succeeded.

    The next attempt adopts the Pod and records its outcome (test_operator's adoption tests).
    """
    monkeypatch.setattr(kube_client, "RETRY_FOR_MS", 1_500)
    task = asyncio.create_task(_attempt(through_proxy, spec))
    await asyncio.to_thread(until, "the Pod", lambda: _pods(cluster, spec), timeout=30)
    fault = proxy.add(Fault("status", code=503, verb="update", **RUN_STATUS))
    with pytest.raises(RunInterrupted, match="503"):
        await task
    assert fault.fired >= 2, "retried before giving up"
    assert _run(cluster, spec)["status"]["phase"] == "Running", "nothing may be recorded from a failed write"
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)], "the Pod is left for the next attempt"


def _create_lost_then_reads(proxy: ApiFaultProxy, spec: JobSpec, code: int, times: int | None) -> tuple[Fault, Fault]:
    """The Pod's create is applied but its reply lost; then the reads of that Pod fail with ``code``.

    The runner's retry of the create hears AlreadyExists, and only a read of the Pod tells it
    what it made (the first attempt reads nothing before its create: it had no Pod to look for).
    """
    lost = proxy.add(Fault("lost_reply", verb="create", resource="pods", times=1))
    pod = run_name(spec.name, SLOT)
    reads = proxy.add(Fault("status", code=code, verb="get", resource="pods", name=pod, times=times))
    return lost, reads


async def test_a_pod_create_whose_reply_was_lost_is_read_through_transient_faults(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube
) -> None:
    lost, reads = _create_lost_then_reads(proxy, spec, 500, 2)
    await _attempt(through_proxy, spec)
    assert (lost.fired, reads.fired) == (1, 2), "the create's reply was lost, then the read after it failed twice"
    assert _run(cluster, spec)["status"]["phase"] == "Succeeded"
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)], "one Pod: the retried create made none"


async def test_a_pod_create_whose_reply_was_lost_and_never_read_interrupts_the_attempt_and_the_next_adopts_it(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read after the lost reply fails past the retries: nothing is known of the Pod.

    The attempt must not end the run (it launched a Pod that runs) nor launch again: it is
    interrupted with the run Running, and the next attempt adopts the one Pod to its end.
    """
    monkeypatch.setattr(kube_client, "RETRY_FOR_MS", 1_500)
    _, reads = _create_lost_then_reads(proxy, spec, 503, None)
    with pytest.raises(RunInterrupted, match="503"):
        await _attempt(through_proxy, spec)
    assert reads.fired >= 2, "retried before giving up"
    assert _run(cluster, spec)["status"]["phase"] == "Running", "nothing may be recorded from a failed read"
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)], "the Pod is left for the next attempt"
    proxy.clear()
    await asyncio.wait_for(PodRunner(through_proxy, EventPoster(through_proxy), lambda: spec)(attempt(2, *YES)), 60)
    status = _run(cluster, spec)["status"]
    assert (status["phase"], status["attempt"]) == ("Succeeded", 2), status
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)], "adopted, never launched a second time"


async def test_a_runner_frozen_before_its_create_adopts_the_backups_pod_instead_of_launching_a_second(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, kube: Kube
) -> None:
    """The API server is the last fence: one Pod name per run, so the late create gets AlreadyExists.

    Attempt 1 checked its lease, then stalled (here: its create is held 4 s on the way); a
    backup took the run over and launched. Before, attempt 1's create then made a second
    Pod (``-a1`` beside ``-a2``) that ran until attempt 1's next lease check deleted it.
    """
    stall = proxy.add(Fault("latency", seconds=4.0, verb="create", resource="pods", times=1))
    first = attempt(1, True)
    script, answered = first.confirm, asyncio.Event()
    held = asyncio.Event()

    async def confirm() -> bool:
        if await script():
            return True
        answered.set()
        await held.wait()  # attempt 1 sits right after its create: what Pods are there now?
        return False

    first.confirm = confirm
    frozen = asyncio.create_task(PodRunner(through_proxy, EventPoster(through_proxy), lambda: spec)(first))
    while not stall.fired:  # noqa: ASYNC110 - attempt 1 checked its lease and sent its create
        await asyncio.sleep(0.05)
    backup = asyncio.create_task(PodRunner(kube, EventPoster(kube), lambda: spec)(attempt(2, *YES)))
    await asyncio.wait_for(answered.wait(), 30)
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)], "one Pod per run, never a second"
    held.set()
    with pytest.raises(RunInterrupted, match="fenced"):
        await asyncio.wait_for(frozen, 30)
    await asyncio.wait_for(backup, 60)  # the backup follows the run's one Pod to its success
    assert _run(cluster, spec)["status"]["phase"] == "Succeeded"
    assert _pods(cluster, spec) == [run_name(spec.name, SLOT)]


#: Requests the API server holds up for longer than any hand-over may take.
HELD_UP = {
    "the run's create": Fault("latency", seconds=30, verb="create", resource="anarchonruns", times=1),
    "the run's status write": Fault("latency", seconds=30, verb="update", times=1, **RUN_STATUS),
    "the Pod's create": Fault("latency", seconds=30, verb="create", resource="pods", times=1),
}


@pytest.mark.parametrize("what", list(HELD_UP))
async def test_a_shutdown_hands_over_at_once_whatever_request_is_held_up(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, what: str
) -> None:
    """SIGTERM while a request hangs: the attempt is handed over at once, not after the request.

    Before, the runner waited for the request it had in flight (held 30 s here) and the engine
    for its stop grace (5 s) before cancelling it, so the hand-over took the grace: the soak
    saw one take 8.3 s against its bound of 3 s.
    """
    fault = proxy.add(dataclasses.replace(HELD_UP[what]))
    ctx = attempt(1, *YES)
    task = asyncio.create_task(PodRunner(through_proxy, EventPoster(through_proxy), lambda: spec)(ctx))
    deadline = asyncio.get_running_loop().time() + 30
    while not fault.fired:
        assert not task.done(), task
        assert asyncio.get_running_loop().time() < deadline, f"{what} was never sent"
        await asyncio.sleep(0.05)
    ctx.request_stop(SHUTDOWN)
    with pytest.raises(RunInterrupted, match="stopping"):
        await asyncio.wait_for(task, 2)


async def _record_skipped(kube: Kube, spec: JobSpec, reason: str) -> None:
    """runs.record_skipped of SLOT (a manual trigger), as replica "skipper" records it."""
    await asyncio.wait_for(runs.record_skipped(kube, spec, SLOT, reason, "Manual", instance="skipper"), 60)


def _upstream(proxy: ApiFaultProxy, verb: str, subresource: str) -> list[int | None]:
    """What the API server answered to each of the run's requests of ``verb`` that it got, in order."""
    return [
        r.upstream
        for r in proxy.requests
        if r.resource == "anarchonruns" and r.verb == verb and r.subresource == subresource and r.forwarded
    ]


#: A fault on a Skipped run's record, and the answers the API server then gives to its creates
#: and its status writes (200: written; 409: a retry of what was applied, its reply lost).
SKIP_FAULTS: dict[str, tuple[Fault, list[int], list[int]]] = {
    "500 on the create": (Fault("status", code=500, verb="create", resource="anarchonruns", times=1), [201], [200]),
    "created, reply lost": (Fault("lost_reply", verb="create", resource="anarchonruns", times=1), [201, 409], [200]),
    "created, 504 instead of the reply": (
        Fault("lost_reply", reply="status", verb="create", resource="anarchonruns", times=1),
        [201, 409],
        [200],
    ),
    "500 on the status write": (Fault("status", code=500, verb="update", times=1, **RUN_STATUS), [201], [200]),
    # Twice: aiohttp sends a PUT whose connection closed once more by itself (on the version it
    # just replaced: 409, that reply lost too); the try after that reads the run, finds it written.
    "status written, reply lost": (Fault("lost_reply", verb="update", times=2, **RUN_STATUS), [201], [200, 409]),
}


@pytest.mark.parametrize("what", list(SKIP_FAULTS))
async def test_a_skipped_runs_record_is_written_whole_through_an_api_fault(
    cluster: Cluster, spec: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, what: str
) -> None:
    """A Skipped slot's run is created and its status written in one turn, the status from the
    created (or, after a 409, the read) object: a fault on either is retried, and the slot ends
    with one run that says Skipped and why, never a run without a phase (mending takes that for
    an open run) nor an error out of the record.
    """
    fault, creates, writes = SKIP_FAULTS[what]
    fault = proxy.add(dataclasses.replace(fault))  # a fresh copy: it counts its hits
    await _record_skipped(through_proxy, spec, "the run of an earlier slot was still active")
    assert fault.fired == fault.times, f"the fault ({what}) must have hit"
    assert (_upstream(proxy, "create", ""), _upstream(proxy, "update", "status")) == (creates, writes), what
    recorded = cluster.runs(spec.name)
    assert [r["metadata"]["name"] for r in recorded] == [run_name(spec.name, SLOT)], "one run for the slot"
    status = recorded[0].get("status") or {}
    assert status == {
        "phase": "Skipped",
        "message": "the run of an earlier slot was still active",
        "attempt": 0,
        "instance": "skipper",
    }, status
    assert recorded[0]["spec"]["trigger"] == "Manual"


@pytest.fixture
def lasting(cluster: Cluster) -> Iterator[JobSpec]:
    """A job whose Pods run 8 s: time for a backup to adopt one while it runs."""
    cluster.apply(job_manifest("adopted", every="1h", suspend=True, annotations={"anarchon.test/run-seconds": "8"}))
    yield parse_job(cluster.get("anarchonjob", "adopted"))


def _follower(cluster: Cluster, spec: JobSpec) -> str:
    (pod,) = cluster.pods(f"anarchon.io/run={run_name(spec.name, SLOT)}")
    return str(pod["metadata"]["labels"]["anarchon.io/follower"])


async def _launched_and_left(kube: Kube, spec: JobSpec) -> None:
    """Attempt 1 (``runner-1``) launches the run's Pod and is fenced right after: the Pod runs on."""
    with pytest.raises(RunInterrupted, match="fenced"):
        await asyncio.wait_for(PodRunner(kube, EventPoster(kube), lambda: spec)(attempt(1, True)), 30)


@contextlib.asynccontextmanager
async def _pod_watch(kube: Kube, namespace: str, follower: str) -> AsyncIterator[PodWatch]:
    watch = await started(PodWatch(kube, [namespace], follower=follower))
    try:
        yield watch
    finally:
        await watch.stop()


async def test_an_adopted_pod_is_labelled_for_its_new_follower_whose_watch_sees_its_end(
    cluster: Cluster, lasting: JobSpec, kube: Kube
) -> None:
    """Each replica watches only the Pods labelled as followed by it: the backup that adopts a Pod
    moves the label to itself, or its watch would never tell it of the Pod's end. Polling is
    made slower than the test's bound here, so only the watch can end the run in time."""
    await _launched_and_left(kube, lasting)
    assert _follower(cluster, lasting) == "runner-1"
    async with _pod_watch(kube, lasting.namespace, "runner-2") as watch:
        backup = PodRunner(kube, EventPoster(kube), lambda: lasting, pod_watch=watch, poll_s=60, resync_s=60)
        await asyncio.wait_for(backup(attempt(2, *YES)), 30)
    assert _follower(cluster, lasting) == "runner-2"
    status = _run(cluster, lasting)["status"]
    assert (status["phase"], status["attempt"]) == ("Succeeded", 2), status


RELABEL = {"resource": "pods", "verb": "patch"}
RELABEL_FAULTS = {
    "500 on every relabel": Fault("status", code=500, **RELABEL),
    "relabelled, reply lost": Fault("lost_reply", times=1, **RELABEL),
    "relabel held up": Fault("latency", seconds=12, times=1, **RELABEL),
    "relabel timed out": Fault("latency", seconds=10, times=1, **RELABEL),  # the client gives up at 2 s here
}


@pytest.mark.parametrize("what", list(RELABEL_FAULTS))
async def test_an_adopted_pod_whose_relabel_fails_is_polled_to_its_end(
    cluster: Cluster,
    lasting: JobSpec,
    proxy: ApiFaultProxy,
    through_proxy: Kube,
    kube: Kube,
    what: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed relabel only makes the outcome polled for (and the relabel tried again): it never
    stalls the attempt, fails it, or leaves the run without its end."""
    await _launched_and_left(kube, lasting)
    if what == "relabel timed out":
        monkeypatch.setattr(kube_client, "REQUEST_TIMEOUT_S", 2.0)
    fault = proxy.add(dataclasses.replace(RELABEL_FAULTS[what]))
    async with _pod_watch(kube, lasting.namespace, "runner-2") as watch:
        backup = PodRunner(
            through_proxy, EventPoster(through_proxy), lambda: lasting, pod_watch=watch, poll_s=1, resync_s=60
        )
        await asyncio.wait_for(backup(attempt(2, *YES)), 45)
    assert fault.fired >= 1, f"the fault ({what}) must have hit"
    status = _run(cluster, lasting)["status"]
    assert (status["phase"], status["attempt"]) == ("Succeeded", 2), status
    assert _pods(cluster, lasting) == [run_name(lasting.name, SLOT)], "adopted, never launched beside"
    if fault.times is None:
        assert _follower(cluster, lasting) == "runner-1", "no relabel got through"
        assert fault.fired >= 2, "tried again at the next look"


async def test_a_stale_runner_does_not_take_the_pods_label_from_the_attempt_that_holds_the_run(
    cluster: Cluster, lasting: JobSpec, kube: Kube
) -> None:
    """The label moves only after a lease check: a fenced runner taking it would blind the holder's watch."""
    await _launched_and_left(kube, lasting)
    async with _pod_watch(kube, lasting.namespace, "runner-2") as watch:
        stale = PodRunner(kube, EventPoster(kube), lambda: lasting, pod_watch=watch, poll_s=1)
        # Its lease holds for the adoption and the status write, and is found lost at the relabel.
        with pytest.raises(RunInterrupted, match="fenced"):
            await asyncio.wait_for(stale(attempt(2, True)), 30)
    assert _follower(cluster, lasting) == "runner-1"


@pytest.fixture
def skipping(cluster: Cluster) -> Iterator[JobSpec]:
    """An overlap Skip job whose Pods run 20 s: an earlier run's Pod is live when a slot is due."""
    cluster.apply(
        job_manifest(
            "skip-faults", every="1h", suspend=True, overlap="Skip", annotations={"anarchon.test/run-seconds": "20"}
        )
    )
    yield parse_job(cluster.get("anarchonjob", "skip-faults"))


OVERLAP_FAULTS = {
    "500 on the LIST of the job's runs": Fault("status", code=500, verb="list", resource="anarchonruns", times=2),
    "reset on the LIST of a run's Pods": Fault("reset", verb="list", resource="pods", times=1),
    "Skipped written, reply lost": Fault("lost_reply", verb="update", times=1, **RUN_STATUS),
}


@pytest.mark.parametrize("what", list(OVERLAP_FAULTS))
async def test_skip_asks_kubernetes_for_live_pods_through_api_faults(
    cluster: Cluster, skipping: JobSpec, proxy: ApiFaultProxy, through_proxy: Kube, what: str
) -> None:
    """The store knows no active run (it lost its state), but an earlier run's Pod is live: the
    new run asks Kubernetes (its job's open runs, their Pods) before its first launch. A fault on
    any of those reads or on the Skipped write is retried: the slot ends Skipped, no Pod of its own.
    """
    spec = skipping
    earlier = attempt(1, True)
    earlier.slot = SLOT - 3_600_000
    with pytest.raises(RunInterrupted, match="fenced"):  # launched, then fenced: its Pod runs on
        await asyncio.wait_for(PodRunner(through_proxy, EventPoster(through_proxy), lambda: spec)(earlier), 30)
    fault = proxy.add(dataclasses.replace(OVERLAP_FAULTS[what]))
    with pytest.raises(RunSkipped, match="still active"):
        await _attempt(through_proxy, spec)
    assert fault.fired == fault.times, f"the fault ({what}) must have hit"
    assert _pods(cluster, spec) == [], "never launched beside the live Pod"
    assert _run(cluster, spec)["status"]["phase"] == "Skipped"


async def test_skip_launches_nothing_while_kubernetes_cannot_say_what_runs(
    cluster: Cluster,
    skipping: JobSpec,
    proxy: ApiFaultProxy,
    through_proxy: Kube,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reads that decide Skip fail past their retries: the attempt breaks off and launches nothing
    (the next attempt asks again); it never takes "no answer" for "nothing runs"."""
    monkeypatch.setattr(kube_client, "RETRY_FOR_MS", 1_500)
    spec = skipping
    fault = proxy.add(Fault("status", code=503, verb="list", resource="anarchonruns"))
    with pytest.raises(RunInterrupted, match="503"):
        await _attempt(through_proxy, spec)
    assert fault.fired >= 2, "retried before giving up"
    assert _pods(cluster, spec) == []
    assert not (_run(cluster, spec).get("status") or {}).get("phase"), "nothing may be recorded from a failed read"
