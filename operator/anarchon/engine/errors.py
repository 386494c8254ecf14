"""Exceptions of the engine, one per thing a caller may want to handle differently."""


class AnarchonError(Exception):
    """Base of every error raised on purpose by the engine."""


class ScheduleError(AnarchonError, ValueError):
    """A schedule, duration or time zone that cannot be understood.

    It subclasses ValueError so that input validation code can catch it generically.
    """


class ConfigError(AnarchonError, ValueError):
    """A job configuration the chosen backend cannot honour (e.g. backups on a claim-only store)."""


class StoreError(AnarchonError):
    """The store did not answer or answered with an error; the operation may be retried."""


class StoreLostState(StoreError):
    """The store has forgotten a job it held (a Redis restarted empty, or failed over to an empty replica).

    Raised by a claim, which is not applied. ``since_ms`` is when the store began again: the
    attempts still running claim their runs back at their next heartbeat, and a new claim
    should wait for that (a lease after ``since_ms``), or an overlap policy would not see them.
    """

    def __init__(self, message: str, since_ms: int) -> None:
        super().__init__(message)
        self.since_ms = since_ms


def is_store_error(exc: BaseException) -> bool:
    """The retry policy's test for store calls: every StoreError is worth another try."""
    return isinstance(exc, StoreError)


class RunInterrupted(AnarchonError):
    """Raised by a handler to say that its attempt was lost (e.g. its Pod vanished).

    The engine records the attempt as Interrupted and releases the lease at once, so the
    next attempt starts without waiting for the lease to run out.
    """


class RunFailed(AnarchonError):
    """Raised by a handler to fail the run with a message, without a traceback in the log."""


class RunGivenUp(AnarchonError):
    """Raised by a handler that counts its own attempts (``JobOptions.resumable``) when the run
    may not start its work again: the run ends Interrupted, for good, with this message."""


class RunSkipped(AnarchonError):
    """Raised by a handler that finds, after the claim, that the run must not start: an earlier
    run's work still lives where the store did not see it (overlap Skip). The run ends Skipped."""


class RunCancelled(AnarchonError):
    """Raised by a handler whose run someone asked to stop: it stopped the run's work and launches
    nothing more for it. The run ends Cancelled, for good, with this message (who asked, and why)."""
