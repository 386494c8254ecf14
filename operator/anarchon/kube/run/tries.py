"""A run's tries: which one is current, adopting or launching its one Pod, and the backoff
before the next one after a Pod failed.

Each try has its own Pod name (``<run>``, then ``<run>-r1``...), and the run's status says
which try is current and when it starts (``try``, ``nextTryTime``), written before its Pod is
launched: a backup taking the run over during a backoff launches that try at that time, and
one that finds the try's Pod adopts it. A try's Pod is launched only once the Pod before it
has failed: never two live Pods of a run.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from ...engine import RunInterrupted
from ...engine.attempt import ENDED, REPLACED, SHUTDOWN
from ...engine.durations import format_duration
from ..job.spec import pod_name
from . import runstatus
from .held import Held
from .pods import PodFate, PodView, build_pod, create_pod, delete_pod, fate_of, pods_of_run, read_pod, try_of
from .podwatch import interest_in
from .replaced import REPLACED_BY_NEWER, end_replaced

log = logging.getLogger("anarchon.kube.run.tries")


async def current_try(held: Held, status: runstatus.Status) -> tuple[int, list[PodView]]:
    """The try this attempt takes up, and that try's Pods.

    The run's status says which try is current (written before a retry's Pod is
    launched), and so do the Pods (each carries its try): whichever is further wins, so a
    status write lost with its runner never sends the run back to a try that already ran.
    A run whose object has no status yet has no Pod: an attempt writes the run's status
    before it launches a Pod, so it is the first try and nothing is read (the create finds a
    Pod left by an earlier object of the same name, being collected with it). Attempt 1 of
    a run that has a status (its object outlived the store's record of the run) reads its
    first try's Pod, one GET. A later attempt lists the run's Pods by label (the listing
    also finds a Pod that an earlier version named per attempt, ``<run>-a<N>``, as try 1);
    a LIST costs the API server a scan of the namespace's Pods, and most runs never need it.
    """
    namespace = held.spec.namespace
    if held.ctx.attempt == 1 and not status:
        return 1, []
    if held.ctx.attempt == 1:
        pod = await read_pod(held.kube, namespace, pod_name(held.name))
        return 1, [] if pod is None else [fate_of(pod)]
    pods = await pods_of_run(held.kube, namespace, held.name)
    current = max([runstatus.RunStatus.of(status).current_try, *(try_of(p) for p in pods)])
    return current, [fate_of(p) for p in pods if try_of(p) == current]


async def adopt_or_launch(
    held: Held, run_uid: str, try_number: int, existing: list[PodView], next_try_at: datetime | None
) -> tuple[PodView, bool]:
    """Adopt the Pod of the current try, or launch it (after its backoff, if it waits one).

    The Pod's view, and whether it was launched (read by its create, not before).
    """
    ctx, spec, name = held.ctx, held.spec, held.name
    keep = next((v for v in reversed(existing) if v.fate is not PodFate.LOST), None)
    if keep is not None:
        await held.confirm()
        if keep.fate not in (PodFate.SUCCEEDED, PodFate.FAILED):
            # A Pod that already ended only gives the run its outcome: the run is not
            # reopened as Running on the way (it may already say how it ended).
            await _start_attempt(held, keep.name, try_number, adopted=True)
        await held.events.about(
            spec,
            reason="Adopted",
            message=f"run {name} attempt {ctx.attempt} on {ctx.instance} adopted Pod {keep.name} ({keep.message})",
        )
        return keep, False
    if next_try_at is not None:
        await _back_off(held, try_number, next_try_at)
    if held.wake.is_set():
        await held.cancelled()
    await held.confirm()
    pod = pod_name(name, try_number)
    for lost in existing:
        # Lost Pods are terminal (evicted, their node shut down): nothing of them runs.
        await delete_pod(held.kube, spec.namespace, lost.name, grace_seconds=0)
    await _start_attempt(held, pod, try_number)
    body = build_pod(
        spec,
        run=name,
        pod=pod,
        slot=ctx.slot,
        attempt=ctx.attempt,
        try_number=try_number,
        instance=ctx.instance,
        run_uid=run_uid or None,
    )
    while True:
        created, new = await create_pod(held.kube, body)
        if new or fate_of(created).fate is not PodFate.LOST:
            break
        # The lost Pod deleted above is not gone yet and holds the try's one name.
        await _until_gone(held, pod)
    # AlreadyExists is our own create whose reply was lost, or another attempt's Pod (a
    # backup launched while we were frozen before our create): either way it is the try's
    # one Pod, never a second. Now that it exists, check that we still hold the run.
    if not await ctx.confirm():
        await _fenced_after_launch(held, pod, new)
        raise held.fenced()
    if new and held.wiring.on_launch is not None:
        held.wiring.on_launch(ctx)
    tried = f" try {try_number}" if try_number > 1 else ""
    await held.events.about(
        spec,
        reason="Launched",
        message=f"run {name} attempt {ctx.attempt}{tried} on {ctx.instance}: Pod {pod}",
    )
    return fate_of(created), True


async def retry_after(held: Held, try_number: int, view: PodView) -> datetime:
    """Try ``try_number`` failed and another follows: the run says which and when, before it waits."""
    spec, name = held.spec, held.name
    wait_ms = spec.retries.backoff_after_ms(try_number)
    # Whole seconds, as the run's status has it, rounded up: no runner starts the try early.
    at = datetime.now(UTC) + timedelta(milliseconds=wait_ms)
    at = at.replace(microsecond=0) + timedelta(seconds=1 if at.microsecond else 0)
    following = pod_name(name, try_number + 1)
    await held.write(
        lambda s: runstatus.try_failed(
            s, try_number=try_number, message=view.message, next_try_at=at, next_pod=following
        )
    )
    await held.events.about(
        spec,
        reason="TryFailed",
        warning=True,
        message=(
            f"run {name} try {try_number} of {spec.retries.max_tries} failed: {view.message};"
            f" try {try_number + 1} (Pod {following}) in {format_duration(wait_ms)}"
        ),
    )
    return at


async def _back_off(held: Held, try_number: int, at: datetime) -> None:
    """Wait until try ``try_number`` may start, holding the run (heartbeating its lease) all along.

    The timeout does not count meanwhile (it bounds a try, and a backoff is no work); it
    starts anew with the try. Stopped meanwhile, there is no Pod to leave or delete: on
    shutdown a backup launches the try at the same time; replaced, the run just ends.
    """
    ctx, wake = held.ctx, held.wake
    ctx.set_alive(True)
    while (left_s := (at - datetime.now(UTC)).total_seconds()) > 0 and not ctx.stop.is_set() and not wake.is_set():
        waits = {asyncio.ensure_future(ctx.stop.wait()), asyncio.ensure_future(wake.wait())}
        try:
            await asyncio.wait(waits, timeout=left_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
    if ctx.stop.is_set():
        if ctx.stop_reason == SHUTDOWN:
            raise RunInterrupted(f"{ctx.instance} stopping in the backoff: a backup launches try {try_number}")
        if ctx.stop_reason == REPLACED:
            await end_replaced(
                held.kube, held.spec.namespace, held.name, [], "replaced by a newer run (overlap Replace)"
            )
            raise RunInterrupted(f"replaced in the backoff before try {try_number}")
        raise held.fenced()


async def _fenced_after_launch(held: Held, pod: str, new: bool) -> None:
    """Fenced with the run's Pod just created (frozen past the lease between check and create).

    If another attempt holds the run, the Pod is left to it: it adopts the run's one Pod.
    If the run is over in the store, nobody would follow a Pod we started: it goes.
    """
    ctx, namespace, name = held.ctx, held.spec.namespace, held.name
    if ctx.stop_reason == REPLACED:
        await end_replaced(held.kube, namespace, name, [pod], REPLACED_BY_NEWER)
    elif ctx.stop_reason == ENDED and new:
        log.warning("%s attempt %d: the run ended while it launched: deleting its Pod %s", name, ctx.attempt, pod)
        await delete_pod(held.kube, namespace, pod, grace_seconds=0)
    else:
        log.warning("%s attempt %d fenced while launching: Pod %s left to the holder", name, ctx.attempt, pod)


async def _until_gone(held: Held, pod: str) -> None:
    """Until the lost Pod that holds the try's name is gone (deleted: it ran nothing more)."""
    ctx, namespace, pod_watch = held.ctx, held.spec.namespace, held.wiring.pod_watch
    while True:
        with interest_in(pod_watch, namespace, pod) as changed:
            if (lost := await read_pod(held.kube, namespace, pod)) is None:
                return
            # The lost Pod may be another replica's to watch: then its deletion is polled for.
            await held.wait(changed if pod_watch is None or pod_watch.covers(lost) else None)
        if ctx.stop.is_set():
            raise held.fenced() if ctx.stop_reason != SHUTDOWN else RunInterrupted(f"{ctx.instance} stopping")


async def _start_attempt(held: Held, pod: str, try_number: int, *, adopted: bool = False) -> None:
    """The run says this attempt follows ``pod``, the Pod of try ``try_number`` (launched or adopted)."""
    ctx = held.ctx
    try:
        await held.write(
            lambda s: runstatus.start_attempt(
                s, attempt=ctx.attempt, instance=ctx.instance, pod=pod, try_number=try_number, adopted=adopted
            )
        )
    except runstatus.RunEnded as exc:
        # Replaced or given up while this attempt was held up: nothing to launch or follow.
        raise RunInterrupted(f"attempt {ctx.attempt}: {exc}") from None
