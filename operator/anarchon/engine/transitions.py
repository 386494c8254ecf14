"""The lease state machine as pure functions over :class:`Run` records.

Stores that run logic client-side inside a transaction (SQLite) call these directly;
stores that run it server-side (Redis Lua, PostgreSQL functions) implement the same rules,
and the conformance suite holds all of them to it. Each function returns the records to
write; the caller writes them in the same transaction it read them in.
"""

from __future__ import annotations

import dataclasses

from .backend import ClaimRequest, TakeoverRequest
from .model import (
    HANDED_OVER,
    REPLACED_BY,
    ClaimOutcome,
    ClaimResult,
    Overlap,
    Run,
    RunState,
    gave_up,
)


def _close_attempt(run: Run, now_ms: int, outcome: RunState, error: str | None) -> None:
    if run.attempts and run.attempts[-1].ended_ms is None:
        last = run.attempts[-1]
        last.ended_ms = now_ms
        last.outcome = outcome
        last.error = error


def claim(existing: Run | None, active: list[Run], req: ClaimRequest) -> tuple[ClaimResult, list[Run]]:
    """Decide a claim given the stored run (if any) and the job's active runs."""
    if existing is not None:
        return ClaimResult(ClaimOutcome.TAKEN, existing), []
    others = [r for r in active if r.slot != req.slot]
    if others and req.overlap is Overlap.SKIP:
        skipped = req.skipped(others[0].slot)
        return ClaimResult(ClaimOutcome.SKIPPED, skipped), [skipped]
    replaced: list[Run] = []
    if others and req.overlap is Overlap.REPLACE:
        for old in others:
            old = dataclasses.replace(old, attempts=list(old.attempts))
            reason = f"{REPLACED_BY} {req.slot}"
            _close_attempt(old, req.now_ms, RunState.INTERRUPTED, reason)
            old.state = RunState.INTERRUPTED
            old.error = reason
            old.lease_until_ms = 0
            old.updated_ms = req.now_ms
            replaced.append(old)
    run = req.claimed(lease=True)
    return ClaimResult(ClaimOutcome.WON, run, replaced), [run, *replaced]


def heartbeat(run: Run | None, token: str, now_ms: int, lease_ms: int) -> Run | None:
    """The run with its lease pushed forward, or None if the caller is fenced off."""
    if run is None or not run.state.active or run.token != token:
        return None
    return dataclasses.replace(
        run, state=RunState.RUNNING, lease_until_ms=max(run.lease_until_ms, now_ms + lease_ms), updated_ms=now_ms
    )


def finish(run: Run | None, token: str, now_ms: int, outcome: RunState, error: str | None) -> Run | None:
    """The run ended with ``outcome``, or None if the caller is fenced off."""
    if outcome.active:
        raise ValueError(f"finish: {outcome} is not an outcome")
    if run is None or not run.state.active or run.token != token:
        return None
    done = dataclasses.replace(run, attempts=list(run.attempts))
    _close_attempt(done, now_ms, outcome, error)
    done.state = outcome
    done.error = error
    done.lease_until_ms = 0
    done.updated_ms = now_ms
    return done


def release(run: Run | None, token: str, now_ms: int, reason: str) -> Run | None:
    """The current attempt ended as Interrupted, the lease expired now; None if fenced off.

    The token is cleared: a heartbeat of the released attempt that arrives late (sent before
    the release on another connection) must not push the lease forward again.
    """
    if run is None or not run.state.active or run.token != token:
        return None
    released = dataclasses.replace(run, attempts=list(run.attempts))
    _close_attempt(released, now_ms, RunState.INTERRUPTED, reason)
    released.lease_until_ms = now_ms
    released.token = ""
    released.error = reason
    released.updated_ms = now_ms
    return released


def takeover(run: Run | None, req: TakeoverRequest) -> tuple[ClaimResult, Run | None]:
    """Decide a takeover; returns the result and the record to write, if any."""
    if run is None or not run.lease_expired(req.now_ms):
        return ClaimResult(ClaimOutcome.TAKEN, run), None
    nxt = dataclasses.replace(run, attempts=list(run.attempts))
    _close_attempt(nxt, req.now_ms, RunState.INTERRUPTED, "lease expired")
    nxt.updated_ms = req.now_ms
    if run.attempt >= req.max_attempts:
        nxt.state = RunState.INTERRUPTED
        # Say why the last attempt ended (a released attempt left its reason), not just that it did.
        handed_over = sum(1 for a in run.attempts if (a.error or "").startswith(HANDED_OVER))
        nxt.error = gave_up(run.attempt, req.max_attempts, handed_over, run.error or "lease expired")
        nxt.lease_until_ms = 0
        return ClaimResult(ClaimOutcome.TAKEN, nxt), nxt
    nxt.attempt = run.attempt + 1
    nxt.state = RunState.CLAIMED
    nxt.instance = req.instance
    nxt.token = req.token
    nxt.lease_until_ms = req.now_ms + req.lease_ms
    nxt.error = None
    nxt.attempts.append(req.started(nxt.attempt))
    return ClaimResult(ClaimOutcome.WON, nxt), nxt
