"""The one retry policy of the code base: transient errors are retried with backoff, within a bound.

Every call that leaves the process (a store round trip, an API request) can fail, time
out, or succeed with its reply lost. The callers decide what "transient" means for their
errors (a :class:`~.errors.StoreError`, an HTTP 503) and what to do once the bound is
reached; this module only decides *when* to try again, and it does so on the engine's
:class:`~.clock.Clock`, so a fast-forwarded test clock fast-forwards the backoff too.

Retrying is only half of the rule. The other half belongs to the caller: an operation
whose reply may have been lost must be safe to send again (an idempotent write, or one
that recognises its own token) or be followed by a read of what really happened.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .clock import Clock

T = TypeVar("T")


#: The jitter's one generator: a ``random.Random()`` per call costs its state and a read of
#: os.urandom, for every store call of every job.
_JITTER = random.Random()


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``first_ms``, doubling, never above ``max_ms``.

    Jitter ("equal jitter": half fixed, half random) keeps replicas that failed together
    from retrying together.
    """

    first_ms: int = 50
    max_ms: int = 2_000
    factor: float = 2.0

    def delays(self, rng: random.Random | None = None) -> Delays:
        return Delays(self, rng or _JITTER)


class Delays:
    """The waits of one retrying, each longer than the last; :meth:`reset` starts them over.

    A loop that runs for long between failures (a watch) resets them once it got somewhere,
    so that a failure hours after the last one is retried soon, not after the longest wait.
    """

    def __init__(self, backoff: Backoff, rng: random.Random) -> None:
        self._backoff = backoff
        self._rng = rng
        self._current = float(backoff.first_ms)

    def __call__(self) -> int:
        """The next wait in ms."""
        current = self._current
        self._current = min(current * self._backoff.factor, float(self._backoff.max_ms))
        return max(1, round(current / 2 + self._rng.uniform(0, current / 2)))

    def reset(self) -> None:
        self._current = float(self._backoff.first_ms)


async def retry(
    op: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    transient: Callable[[BaseException], bool],
    deadline_ms: Callable[[], int | None] = lambda: None,
    on_error: Callable[[BaseException, int | None], None] | None = None,
    delays: Delays | None = None,
) -> T:
    """Await ``op()`` until it succeeds; retry transient errors until ``deadline_ms()`` (clock time).

    A non-transient error is raised at once. A transient one is reported to ``on_error``,
    with the wait in ms before the next try, and retried after that wait, unless the deadline
    (read anew each time: a lease moves) would pass before it; then ``on_error`` is told
    None and the error is raised. ``None`` means no deadline: the caller bounds the wait
    otherwise (cancellation, a stop request). ``delays`` default to :class:`Backoff`'s.
    """
    next_delay = Backoff().delays() if delays is None else delays
    while True:
        try:
            return await op()
        except Exception as exc:
            if not transient(exc):
                raise
            delay = next_delay()
            deadline = deadline_ms()
            last = deadline is not None and clock.now_ms() + delay > deadline
            if on_error is not None:
                on_error(exc, None if last else delay)
            if last:
                raise
            await clock.sleep(delay)
