"""Hooks through which the engine tells its user what happened, for logs, metrics and Events.

The engine never imports a metrics or Kubernetes library; the operator subclasses
:class:`EngineListener` to turn these calls into Prometheus samples and Kubernetes Events.
Every hook is synchronous and must not block: it runs on the engine's event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .model import Cause, ClaimOutcome, Run, RunState

log = logging.getLogger("anarchon.engine")


class EngineListener:
    """No-op defaults with logging; override what you need."""

    def claimed(self, job: str, slot: int, outcome: ClaimOutcome, delay_ms: int) -> None:
        """A claim was answered; ``delay_ms`` is from the slot's time to the store's answer."""
        log.debug("claim %s@%s: %s after %d ms", job, slot, outcome, delay_ms)

    def skipped(self, job: str, slot: int, reason: str, cause: Cause = Cause.SCHEDULE) -> None:
        """The slot (due for ``cause``) was not run: the overlap policy said Skip."""
        log.info("skipped %s@%s: %s", job, slot, reason)

    def skipped_elsewhere(self, job: str, slot: int, run: Run) -> None:
        """Another instance's claim recorded the slot Skipped (``run``); it reports it, not this one."""
        log.debug("%s@%s skipped by %s", job, slot, run.instance)

    def missed(self, job: str, slot: int, reason: str) -> None:
        log.warning("missed %s@%s: %s", job, slot, reason)

    def missed_slots(self, job: str, slots: Sequence[int], reason: str) -> None:
        """Several slots missed for one reason, oldest first (a stall, the catch-up policy): one report.

        After an hour-long stall a job on ``* * * * * *`` misses 3,600 slots; one report per
        slot would be 3,600 log lines, metric updates and Events at once, per job.
        """
        log.warning("missed %d slot(s) of %s, %s to %s: %s", len(slots), job, slots[0], slots[-1], reason)

    def replaced(self, job: str, slot: int, by_slot: int) -> None:
        """The run of ``slot`` ended, replaced by the newer run of ``by_slot`` (overlap Replace).

        Told once, by the instance whose claim replaced it. The replaced run's own runner hears
        of it as ``fenced`` when it next asks the store, if it is still alive to ask.
        """
        log.info("replaced %s@%s by the run of %s", job, slot, by_slot)

    def started(self, job: str, slot: int, attempt: int) -> None:
        log.info("running %s@%s attempt %d", job, slot, attempt)

    def took_over(self, job: str, slot: int, attempt: int, previous_instance: str | None) -> None:
        log.warning("took over %s@%s as attempt %d (from %s)", job, slot, attempt, previous_instance)

    def finished(self, job: str, slot: int, attempt: int, outcome: RunState, error: str | None) -> None:
        log.info("finished %s@%s attempt %d: %s%s", job, slot, attempt, outcome, f" ({error})" if error else "")

    def fenced(self, job: str, slot: int, attempt: int, reason: str) -> None:
        log.warning("fenced %s@%s attempt %d: %s", job, slot, attempt, reason)

    def heartbeat_failed(self, job: str, slot: int, error: str) -> None:
        log.warning("heartbeat of %s@%s failed: %s", job, slot, error)

    def store_error(self, operation: str, job: str, error: str) -> None:
        log.warning("store error during %s of %s: %s", operation, job, error)

    def gave_up(self, job: str, slot: int, attempt: int, reason: str) -> None:
        """The handler gave the run up (RunGivenUp): it ended Interrupted for good, as written."""
        log.error("gave up %s@%s at attempt %d: %s", job, slot, attempt, reason)

    def run_interrupted_final(self, run: Run) -> None:
        log.error("run %s@%s interrupted for good after %d attempts", run.job, run.slot, run.attempt)
