"""The engine's own bounds (anarchon.engine.limits): refused when a job is defined, with the why.

A library user has no CRD in front of the engine, so the engine checks every bound itself;
the operator's parser and the CRD repeat them per field (tests/kube).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from anarchon.engine import ConfigError, LeaseBackend, RunContext, Scheduler
from anarchon.engine.limits import MAX_SLOT_MS, MIN_SLOT_MS


async def _noop(ctx: RunContext) -> None:
    return None


@pytest.mark.parametrize(
    ("period", "options", "message"),
    [
        ("10ms", {}, "every must be at least 1s, got 10ms"),
        ("999ms", {}, "every must be at least 1s"),
        ("10s", {"heartbeat": "1ms", "lease": "2ms"}, "heartbeat must be at least 500ms, got 1ms"),
        ("10s", {"heartbeat": "5s", "lease": "5001ms"}, "must last at least 2 heartbeats (10s)"),
        ("10s", {"heartbeat": "1s", "lease": "1s999ms"}, "must last at least 2 heartbeats (2s)"),
        ("10s", {"timeout": "10ms"}, "timeout must be at least 1s, got 10ms"),
        ("10s", {"jitter": "1h1ms"}, "jitter must be between 0 and 1h, got 1h1ms"),
        ("10s", {"jitter_ms": -1}, "jitter must be between 0 and 1h, got -1 ms"),
        ("10s", {"max_attempts": 11}, "maxAttempts must be between 1 and 10"),
        ("10s", {"max_attempts": 0}, "maxAttempts must be between 1 and 10"),
        ("10s", {"catch_up_window_ms": -1}, "catch-up window must be at least 1s"),
        ("10s", {"catch_up_window_ms": 999}, "catch-up window must be at least 1s, got 999ms"),
    ],
)
async def test_out_of_bounds_options_are_refused(
    make_backend: Callable[[], LeaseBackend], job_name: str, period: str, options: dict[str, Any], message: str
) -> None:
    sched = Scheduler(make_backend(), instance_id="x")
    with pytest.raises(ConfigError) as info:
        sched.every(job_name, period, _noop, **options)
    assert message in str(info.value)
    assert job_name not in sched.jobs


async def test_the_bounds_themselves_are_accepted(make_backend: Callable[[], LeaseBackend], job_name: str) -> None:
    sched = Scheduler(make_backend(), instance_id="x")
    sched.every(job_name, "1s", _noop, heartbeat="500ms", lease="1s", timeout="1s", jitter="1h", max_attempts=10)
    sched.every(job_name + "-d", "1s", _noop, heartbeat="500ms")  # default lease: 3 heartbeats
    assert set(sched.jobs) == {job_name, job_name + "-d"}


@pytest.mark.parametrize("slot", [10**20, MAX_SLOT_MS + 1, 2**63, -1, MIN_SLOT_MS - 1_000])
async def test_a_slot_no_store_can_hold_is_refused_before_the_store(
    lease_backend: LeaseBackend, job_name: str, slot: int
) -> None:
    """On PostgreSQL 10**20 was 'bigint out of range', retried for ever; on SQLite an OverflowError."""
    sched = Scheduler(lease_backend, instance_id="x")
    sched.every(job_name, "1h", _noop, jitter=0)
    with pytest.raises(ConfigError, match=f"slot {slot} is out of range"):
        await asyncio.wait_for(sched.trigger(job_name, slot), 10)
    assert await lease_backend.history(job_name, 10) == []


async def test_the_last_slot_every_store_can_hold_is_claimed(lease_backend: LeaseBackend, job_name: str) -> None:
    ran = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        ran.set()

    sched = Scheduler(lease_backend, instance_id="x")
    sched.every(job_name, "1h", handler, jitter=0)
    result = await asyncio.wait_for(sched.trigger(job_name, MAX_SLOT_MS), 10)
    assert result.won
    await asyncio.wait_for(ran.wait(), 10)
    await sched.stop()
    assert [r.slot for r in await lease_backend.history(job_name, 10)] == [MAX_SLOT_MS]
