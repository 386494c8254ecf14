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


#: The jitter's one generator: a ``random.Random()`` per call cost 2.5 KB and a read of
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

    def delays(self, rng: random.Random | None = None) -> Callable[[], int]:
        rng = rng or _JITTER
        current = float(self.first_ms)

        def next_delay() -> int:
            nonlocal current
            delay = current / 2 + rng.uniform(0, current / 2)
            current = min(current * self.factor, float(self.max_ms))
            return max(1, round(delay))

        return next_delay


async def retry(
    op: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    transient: Callable[[BaseException], bool],
    deadline_ms: Callable[[], int | None] = lambda: None,
    on_error: Callable[[BaseException], None] | None = None,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
) -> T:
    """Await ``op()`` until it succeeds; retry transient errors until ``deadline_ms()`` (clock time).

    A non-transient error is raised at once. A transient one is reported to ``on_error``
    and retried after a backoff, unless the deadline (read anew each time: a lease moves)
    would pass before the next try; then the last error is raised. ``None`` means no
    deadline: the caller bounds the wait otherwise (cancellation, a stop request).
    """
    next_delay = backoff.delays(rng)
    while True:
        try:
            return await op()
        except Exception as exc:
            if not transient(exc):
                raise
            if on_error is not None:
                on_error(exc)
            delay = next_delay()
            deadline = deadline_ms()
            if deadline is not None and clock.now_ms() + delay > deadline:
                raise
            await clock.sleep(delay)
