"""The Coalescer that sends heartbeats together (anarchon.engine.batch): what goes in which batch.

The store's side (one pipeline over one connection, every lease moved) is in
tests/faults/test_toxiproxy.py; here the batching itself, with a ``send`` that records.
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon.engine.batch import Coalescer


async def _settle() -> None:
    """Let every task that can run, run (a call's task, then its batch's)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Recording:
    """A ``send`` that holds each batch until released, and records it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, batch: list[int]) -> list[int | BaseException]:
        self.batches.append(batch)
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [x * 10 for x in batch]


async def test_a_call_goes_at_once_and_those_made_while_batches_are_out_go_together() -> None:
    send = Recording()
    calls = Coalescer(send, in_flight=2)
    first = [asyncio.create_task(calls(i)) for i in (1, 2)]
    await _settle()
    assert send.batches == [[1], [2]]  # nothing was out: each at once
    later = [asyncio.create_task(calls(i)) for i in range(3, 8)]
    await _settle()
    assert send.batches == [[1], [2]]  # two batches out: the rest waits for one of them
    send.release.set()
    assert await asyncio.gather(*first, *later) == [10, 20, 30, 40, 50, 60, 70]
    assert send.batches == [[1], [2], [3, 4, 5, 6, 7]]


async def one_out_two_waiting(calls: Coalescer[int, int]) -> tuple[asyncio.Task[int], ...]:
    """Call 1 out alone (the one slot taken), calls 2 and 3 waiting for the next batch."""
    out = asyncio.create_task(calls(1))
    await _settle()
    waiting = asyncio.create_task(calls(2)), asyncio.create_task(calls(3))
    await _settle()
    return out, *waiting


async def test_a_caller_cancelled_before_its_batch_went_out_is_left_out_of_it() -> None:
    send = Recording()
    calls = Coalescer(send, in_flight=1)
    out, gone, kept = await one_out_two_waiting(calls)
    gone.cancel()
    send.release.set()
    assert (await out, await kept) == (10, 30)
    assert send.batches == [[1], [3]]


async def test_a_batch_that_failed_fails_each_of_its_calls() -> None:
    send = Recording()
    send.fail = ConnectionError("down")
    calls = Coalescer(send, in_flight=1)
    tasks = [asyncio.create_task(calls(i)) for i in range(3)]
    send.release.set()
    for task in tasks:
        with pytest.raises(ConnectionError):
            await task
    assert send.batches == [[0], [1, 2]]


async def test_a_batch_whose_callers_all_gave_up_is_cancelled_and_frees_its_slot() -> None:
    """A stalled batch (no answer until the store's own timeout) whose callers gave up: it is
    cancelled (its connection goes with it) and the call waiting behind it goes out at once.
    Before, that call waited for the stalled batch's timeout, past a heartbeat."""
    send = Recording()
    calls = Coalescer(send, in_flight=1)
    stalled = asyncio.create_task(calls(1))
    await _settle()
    queued = asyncio.create_task(calls(2))
    await _settle()
    assert send.batches == [[1]], "the slot is taken: the second call waits"
    (batch,) = calls._out
    stalled.cancel()  # its caller waited as long as it could
    await _settle()
    assert batch.cancelled(), "nobody waits for the stalled batch any more"
    assert send.batches == [[1], [2]], "the waiting call went out at once"
    send.release.set()
    assert await queued == 20


async def test_a_batch_one_caller_still_waits_for_is_kept() -> None:
    send = Recording()
    calls = Coalescer(send, in_flight=1)
    first, gone, kept = await one_out_two_waiting(calls)
    first.cancel()
    await _settle()
    assert send.batches == [[1], [2, 3]]
    (batch,) = calls._out
    gone.cancel()
    await _settle()
    assert not batch.done(), "its other caller still waits for it"
    send.release.set()
    assert await kept == 30
