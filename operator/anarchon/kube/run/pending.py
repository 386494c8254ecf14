"""The pending watchdog: a Pod that stays Pending says why on its run, and past the job's
``pendingTimeout`` it is deleted and the run fails (not retried: a new Pod would most likely
wait the same)."""

from __future__ import annotations

from datetime import UTC, datetime

from ...engine import RunFailed, RunState
from ...engine.durations import format_duration
from . import runstatus
from .held import Held
from .pods import PodFate, PodView, Waiting, delete_pod, pending_for_s, waiting_of


async def pending(held: Held, view: PodView, shown: str | None) -> tuple[str | None, float | None]:
    """Say why the attempt's Pod is Pending (run status and condition, an Event); end the run
    once it has been Pending for ``pendingTimeout``.

    Returns the reason the run now shows, and the seconds left until ``pendingTimeout``
    (None: no bound applies), so the caller looks again by then.
    """
    ctx, spec, name = held.ctx, held.spec, held.name
    waiting = waiting_of(view.body) if view.fate is PodFate.LIVE else None
    if waiting is not None and waiting.reason != shown:
        message = f"Pod {view.name} is Pending: {waiting.reason}: {waiting.message}"
        await held.write(
            lambda s: runstatus.pod_pending(s, attempt=ctx.attempt, reason=waiting.reason, message=message)
        )
        await held.events.about(spec, reason=runstatus.POD_PENDING, warning=True, message=f"run {name}: {message}")
        shown = waiting.reason
    elif waiting is None and shown is not None and view.fate is PodFate.LIVE:
        started = f"Pod {view.name}: {view.message}"
        await held.write(lambda s: runstatus.pod_started(s, attempt=ctx.attempt, message=started))
        shown = None
    bound_ms = spec.pending_timeout_ms
    pending_s = pending_for_s(view.body, datetime.now(UTC)) if view.fate is PodFate.LIVE else None
    if bound_ms is None or pending_s is None:
        return shown, None
    left_s = bound_ms / 1000 - pending_s
    if left_s > 0:
        return shown, left_s
    await _pending_timeout(held, view, waiting)
    return shown, 0.0  # the Pod changed before it could be deleted (it may have started): look again


async def _pending_timeout(held: Held, view: PodView, waiting: Waiting | None) -> None:
    """The Pod stayed Pending past ``pendingTimeout``: delete it and fail the run. Returns only
    if the Pod changed meanwhile."""
    spec = held.spec
    await held.confirm()
    version = str(((view.body or {}).get("metadata") or {}).get("resourceVersion") or "")
    if not await delete_pod(held.kube, spec.namespace, view.name, if_version=version or None):
        return
    bound = format_duration(spec.pending_timeout_ms or 0)
    why = f": {waiting.reason}: {waiting.message}" if waiting is not None else ""
    message = f"Pod {view.name} stayed Pending longer than pendingTimeout ({bound}){why}"
    await held.end(RunState.FAILED, message, final=True, reason=runstatus.PENDING_TIMEOUT)
    await held.events.about(spec, reason=runstatus.PENDING_TIMEOUT, warning=True, message=f"run {held.name}: {message}")
    raise RunFailed(message)
