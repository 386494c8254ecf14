"""The retry policy: the caller hears each wait before it is waited, and a long-lived loop can start the waits over."""

from __future__ import annotations

import random

import pytest

from anarchon.engine import StoreError
from anarchon.engine.retry import Backoff, retry


class SteppedClock:
    """Time that moves only by the sleeps: what retry waits is exactly what it slept, however loaded the machine."""

    def __init__(self) -> None:
        self.t_ms = 0
        self.slept: list[int] = []

    def now_ms(self) -> int:
        return self.t_ms

    async def sleep(self, ms: int) -> None:
        self.slept.append(ms)
        self.t_ms += ms

    async def sleep_until(self, t_ms: int) -> None:
        await self.sleep(max(0, t_ms - self.t_ms))


async def test_each_error_is_told_with_the_wait_before_the_next_try_and_none_at_the_last() -> None:
    """What lets the operator's loops log "retrying in 0.5s" from the policy's own wait."""
    clock = SteppedClock()
    heard: list[tuple[str, int | None]] = []

    async def failing() -> None:
        raise StoreError("down")

    with pytest.raises(StoreError):
        await retry(
            failing,
            clock=clock,
            transient=lambda exc: isinstance(exc, StoreError),
            deadline_ms=lambda: 1_000,
            on_error=lambda exc, wait_ms: heard.append((str(exc), wait_ms)),
            delays=Backoff(first_ms=200, max_ms=800).delays(random.Random(7)),
        )
    *retried, (_, last) = heard
    assert last is None, heard  # the deadline would pass before another try: raised, not waited
    assert [wait for _, wait in retried] == clock.slept and len(clock.slept) >= 2, heard
    assert 100 <= clock.slept[0] <= 200 and 200 <= clock.slept[1] <= 400, heard
    assert {what for what, _ in heard} == {"down"}


def test_a_reset_starts_the_waits_over() -> None:
    """A watch that listed again after hours must not wait the longest wait at its next failure."""
    delays = Backoff(first_ms=500, max_ms=30_000).delays(random.Random(1))
    grown = [delays() for _ in range(8)]
    assert 15_000 <= grown[-1] <= 30_000, grown
    delays.reset()
    assert 250 <= delays() <= 500
    assert 500 <= delays() <= 1_000
