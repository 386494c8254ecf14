"""Store outages under a running scheduler: logged retries, no crash, nothing marked done that did not run.

Each test owns its server (the session's shared servers must not be killed under other tests).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from anarchon.engine import Cause, Job, RunContext, RunState, Scheduler, StoreError, every, job_options
from anarchon.engine.backends import from_url
from tests.harness.engine import Calls, Recorder, fast_clock
from tests.harness.until import until_async
from tests.servers.postgres import PostgresServer
from tests.servers.redis import RedisServer
from tests.servers.redis import start_or_fail as start_redis_or_fail


class Errors(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.store_errors: list[str] = []
        self.heartbeat_errors: list[str] = []

    def store_error(self, operation: str, job: str, error: str) -> None:
        self.store_errors.append(operation)

    def heartbeat_failed(self, job: str, slot: int, error: str) -> None:
        self.heartbeat_errors.append(error)


@pytest.fixture(params=["redis", "postgres"])
def private_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    server: Any = RedisServer() if request.param == "redis" else PostgresServer()
    try:
        server.start()
    except Exception as exc:  # a missing binary is a failure, never a skip
        pytest.fail(f"{request.param} server did not start: {exc}")
    yield server
    server.stop()


def _backend(server: Any) -> Any:
    """Short socket timeouts for Redis, so that a frozen server turns into errors quickly."""
    if isinstance(server, RedisServer):
        return from_url(server.url, socket_timeout_s=0.5)
    return from_url(server.url)


async def _outage(server: Any, seconds: float) -> None:
    """Redis is frozen (SIGSTOP: a store that hangs; the test server keeps no data on disk,
    so a restart would also be a data loss); PostgreSQL is killed and restarted (a crash)."""
    if isinstance(server, RedisServer):
        await asyncio.to_thread(server.pause)
        await asyncio.sleep(seconds)
        await asyncio.to_thread(server.resume)
    else:
        await asyncio.to_thread(server.kill)
        await asyncio.sleep(seconds)
        await asyncio.to_thread(server.restart)


async def test_scheduler_survives_a_store_outage(private_server: Any, job_name: str) -> None:
    clock = fast_clock(10.0)
    listener = Errors()
    calls = Calls(clock)
    sched = Scheduler(_backend(private_server), instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1s", calls.handler(), jitter=0, heartbeat="1s")
    await sched.start()
    try:
        await until_async("runs before the outage", lambda: len(calls.calls) >= 3)
        before = len(calls.calls)
        await _outage(private_server, 2.0)  # 20 fake seconds without a store
        await until_async("runs after the outage", lambda: len(calls.calls) >= before + 3, timeout=60)
        assert listener.store_errors, "the outage must be seen and logged"
        for task in sched.jobs[job_name]._main:
            assert not task.done(), "the job's loops must survive the outage"
        history = await sched.history(job_name, limit=500)
        ran = {c.slot for c in calls.calls}
        done = {r.slot for r in history if r.state is RunState.SUCCEEDED}
        assert done <= ran, f"marked successful without running: {sorted(done - ran)[:5]}"
    finally:
        await sched.stop()
        await sched.backend.close()


async def test_runner_that_loses_the_store_past_its_lease_stops(private_server: Any, job_name: str) -> None:
    """A runner that cannot heartbeat for longer than its lease must assume it was replaced."""
    clock = fast_clock(10.0)
    listener = Errors()
    calls = Calls(clock)

    async def long(ctx: RunContext) -> None:
        await clock.sleep(120_000)

    sched = Scheduler(_backend(private_server), instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(long), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await sched.trigger(job_name)
        await until_async("the run to start", lambda: len(calls.calls) == 1)
        await _outage(private_server, 1.5)  # 15 fake seconds: far past the 3 s lease
        await until_async("the runner to stop", lambda: calls.calls[0].stop_reason is not None, timeout=30)
        assert calls.calls[0].stop_reason == "lease lost"
        assert listener.heartbeat_errors
        # The run is not marked done: a backup (here, the same instance) takes the next attempt.
        await until_async("attempt 2", lambda: len(calls.calls) == 2, timeout=30)
        assert calls.calls[1].attempt == 2
    finally:
        await sched.stop(handover=False)
        await sched.backend.close()


async def test_ping_fails_while_the_store_is_down_and_answers_after(private_server: Any) -> None:
    """What the operator's readiness probe sees: an error during the outage, success after."""
    backend = _backend(private_server)
    await backend.setup()
    try:
        await backend.ping()
        if isinstance(private_server, RedisServer):
            await asyncio.to_thread(private_server.pause)
        else:
            await asyncio.to_thread(private_server.kill)
        try:
            with pytest.raises(StoreError):
                await asyncio.wait_for(backend.ping(), 30)
        finally:
            if isinstance(private_server, RedisServer):
                await asyncio.to_thread(private_server.resume)
            else:
                await asyncio.to_thread(private_server.restart)
        for _ in range(100):  # a restarted PostgreSQL takes a moment to accept connections
            try:
                await backend.ping()
                break
            except StoreError:
                await asyncio.sleep(0.2)
        await backend.ping()
    finally:
        await backend.close()


