"""Retries after failed work: how many tries a run gets, and how long it waits between them.

A *try* is one go of the run's work (in the operator, one Pod). It is not an *attempt*: an
attempt is an instance's turn at the run, and a new one follows an interruption (a runner
lost, a Pod lost, a hand-over). A try that fails (the work said so: a non-zero exit) is
followed by another after a backoff, up to ``limit`` retries; an interruption is not a
failed try, and a try interrupted is taken up again by the next attempt, not counted twice.

Pure arithmetic here, so a replica that takes a run over computes the same waits as the one
that started it; where the try count lives between attempts is the handler's business (the
operator keeps it on the AnarchonRun and in its Pods' names).
"""

from __future__ import annotations

from dataclasses import dataclass

from .durations import format_duration
from .errors import ConfigError
from .limits import MAX_RETRIES, MAX_RETRY_BACKOFF_MS, MIN_RETRY_BACKOFF_MS

#: Defaults of a backoff, those of a Kubernetes Job: 10 s, doubled after each failed try, at most 6 min.
DEFAULT_BACKOFF_MS = 10_000
DEFAULT_MAX_BACKOFF_MS = 360_000


@dataclass(frozen=True)
class Retries:
    """Up to ``limit`` more tries after a failed one; the n-th retry waits ``backoff * 2**(n-1)``, capped."""

    limit: int = 0
    backoff_ms: int = DEFAULT_BACKOFF_MS
    max_backoff_ms: int = DEFAULT_MAX_BACKOFF_MS

    def __post_init__(self) -> None:
        if not 0 <= self.limit <= MAX_RETRIES:
            raise ConfigError(f"retries.limit must be between 0 and {MAX_RETRIES}, got {self.limit}")
        for what, ms in (("backoff", self.backoff_ms), ("maxBackoff", self.max_backoff_ms)):
            if not MIN_RETRY_BACKOFF_MS <= ms <= MAX_RETRY_BACKOFF_MS:
                raise ConfigError(
                    f"retries.{what} must be between {format_duration(MIN_RETRY_BACKOFF_MS)} and"
                    f" {format_duration(MAX_RETRY_BACKOFF_MS)}, got {ms} ms"
                )
        if self.max_backoff_ms < self.backoff_ms:
            raise ConfigError(
                f"retries.maxBackoff ({format_duration(self.max_backoff_ms)}) must not be shorter than"
                f" retries.backoff ({format_duration(self.backoff_ms)})"
            )

    @property
    def max_tries(self) -> int:
        """The first try and its retries."""
        return 1 + self.limit

    def may_retry(self, failed_try: int) -> bool:
        """Whether try number ``failed_try`` (1 for the first), having failed, is followed by another."""
        return failed_try < self.max_tries

    def backoff_after_ms(self, failed_try: int) -> int:
        """How long to wait after try ``failed_try`` failed before the next one starts."""
        if failed_try < 1:
            raise ValueError(f"tries count from 1, got {failed_try}")
        # Capped before it is computed: 2**n of a large n is a waste of a big integer.
        doublings = min(failed_try - 1, MAX_RETRY_BACKOFF_MS.bit_length())
        return min(self.backoff_ms << doublings, self.max_backoff_ms)


NO_RETRIES = Retries()
