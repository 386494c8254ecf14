"""Manual runs: the ``anarchon.io/trigger`` annotation on an AnarchonJob asks for a run at the slot it names.

``anarchon trigger`` (or ``kubectl annotate``) sets it; every replica sees it and claims the
slot like a scheduled one, so exactly one runs it. The value handled is written back as
``anarchon.io/trigger-handled``, so the same trigger is never run twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..engine import Scheduler
from .client import Kube
from .constants import ANNOTATION_TRIGGER, ANNOTATION_TRIGGER_HANDLED
from .events import EventPoster
from .spec import JobSpec, run_name


def parse_trigger(value: str) -> int | None:
    """A trigger annotation names the manual slot: ms since epoch, or an RFC3339 time."""
    value = value.strip()
    if value.isdigit():
        return int(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


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
        if trigger and trigger != handled and self._seen.get(key) != trigger:
            self._seen[key] = trigger
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
            await self.events.about(
                spec,
                reason="BadTrigger",
                message=f"annotation {ANNOTATION_TRIGGER}={trigger!r} is not a time",
                warning=True,
            )
            await self.kube.annotate_job(spec.namespace, spec.name, {ANNOTATION_TRIGGER_HANDLED: trigger})
            return
        result = await self.scheduler.trigger(key, slot)
        # Won or taken, the store has decided this slot: every replica may mark it handled
        # (the same value each time; a patch that changes nothing changes nothing).
        await self.kube.annotate_job(spec.namespace, spec.name, {ANNOTATION_TRIGGER_HANDLED: trigger})
        if result.won:
            await self.events.about(
                spec,
                reason="Triggered",
                message=f"manual run {run_name(spec.name, slot)} claimed by {self.scheduler.instance_id}",
            )
