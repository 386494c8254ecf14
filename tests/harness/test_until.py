"""until() and until_async(): the value, the failure's message, and what polling costs."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from tests.harness.until import until, until_async


def test_until_returns_the_first_truthy_value() -> None:
    answers = iter([0, [], "", [1]])
    assert until("a list", lambda: next(answers), interval=0.001) == [1]


def test_until_fails_with_what_it_waited_for_the_last_answer_and_the_detail() -> None:
    with pytest.raises(AssertionError) as failed:
        until("the moon", lambda: [], timeout=0.2, interval=0.01, detail=lambda: "log tail")
    assert str(failed.value) == "timed out after 0.2s waiting for the moon (last: [])\nlog tail"


def test_a_slow_check_is_polled_at_most_a_quarter_of_the_time() -> None:
    """A check of 50 ms with an interval of 1 ms: a pause of 150 ms after each, not 1 ms."""
    polls = []

    def slow() -> bool:
        polls.append(time.monotonic())
        time.sleep(0.05)
        return False

    with pytest.raises(AssertionError):
        until("never", slow, timeout=1.0, interval=0.001)
    assert 2 <= len(polls) <= 7, len(polls)  # ~1 s / 0.2 s, where back-to-back polls would be ~20
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    assert min(gaps) >= 0.19, gaps


async def test_until_async_takes_a_plain_check_or_a_coroutine_function() -> None:
    answers = iter([False, False, "done"])
    assert await until_async("a plain answer", lambda: next(answers)) == "done"

    calls = 0

    async def coroutine() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return calls if calls >= 3 else 0

    assert await until_async("the third call", coroutine) == 3


async def test_until_async_fails_like_until() -> None:
    with pytest.raises(AssertionError, match=r"^timed out after 0.1s waiting for the sun \(last: None\)$"):
        await until_async("the sun", lambda: None, timeout=0.1)