async def test_a_running_run_survives_a_redis_restart_that_lost_every_key(job_name: str) -> None:
    """Redis restarts empty (no persistence, or a failover to a fresh replica) while a run is running.

    The runner's next heartbeat finds no run: the store lost it, nobody took it over. Before,
    the runner took that for "fenced" and stopped, and with no record left no backup could
    take over either: the run was orphaned. Now it claims the run again with its own token
    and goes on; its end is recorded.
    """
    server = start_redis_or_fail()
    clock = fast_clock(10.0)
    listener = Errors()
    calls = Calls(clock)
    go_on = asyncio.Event()

    async def long(ctx: RunContext) -> None:
        await go_on.wait()

    sched = Scheduler(_backend(server), instance_id="solo", clock=clock, listener=listener)
    sched.every(job_name, "1h", calls.handler(long), jitter=0, heartbeat="1s", lease="3s")
    await sched.start()
    try:
        await sched.trigger(job_name, 1_800_000_000_000)
        await until_async("the run to start", lambda: len(calls.calls) == 1)
        await asyncio.to_thread(server.restart)  # same port, every key gone
        await asyncio.sleep(0.5)  # 5 fake seconds: heartbeats have found the run missing
        assert calls.calls[0].stop_reason is None, "the runner must not stop: nobody else holds its run"
        assert "reclaim" in listener.store_errors
        go_on.set()
        await until_async("the run to end", lambda: not sched.jobs[job_name].running_slots)
        run = await sched.backend.get_run(job_name, 1_800_000_000_000)  # type: ignore[attr-defined]
        assert run is not None and run.state is RunState.SUCCEEDED, run
        assert len(calls.calls) == 1
    finally:
        await sched.stop(handover=False)
        await sched.backend.close()
        server.stop()


async def test_after_redis_lost_its_state_skip_never_launches_beside_a_running_run(job_name: str) -> None:
    """Redis restarts empty while a Skip job's run is running, on two instances.

    The next slot's claim finds no active run: before, it won and a second run started beside
    the first (the runner claims its run back only at its next heartbeat, up to 5 s later
    here). Now the claim learns from the job's epoch that the store lost its state and waits
    a lease, so that the runner has claimed its run back first: the slot is Skipped.
    """
    server = start_redis_or_fail()
    clock = fast_clock(10.0)
    calls = Calls(clock)
    go_on = asyncio.Event()
    errors = Errors()

    async def long(ctx: RunContext) -> None:
        await go_on.wait()

    instances = [
        Scheduler(_backend(server), instance_id=f"i{n}", clock=clock, listener=errors if n == 0 else None)
        for n in range(2)
    ]
    for sched in instances:
        sched.every(job_name, "1s", calls.handler(long), jitter=0, overlap="Skip", heartbeat="5s", lease="15s")
        await sched.start()
    try:
        await until_async("the first run", lambda: len(calls.calls) == 1)
        await asyncio.sleep(0.3)  # 3 fake seconds: both instances claimed slots (and met the job's epoch)
        await asyncio.to_thread(server.restart)  # same port, every key gone
        await asyncio.sleep(2.5)  # 25 fake seconds: 25 slots, 5 heartbeats, a lease and more
        assert len(calls.calls) == 1, f"a second run beside the first: {[c.slot for c in calls.calls]}"
        assert "reclaim" in errors.store_errors or "claim" in errors.store_errors
    finally:
        go_on.set()
        for sched in instances:
            await sched.stop(handover=False)
            await sched.backend.close()
        server.stop()


