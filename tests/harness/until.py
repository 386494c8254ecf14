"""The one way tests wait for something: :func:`until` (plain code) and :func:`until_async` (coroutines).

Both poll ``check()`` until it returns something truthy, which they return, and fail the test with
``what`` (and ``detail()``, if given) after ``timeout`` seconds. The pause between polls is
``interval``, or three times what the last poll took if that is longer: a kubectl poll (~0.1 s) then
runs about twice a second, so that polling never takes more than a quarter of the wait. The default
``interval`` is 0.1 s for plain code, whose checks mostly ask another process, and 0.01 s for
coroutines, whose checks mostly read the state of the test's own loop (a scheduler on a fast clock).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: How much longer than a poll the pause after it is, at least.
_PAUSE_PER_POLL = 3.0


def _timed_out(what: str, timeout: float, last: object, detail: Callable[[], str] | None) -> AssertionError:
    extra = f"\n{detail()}" if detail is not None else ""
    return AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r}){extra}")


def until(
    what: str,
    check: Callable[[], T],
    *,
    timeout: float = 60.0,
    interval: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``check()`` until it is truthy and return it; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        started = time.monotonic()
        last = check()
        if last:
            return last
        now = time.monotonic()
        if now > deadline:
            raise _timed_out(what, timeout, last, detail)
        time.sleep(max(interval, _PAUSE_PER_POLL * (now - started)))


async def until_async(
    what: str,
    check: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 60.0,  # noqa: ASYNC109 - the parameters of until()
    interval: float = 0.01,
    detail: Callable[[], str] | None = None,
) -> T:
    """:func:`until` for a coroutine; ``check`` may be a plain function or a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        started = loop.time()
        result = check()
        last: T = await result if inspect.isawaitable(result) else result  # type: ignore[assignment]
        if last:
            return last
        now = loop.time()
        if now > deadline:
            raise _timed_out(what, timeout, last, detail)
        await asyncio.sleep(max(interval, _PAUSE_PER_POLL * (now - started)))
