"""Claims of many jobs due at the same moment go to the store together; so do heartbeats.

At an aligned slot (``* * * * *``, jitter 0) every job of an instance claims within the same
millisecond or two. Sent one by one, 1,000 claims are 1,000 round trips in flight at once:
a connection each from the store client's pool, or a queue behind it. The batcher holds
each claim for :data:`WINDOW_S` and sends what arrived in that window with one
:meth:`Backend.claim_many` (one pipeline on Redis, one transaction on SQLite), then answers
each caller with its own result. Each claim keeps its own guarantees (one winner, its
token); a batch that failed as a whole fails each of its claims, which each caller retries
as it would a claim of its own (and recognises by its token if the reply was lost).

Heartbeats are not aligned: :class:`Coalescer` sends a call at once when nothing of its kind
is out, and otherwise gathers what comes meanwhile into the next batch. At a few runs each
batch is one heartbeat; at thousands of runs per instance (each beating every few seconds)
a store's round trips stay a few, where one per heartbeat needed more connections than the
pool had and heartbeats failed, leases ran out and backups took over runs that were fine.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .backend import Backend, ClaimRequest
from .errors import StoreError
from .model import ClaimResult

#: How long a claim waits for others to join it: the spread of a slot's wake-ups on one
#: instance is about 2 ms (the clock's last stretch before a slot is spent yielding).
WINDOW_S = 0.002


class ClaimBatcher:
    """Gathers the claims of one instance into batches; one per store."""

    def __init__(self, backend: Backend, *, window_s: float = WINDOW_S) -> None:
        self.backend = backend
        self.window_s = window_s
        self._pending: list[tuple[ClaimRequest, asyncio.Future[ClaimResult]]] = []
        self._flush: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """The answer :meth:`Backend.claim` would give, sent with the claims made meanwhile."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[ClaimResult] = loop.create_future()
        self._pending.append((request, answer))
        if self._flush is None:
            self._flush = loop.call_later(self.window_s, self._send_pending)
        return await answer

    def _send_pending(self) -> None:
        batch, self._pending, self._flush = self._pending, [], None
        task = asyncio.create_task(self._send(batch), name=f"anarchon-claims:{len(batch)}")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[ClaimRequest, asyncio.Future[ClaimResult]]]) -> None:
        # A caller cancelled meanwhile no longer waits; its claim is still sent, as a call of
        # its own would have been once sent (the caller's retry recognises its token).
        try:
            answers = await self.backend.claim_many([request for request, _ in batch])
        except Exception as exc:
            answers = [exc] * len(batch)
        except BaseException:
            for _, future in batch:
                future.cancel()
            raise
        _answer(batch, answers, lambda: StoreError(f"{self.backend.capabilities.name}: no answer for this claim"))


#: A heartbeat as a store sends it in a batch: job, slot, token, now_ms and the lease's new end (ms).
Beat = tuple[str, int, str, int, int]

A = TypeVar("A")
R = TypeVar("R")


class Coalescer(Generic[A, R]):
    """Calls of one kind, sent at once while fewer than ``in_flight`` batches are out, and
    otherwise together in the next batch (of ``most`` calls at most).

    ``send`` answers a batch's calls in order, each with its result or its exception; an
    exception of ``send`` itself is each call's. A caller cancelled before its batch went out
    is left out of it (it would be sent for nobody). A batch out whose callers all gave up (a
    heartbeat that waited as long as it could) is cancelled and frees its slot at once, so
    that the calls made after it never wait behind it: a stalled batch would otherwise hold
    its slot (and its connection) until the store's own timeout, long past the heartbeat of
    the runs it carries. Its calls may then have been applied or not, as after a lost reply.
    """

    def __init__(
        self,
        send: Callable[[list[A]], Awaitable[Sequence[R | BaseException]]],
        *,
        in_flight: int = 2,
        most: int = 1000,
    ) -> None:
        self.send = send
        self.in_flight = in_flight
        self.most = most
        self._pending: list[tuple[A, asyncio.Future[R]]] = []
        #: Each batch out, with its callers' answers.
        self._out: dict[asyncio.Task[None], list[asyncio.Future[R]]] = {}

    async def __call__(self, arg: A) -> R:
        answer: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((arg, answer))
        self._send_pending()
        return await answer

    def _send_pending(self) -> None:
        if len(self._out) >= self.in_flight:
            return
        waiting = [(arg, answer) for arg, answer in self._pending if not answer.done()]
        batch, self._pending = waiting[: self.most], waiting[self.most :]
        if batch:
            task = asyncio.create_task(self._send(batch), name=f"anarchon-batch:{len(batch)}")
            answers = self._out[task] = [answer for _, answer in batch]
            gone = functools.partial(self._abandoned, task)
            for answer in answers:
                answer.add_done_callback(gone)

    def _abandoned(self, task: asyncio.Task[None], _: object) -> None:
        """A caller of ``task``'s batch got its answer or gave up: once all gave up, the batch goes."""
        answers = self._out.get(task)
        if answers is None or not all(answer.cancelled() for answer in answers):
            return
        del self._out[task]
        task.cancel()
        self._send_pending()

    async def _send(self, batch: list[tuple[A, asyncio.Future[R]]]) -> None:
        try:
            try:
                answers: Sequence[R | BaseException] = await self.send([arg for arg, _ in batch])
            except Exception as exc:
                answers = [exc] * len(batch)
            _answer(batch, answers, lambda: RuntimeError("no answer for this call in its batch"))
        finally:
            self._out.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            for _, answer in batch:  # cancelled: this batch's callers do not wait for ever
                if not answer.done():
                    answer.cancel()
            self._send_pending()


def _answer(
    batch: Sequence[tuple[object, asyncio.Future[R]]],
    answers: Sequence[R | BaseException],
    missing: Callable[[], BaseException],
) -> None:
    """Each caller still waiting gets its answer, in order; those a batch left unanswered
    (fewer answers than calls), ``missing()``."""
    for (_, future), result in zip(batch, answers, strict=False):
        if future.done():
            continue
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
    for _, future in batch:
        if not future.done():
            future.set_exception(missing())