async def test_catch_up_after_every_instance_was_down_counts_from_before_a_redis_restart(job_name: str) -> None:
    """Redis restarts empty while a catchUp: All job runs; then every instance is down for a while.

    The instance that met the loss (its claim learnt it from the job's epoch) tells the store
    again since when the schedule is in force: the instance started after the downtime catches
    up the slots missed during it. Before, the store took the schedule for new from that start
    on, and caught up nothing.
    """
    server = start_redis_or_fail()
    clock = fast_clock(10.0)
    calls = Calls(clock)
    options = {"jitter": 0, "overlap": "Allow", "catch_up": "All", "catch_up_window": "1h"}
    try:
        one = Scheduler(_backend(server), instance_id="one", clock=clock)
        one.every(job_name, "1s", calls.handler(), **options)
        await one.start()
        await until_async("runs before the restart", lambda: len(calls.calls) >= 3)
        await asyncio.to_thread(server.restart)  # same port, every key gone
        ran = len(calls.calls)
        await until_async("runs after the restart", lambda: len(calls.calls) >= ran + 3)
        await one.stop()
        await one.backend.close()
        down_from = clock.now_ms()
        await asyncio.sleep(1.0)  # 10 fake seconds with no instance up
        two = Scheduler(_backend(server), instance_id="two", clock=clock)
        two.every(job_name, "1s", calls.handler(), **options)
        await two.start()
        try:
            await until_async(
                "the slots missed while every instance was down, caught up",
                lambda: sum(1 for c in calls.calls if c.cause is Cause.CATCH_UP and c.slot > down_from) >= 8,
            )
        finally:
            await two.stop()
            await two.backend.close()
    finally:
        server.stop()


async def _backup_runs(backup: Scheduler, calls: Calls, job_name: str, slot: int, what: str) -> None:
    """The instance "backup" runs ``slot`` within 15 s, and the store says it holds the run."""
    await until_async(
        f"the backup to run {what}",
        lambda: any(c.slot == slot and c.instance == "backup" for c in calls.calls),
        timeout=15,
    )
    run = await backup.backend.get_run(job_name, slot)  # type: ignore[attr-defined]
    assert run is not None and run.instance == "backup", run


async def _stop_all(server: RedisServer, *schedulers: Scheduler) -> None:
    """Stop the instances as a SIGKILL would (no hand-over), then the test's own server."""
    for sched in schedulers:
        await sched.stop(handover=False)
        await sched.backend.close()
    server.stop()


async def test_a_run_claimed_by_an_instance_killed_before_it_left_a_record_runs_after_redis_lost_it(
    job_name: str,
) -> None:
    """Two faults at once: the winner of a slot dies before its run left any record but the
    store's claim, and Redis restarts empty. Nobody's lease covers the run, no record anywhere
    says it was due: before, the slot was lost (seen in the harsh chaos soak). Now the instance
    that saw the slot taken claims it again once the store has been back for a lease (the time
    a living runner has to claim its run back), and runs it; a resumable handler picks the run
    up from whatever its work left.
    """
    server = start_redis_or_fail()
    clock = fast_clock(10.0)
    calls = Calls(clock)
    backup_saw = Recorder()
    never = asyncio.Event()

    async def stuck(ctx: RunContext) -> None:
        await never.wait()  # dies (is cancelled) before doing anything

    options: dict[str, Any] = {"overlap": "Allow", "heartbeat": "1s", "lease": "30s", "resumable": True}
    killed = Scheduler(_backend(server), instance_id="killed", clock=clock)
    killed.every(job_name, "10s", calls.handler(stuck), jitter=0, **options)
    backup = Scheduler(_backend(server), instance_id="backup", clock=clock, listener=backup_saw)
    backup.every(job_name, "10s", calls.handler(), jitter="3s", **options)
    await killed.start()
    await backup.start()
    try:

        def taken_from_backup() -> list[int]:
            won = {c.slot for c in calls.calls if c.instance == "killed"}
            return [int(e[2]) for e in backup_saw.of("claimed") if e[3] == "taken" and int(e[2]) in won]

        await until_async("a slot the killed instance won over the backup", lambda: bool(taken_from_backup()))
        slot = taken_from_backup()[0]
        await killed.stop(handover=False)  # a SIGKILL: no hand-over, the claim stays with its lease
        await asyncio.to_thread(server.restart)  # same port, every key gone
        # A lease (3 s here) after the backup meets the loss, at its next claim.
        await _backup_runs(backup, calls, job_name, slot, f"slot {slot}, which the store forgot with its winner")
    finally:
        never.set()
        await _stop_all(server, killed, backup)


