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
