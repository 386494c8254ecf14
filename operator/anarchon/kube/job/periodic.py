"""A task that does one thing every little while (± 10 %, so that replicas spread out), until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable


class Periodic:
    """``tick()`` every ``every_s``, first after one period; ``tick`` deals with its own errors."""

    def __init__(self, name: str, every_s: float, tick: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.every_s = every_s
        self.tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s * random.uniform(0.9, 1.1))
            await self.tick()
