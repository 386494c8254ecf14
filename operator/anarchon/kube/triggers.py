"""Manual runs: the ``anarchon.io/trigger`` annotation on an AnarchonJob asks for a run at the slot it names.

``anarchon trigger`` (or ``kubectl annotate``) sets it; every replica sees it and claims the
slot like a scheduled one, so exactly one runs it. The value handled is written back as
``anarchon.io/trigger-handled``, so the same trigger is never run twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..engine import ConfigError, Scheduler
from ..engine.limits import MAX_SLOT_MS, MIN_SLOT_MS
from .client import Kube
from .constants import ANNOTATION_TRIGGER, ANNOTATION_TRIGGER_HANDLED
from .events import EventPoster
from .spec import JobSpec, run_name

_DIGITS = re.compile(r"[0-9]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_trigger(value: str) -> int | None:
    """The slot a trigger annotation names: ms since the epoch, or an RFC3339 time; None if neither.

    Only ASCII digits count as a number (``"²"`` and other Unicode digits pass ``str.isdigit``),
    and only slots every store can hold (:data:`~anarchon.engine.limits.MAX_SLOT_MS`, the end
    of year 9999): anything else is refused here, with an Event, rather than failing in the
    store on every event (PostgreSQL: bigint out of range; SQLite: OverflowError).
    """
    value = value.strip()
    if _DIGITS.fullmatch(value):
        # A bound on the length first: int() of thousands of digits is slow, then refused.
        slot = int(value) if len(value) <= len(str(MAX_SLOT_MS)) else MAX_SLOT_MS + 1
    else:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=UTC)
            slot = (parsed - _EPOCH) // timedelta(milliseconds=1)
        except (ValueError, OverflowError):
            return None
    return slot if MIN_SLOT_MS <= slot <= MAX_SLOT_MS else None


class Triggers:
    """Handles the trigger annotations of the jobs this replica serves, each value once."""

    def __init__(self, kube: Kube, scheduler: Scheduler, events: EventPoster) -> None:
        self.kube = kube
        self.scheduler = scheduler
        self.events = events
        #: The trigger value this replica is handling or handled, by engine key: watch events
        #: that arrive before the handled annotation shows (our own status writes make some)
        #: must not handle it again.
        self._seen: dict[str, str] = {}

    async def apply(self, spec: JobSpec, key: str, annotations: Mapping[str, Any]) -> None:
        """Handle the job's trigger, if it has one that neither the object nor we have handled."""
        trigger = str(annotations.get(ANNOTATION_TRIGGER) or "")
        handled = str(annotations.get(ANNOTATION_TRIGGER_HANDLED) or "")
        if not trigger or self._seen.get(key) == trigger:
            return
        self._seen[key] = trigger
        if trigger == handled:
            # A peer claimed this manual run before we saw it; the backup sweep covers it
            # like any other run.
            return
        try:
            await self._manual(spec, key, trigger)
        except BaseException:
            self._seen.pop(key, None)  # not handled: the next event tries again
            raise

    def forget(self, key: str) -> None:
        """The job is gone."""
        self._seen.pop(key, None)

    async def _manual(self, spec: JobSpec, key: str, trigger: str) -> None:
        slot = parse_trigger(trigger)
        if slot is None:
            await self._refuse(spec, trigger, "is not a time between 1970 and 9999 (RFC3339, or ms since the epoch)")
            return
        try:
            result = await self.scheduler.trigger(key, slot)
        except ConfigError as exc:  # a slot the engine refuses is refused like a bad value: once
            await self._refuse(spec, trigger, f"was refused: {exc}")
            return
        # Won or taken, the store has decided this slot: every replica may mark it handled
        # (the same value each time; a patch that changes nothing changes nothing).
        await self.kube.annotate_job(spec.namespace, spec.name, {ANNOTATION_TRIGGER_HANDLED: trigger})
        if result.won:
            await self.events.about(
                spec,
                reason="Triggered",
                message=f"manual run {run_name(spec.name, slot)} claimed by {self.scheduler.instance_id}",
            )

    async def _refuse(self, spec: JobSpec, trigger: str, why: str) -> None:
        """A BadTrigger Event, and the value marked handled: later events of the job go on as usual."""
        shown = trigger if len(trigger) <= 60 else trigger[:57] + "..."
        await self.events.about(
            spec, reason="BadTrigger", message=f"annotation {ANNOTATION_TRIGGER}={shown!r} {why}", warning=True
        )
        await self.kube.annotate_job(spec.namespace, spec.name, {ANNOTATION_TRIGGER_HANDLED: trigger})