async def test_an_open_run_of_the_handlers_record_is_claimed_again_a_lease_after_the_loss_is_noticed(
    job_name: str,
) -> None:
    """The runner of a run dies and Redis restarts empty; the one instance left never saw the
    run (it started later, or the claim was long ago), so only the handler's durable record
    (the operator's open AnarchonRun) remembers it. Before, the engine left it to the
    handler's mending (a controller resync, and a lease, later: the harsh soak's slowest
    hand-overs, 60 s and more). Now the instance that notices the loss claims every open
    run of the record that no runner claimed back within a lease, and runs it.
    """
    server = start_redis_or_fail()
    clock = fast_clock(10.0)
    calls = Calls(clock)
    never = asyncio.Event()

    async def stuck(ctx: RunContext) -> None:
        await never.wait()  # dies (is cancelled) with its instance

    options = job_options(overlap="Allow", heartbeat="1s", lease="30s", resumable=True, jitter=0)
    slot = clock.now_ms() - 3_600_000  # a manual run of a slot the schedule never claims
    killed = Scheduler(_backend(server), instance_id="killed", clock=clock)
    killed.add(Job(job_name, every("10s"), calls.handler(stuck), options))
    backup = Scheduler(_backend(server), instance_id="backup", clock=clock)

    async def open_slots() -> list[int]:
        return [slot]

    backup.add(Job(job_name, every("10s"), calls.handler(), options, open_slots=open_slots))
    await killed.start()
    await backup.start()
    try:
        await killed.trigger(job_name, slot)
        await until_async("the run to start", lambda: any(c.slot == slot for c in calls.calls))
        # The backup's claims know the store's epoch, so they can tell it was lost.
        await until_async("a claim of the backup's", lambda: any(c.instance == "backup" for c in calls.calls))
        await killed.stop(handover=False)  # a SIGKILL: no hand-over, the claim stays with its lease
        await asyncio.to_thread(server.restart)  # same port, every key gone
        # The backup meets the loss at its next claim (10 s), then waits a lease (30 s) and a beat.
        await _backup_runs(backup, calls, job_name, slot, "the open run the store forgot")
    finally:
        never.set()
        await _stop_all(server, killed, backup)


async def test_a_runner_whose_lease_lapsed_in_an_outage_claims_its_run_back_from_a_store_that_lost_it(
    job_name: str,
) -> None:
    """Redis is down longer than a lease, then comes back empty, while a run runs.

    The runner could not heartbeat: it stopped as fenced ("lease lost"), as it must, since a
    backup could have taken the run over. But the store came back without the run: no lease
    to expire, nobody to take it over. Before, the run stayed unowned until something else
    remembered it (the operator's mending, a lease and a status refresh later at best; never,
    for the engine alone). Now the instance asks the store until it answers and, finding the
    run gone, claims it again at once.
    """
    server = start_redis_or_fail()
    clock = fast_clock(10.0)
    calls = Calls(clock)
    go_on = asyncio.Event()

    async def long(ctx: RunContext) -> None:
        await go_on.wait()

    sched = Scheduler(_backend(server), instance_id="solo", clock=clock)
    sched.every(job_name, "1h", calls.handler(long), jitter=0, heartbeat="1s", lease="3s", resumable=True)
    await sched.start()
    try:
        slot = 1_800_000_000_000
        await sched.trigger(job_name, slot)
        await until_async("the run to start", lambda: len(calls.calls) == 1)
        await asyncio.to_thread(server.kill)
        await until_async("the runner to stop, fenced", lambda: calls.calls[0].stop_reason is not None)
        assert calls.calls[0].stop_reason == "lease lost"
        await asyncio.to_thread(server.restart)  # same port, every key gone
        await until_async("the run claimed back and picked up", lambda: len(calls.calls) == 2, timeout=10)
        assert calls.calls[1].slot == slot and calls.calls[1].instance == "solo"
        go_on.set()
        await until_async("the run to end", lambda: not sched.jobs[job_name].running_slots)
        run = await sched.backend.get_run(job_name, slot)  # type: ignore[attr-defined]
        assert run is not None and run.state is RunState.SUCCEEDED, run
    finally:
        go_on.set()
        await sched.stop(handover=False)
        await sched.backend.close()
        server.stop()
