"""The records a store keeps: runs, their attempts, and the states of the run state machine.

A run is one slot of one job, named across the cluster by ``(job, slot)``. It moves through
the states of the seed's state machine::

    Due -> Claimed -> Running -> Succeeded | Failed
                      Running -> Interrupted -> Running (next attempt, a takeover)
    Due -> Skipped (an earlier run of the job still holds its lease)
    Claimed | Running -> Cancelled (someone asked for it to stop: the handler ends it so)

Due is never stored (it is the moment every instance computes on its own); the others are.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from enum import StrEnum


class RunState(StrEnum):
    """Where a run is in its life; only the first two are non-final."""

    CLAIMED = "Claimed"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INTERRUPTED = "Interrupted"
    SKIPPED = "Skipped"
    CANCELLED = "Cancelled"

    @property
    def active(self) -> bool:
        return self in (RunState.CLAIMED, RunState.RUNNING)

    @classmethod
    def _missing_(cls, value: object) -> RunState | None:
        # Records written by earlier versions say "Success"; the word is "Succeeded" everywhere now.
        return cls.SUCCEEDED if value == "Success" else None


#: How the error of a run ended by overlap Replace begins (the same text in every store).
REPLACED_BY = "replaced by the run of slot"
#: How the release of an attempt handed over on shutdown begins. A backup does not count
#: such an attempt against maxAttempts: a rolling update must never use up a run's tries.
HANDED_OVER = "handed over"


def gave_up(attempt: int, max_attempts: int, handed_over: int, why: str) -> str:
    """The error of a run given up after its last attempt (the stores' scripts write the same)."""
    counted = f" ({handed_over} handed over, not counted)" if handed_over else ""
    return f"gave up after attempt {attempt} of {max_attempts}{counted}: {why}"


class Overlap(StrEnum):
    """What to do when a slot is due while an earlier run of the same job is still active."""

    SKIP = "Skip"  # record the new slot as Skipped (the default: no overlapping runs)
    ALLOW = "Allow"  # run both
    REPLACE = "Replace"  # interrupt the older run, then run the new one


class CatchUp(StrEnum):
    """Which slots missed while no instance was up are run when one comes back."""

    NONE = "None"
    LATEST = "Latest"
    ALL = "All"


class CrossCluster(StrEnum):
    """Whether a run whose cluster was lost may be relaunched in another cluster (a job shared by clusters)."""

    RELAUNCH = "Relaunch"  # a backup of another cluster takes it over, a lease after its own cluster's turn
    NEVER = "Never"  # it is given up instead (Interrupted); the next slots run wherever they are won


class Cause(StrEnum):
    """Why a run exists: its slot came due, someone asked for it, or it was missed and caught up."""

    SCHEDULE = "Schedule"
    MANUAL = "Manual"
    CATCH_UP = "CatchUp"


def new_token() -> str:
    """A random, unguessable attempt token (128 bits)."""
    return secrets.token_hex(16)


def token_hash(token: str) -> str:
    """What history shows instead of a token: enough to tell attempts apart, useless to forge."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


@dataclass
class Attempt:
    """One try at a run, kept in the run's history."""

    attempt: int
    instance: str
    token_hash: str
    started_ms: int
    ended_ms: int | None = None
    outcome: RunState = RunState.RUNNING
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "attempt": self.attempt,
            "instance": self.instance,
            "token_hash": self.token_hash,
            "started_ms": self.started_ms,
            "ended_ms": self.ended_ms,
            "outcome": str(self.outcome),
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Attempt:
        ended = data.get("ended_ms")
        error = data.get("error")
        return cls(
            attempt=int(str(data["attempt"])),
            instance=str(data["instance"]),
            token_hash=str(data["token_hash"]),
            started_ms=int(str(data["started_ms"])),
            ended_ms=None if ended is None else int(str(ended)),
            outcome=RunState(str(data["outcome"])),
            error=None if error is None else str(error),
        )


@dataclass
class Run:
    """A run as the store has it.

    ``token`` is the current attempt's token. Backends return it only to code that asked
    for the run by itself (the engine), never in history listings meant for people.
    """

    job: str
    slot: int
    state: RunState
    attempt: int
    instance: str
    token: str
    lease_until_ms: int
    created_ms: int
    updated_ms: int
    error: str | None = None
    attempts: list[Attempt] = field(default_factory=list)

    def lease_expired(self, now_ms: int) -> bool:
        return self.state.active and self.lease_until_ms <= now_ms


class ClaimOutcome(StrEnum):
    """How a claim ended for the instance that sent it."""

    WON = "won"
    TAKEN = "taken"  # another instance holds this run
    SKIPPED = "skipped"  # overlap policy Skip: an earlier run is active; the slot is recorded Skipped


@dataclass
class ClaimResult:
    """The store's answer to a claim or a takeover."""

    outcome: ClaimOutcome
    run: Run | None = None
    replaced: list[Run] = field(default_factory=list)  # older runs interrupted by Overlap.REPLACE

    @property
    def won(self) -> bool:
        return self.outcome is ClaimOutcome.WON
