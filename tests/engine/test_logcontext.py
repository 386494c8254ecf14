"""Log records made while an attempt runs carry its job, slot, attempt and instance, in the
handler and in the tasks it starts, and only there; a real SQLite store."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from anarchon.engine import RunContext, Scheduler
from anarchon.engine.backends import from_url
from anarchon.engine.logcontext import RunFieldsFilter
from tests.harness.until import until_async

SLOT = 1_800_000_000_000
log = logging.getLogger("anarchon.test.workload")


async def test_records_of_an_attempt_carry_its_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(RunFieldsFilter())

    async def handler(ctx: RunContext) -> None:
        log.info("in the handler")

        async def child() -> None:
            log.info("in a task the handler started")

        await asyncio.create_task(child())

    async with Scheduler(from_url(f"sqlite://{tmp_path / 'store.db'}"), instance_id="replica-7") as sched:
        sched.every("report", "1h", handler, jitter=0)
        assert (await asyncio.wait_for(sched.trigger("report", SLOT), 10)).won
        await until_async(
            "the attempt's last line", lambda: any(r.getMessage().startswith("finished") for r in caplog.records)
        )
        log.info("after the attempt")

    def fields(message: str) -> tuple[object, ...]:
        record = next(r for r in caplog.records if r.getMessage().startswith(message))
        return tuple(getattr(record, f, None) for f in ("job", "slot", "attempt", "instance"))

    ours = ("report", SLOT, 1, "replica-7")
    assert fields("in the handler") == ours
    assert fields("in a task the handler started") == ours
    assert fields("finished report@") == ours  # the engine's own line
    assert fields("after the attempt") == (None, None, None, None)
