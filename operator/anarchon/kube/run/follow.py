"""Following a try's Pod to its end: from the watch's copy, or a read; the job's timeout; a cancel.

The outcome comes from the Pod alone (see :mod:`.runner`): Succeeded ends the run, Failed
either asks for the next try or ends the run, lost ends the attempt for the next one to
relaunch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from ...engine import RunInterrupted, RunState
from ...engine.attempt import REPLACED, SHUTDOWN
from ...engine.durations import format_duration
from ..api.client import ApiException, in_background
from ..api.watching import uid_of
from . import runstatus
from .held import Held
from .pending import pending
from .pods import PodFate, PodView, delete_pod, fate_of, follow_pod, follower_of, read_pod, running_for_s
from .podwatch import PodChange, interest_in
from .replaced import REPLACED_BY_NEWER, end_replaced

log = logging.getLogger("anarchon.kube.run.follow")


@dataclass
class _Label:
    """What one follow of a Pod saw of its follower label: ours at some look, and gone from us since."""

    ours: bool = False
    lost: bool = False


async def follow(held: Held, view: PodView, try_number: int, since: PodChange | None) -> PodView | None:
    """Follow the try's Pod to its end; the Pod's view if it failed and another try follows.

    ``since`` holds the Pod's changes since ``view`` was read, if the watch was told to
    keep them (None: ``view`` may be stale, the Pod is read first).
    """
    ctx, spec, name, pod_watch = held.ctx, held.spec, held.name, held.wiring.pod_watch
    pod = view.name
    shown: str | None = None  # the reason the run shows for its Pending Pod, if any
    woke = since  # what woke us last, with the Pod if the watch delivered it
    current = since is not None and not since.is_set()  # ``view`` is the Pod as it is
    # Woken by the clock while the watch was up (nothing changed, most likely): that read
    # is background work, behind the requests that launch runs and write their ends.
    resync = False
    past_deadline = False  # the Pod ran past the job's timeout: it was deleted, and is followed to its end
    label = _Label()  # whether the Pod's follower label was ours, and left us since
    cancel = held.wake
    while True:
        if ctx.stop.is_set():
            await _stopped(held, pod)
            return None
        with interest_in(pod_watch, spec.namespace, pod) as changed:  # before the read: no change slips by
            try:
                if current:
                    current = False  # nothing changed since ``view``: no read
                elif woke is not None and woke.delivered and woke.uid == uid_of(view.body):
                    view = fate_of(woke.pod)  # the watch's copy: no read
                elif resync:
                    view = fate_of(await in_background(read_pod(held.kube, spec.namespace, pod)))
                else:
                    view = fate_of(await read_pod(held.kube, spec.namespace, pod))
            except ApiException as exc:
                log.warning("reading Pod %s/%s failed: %s", spec.namespace, pod, exc.reason)
                woke = None
                await held.wait(None)
                continue
            if view.fate is PodFate.LIVE and cancel.is_set():
                await _stop_for_cancel(held, view)
                woke, resync = None, False  # read it again: being deleted, gone, or changed meanwhile
                continue
            if view.fate in (PodFate.LIVE, PodFate.LINGERING):
                # A lingering Pod may still run: the lease is kept, so nobody launches beside it.
                ctx.set_alive(True)
                covered = await _covered(held, view, label)
                shown, left_s = await pending(held, view, shown)
                deadline_s = await _deadline(held, view)
                past_deadline = past_deadline or deadline_s == 0
                if deadline_s:
                    left_s = deadline_s if left_s is None else min(left_s, deadline_s)
                watched = covered and pod_watch is not None and pod_watch.healthy
                # A cancel wakes us while the Pod lives (also one that came during the calls
                # above: the wait returns at once); once it is being deleted, its end does.
                wake = cancel if view.fate is PodFate.LIVE else None
                await held.wait(changed if covered else None, at_most_s=left_s, wake=wake)
                woke = changed if changed is not None and changed.is_set() else None
                resync = woke is None and watched and pod_watch is not None and pod_watch.healthy
                resync = resync and not cancel.is_set()  # a cancel's read is no background work
                continue
        # A Pod that ended being deleted, on a cancelled run, was stopped for the cancel (by
        # us, or by an attempt before us); one that ended on its own first keeps its outcome.
        ended = view.fate in (PodFate.SUCCEEDED, PodFate.FAILED)
        stopped = cancel.is_set() and (not ended or _being_deleted(view))
        if view.fate is PodFate.SUCCEEDED and not stopped:
            await held.end(RunState.SUCCEEDED, view.message, final=True)
            return None
        if stopped:
            if view.fate is PodFate.LOST:
                await delete_pod(held.kube, spec.namespace, pod, grace_seconds=0)
            await held.cancelled()
        if past_deadline:
            # Deleted for its deadline (by us, or by an attempt before us), and not succeeded first: it failed.
            view = PodView(pod, PodFate.FAILED, past_timeout(held), view.body)
        if view.fate is PodFate.FAILED:
            # A try that ran past its deadline is not retried: it would most likely hang again.
            deadline = past_deadline or _deadline_exceeded(view)
            if spec.retries.may_retry(try_number) and not deadline:
                return view
            message = view.message if try_number == 1 else f"failed after {try_number} tries: {view.message}"
            await held.fail(message, runstatus.DEADLINE_EXCEEDED if deadline else None)
        # Lost or gone: this attempt is over, the next one relaunches.
        ctx.set_alive(False)
        if view.fate is PodFate.LOST:
            await delete_pod(held.kube, spec.namespace, pod, grace_seconds=0)
        await held.end(RunState.INTERRUPTED, f"Pod {pod}: {view.message}", final=False)
        await held.events.about(
            spec,
            reason="PodLost",
            warning=True,
            message=f"run {name} attempt {ctx.attempt}: Pod {pod}: {view.message}; the next attempt relaunches it",
        )
        raise RunInterrupted(f"Pod {pod}: {view.message}")


def past_timeout(held: Held) -> str:
    """Why a run whose try's Pod ran past the job's timeout failed."""
    return f"the Pod ran past timeout ({format_duration(held.spec.timeout_ms or 0)}) and was stopped"


async def _stopped(held: Held, pod: str) -> None:
    """The attempt was stopped while it followed its Pod: handed over, replaced, or fenced."""
    ctx = held.ctx
    if ctx.stop_reason == SHUTDOWN:
        raise RunInterrupted(f"{ctx.instance} stopping: Pod {pod} left running for a backup to adopt")
    if ctx.stop_reason == REPLACED:
        ended = await end_replaced(held.kube, held.spec.namespace, held.name, [pod], REPLACED_BY_NEWER)
        raise RunInterrupted(f"replaced: Pod {pod} {ended or 'deleted'}")
    log.warning("%s attempt %d fenced (%s): leaving Pod %s alone", held.name, ctx.attempt, ctx.stop_reason, pod)
    raise held.fenced()


async def _stop_for_cancel(held: Held, view: PodView) -> None:
    """Delete the run's live Pod for a cancel, with the Pod's own grace period (its template's).

    Conditional on the version read: a Pod that changed meanwhile (it may have ended on its
    own) is not deleted but read again, so that a Pod that Succeeded first gives the run its
    outcome. A repeat (a backup after a runner that died) finds it being deleted already.
    """
    namespace = held.spec.namespace
    await held.confirm()
    version = str(((view.body or {}).get("metadata") or {}).get("resourceVersion") or "")
    if await delete_pod(held.kube, namespace, view.name, if_version=version or None):
        log.info("Pod %s/%s deleted for a cancel of its run", namespace, view.name)


async def _deadline(held: Held, view: PodView) -> float | None:
    """Seconds until the try's Pod reaches the job's timeout (None: no bound, or not started).

    At the deadline the Pod is deleted, with its own grace period, and 0 returned: the run
    then follows it until it has stopped (Succeeded if it did first, else Failed). The
    kubelet enforces the Pod's activeDeadlineSeconds too, but not every node does (one cut
    off from the API server runs it on), and a run written Failed beside a Pod that goes
    on is a lie.
    """
    spec = held.spec
    if spec.timeout_ms is None:
        return None
    ran_s = running_for_s(view.body, datetime.now(UTC))
    if ran_s is None:
        return None
    if (left_s := spec.timeout_ms / 1000 - ran_s) > 0:
        return left_s
    if view.fate is PodFate.LIVE:
        await held.confirm()
        await delete_pod(held.kube, spec.namespace, view.name)
        message = f"run {held.name}: Pod {view.name} ran past timeout ({format_duration(spec.timeout_ms)}): deleting it"
        await held.events.about(spec, reason=runstatus.DEADLINE_EXCEEDED, warning=True, message=message)
    return 0.0


async def _covered(held: Held, view: PodView, label: _Label) -> bool:
    """Whether our Pod watch delivers the Pod's changes; if it does not (an adopted Pod carries
    the launching replica's follower label), label the Pod as ours first.

    The label moves only while this attempt holds the run: a stale runner taking it back
    would leave the holder's watch blind. A failed relabel is tried again at the next look;
    until then the Pod is polled, so a failed call only makes the outcome seen later.

    Once ours, the label is never taken back: if it leaves us while this attempt holds the
    run, another replica follows the Pod as its holder too, which one shared store never
    allows (replicas on stores of their own each win every run: see :mod:`..job.sharing`). Taking
    it back each time would be a war of relabels.
    The Pod is polled instead; and once the store is known not to be shared, no label is
    moved at all.
    """
    watch, store_shared, namespace = held.wiring.pod_watch, held.wiring.store_shared, held.spec.namespace
    if watch is None or watch.follower is None:
        return True
    if watch.covers(view.body):
        label.ours = True
        return True
    if store_shared is not None and not store_shared():
        return False
    if label.ours:
        if not label.lost:
            label.lost = True
            log.warning(
                "Pod %s/%s is now followed by %s while attempt %d here holds its run: polling it"
                " (do the replicas share one store?)",
                namespace,
                view.name,
                follower_of(view.body),
                held.ctx.attempt,
            )
        return False
    await held.confirm()
    try:
        # The relabel is an event of our watch: it wakes the interest registered before the read.
        label.ours = await follow_pod(held.kube, namespace, view.name, watch.follower) is not None
    except Exception as exc:
        log.warning("labelling Pod %s/%s as followed here failed (%s): polling it", namespace, view.name, exc)
        return False
    return label.ours


def _being_deleted(view: PodView) -> bool:
    """The Pod was asked to go (it has a deletionTimestamp), whatever phase it ended in since."""
    return bool(((view.body or {}).get("metadata") or {}).get("deletionTimestamp"))


def _deadline_exceeded(view: PodView) -> bool:
    """The Pod ran past its activeDeadlineSeconds (the job's timeout), rather than exiting non-zero."""
    return str(((view.body or {}).get("status") or {}).get("reason") or "") == "DeadlineExceeded"
