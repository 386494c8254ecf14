"""The slot-claim engine: schedules, claims, leases and backends, free of Kubernetes.

See ``seed-core-concepts`` in the README for the vocabulary (instance, job, slot, run,
attempt, claim, jitter, backend, lease, backup, token).
"""

from .backend import Backend, Capabilities, ClaimRequest, LeaseBackend, TakeoverRequest
from .clock import Clock, LoopClock, SystemClock
from .durations import format_duration, parse_duration
from .errors import (
    AnarchonError,
    ConfigError,
    RunFailed,
    RunInterrupted,
    ScheduleError,
    StoreError,
)
from .model import Attempt, CatchUp, ClaimOutcome, ClaimResult, Overlap, Run, RunState, new_token, token_hash
from .schedule import Cron, Every, Schedule, cron, every, slots_between

__all__ = [
    "AnarchonError",
    "Attempt",
    "Backend",
    "Capabilities",
    "CatchUp",
    "ClaimOutcome",
    "ClaimRequest",
    "ClaimResult",
    "Clock",
    "ConfigError",
    "Cron",
    "Every",
    "LeaseBackend",
    "LoopClock",
    "Overlap",
    "Run",
    "RunFailed",
    "RunInterrupted",
    "RunState",
    "Schedule",
    "ScheduleError",
    "StoreError",
    "SystemClock",
    "TakeoverRequest",
    "cron",
    "every",
    "format_duration",
    "new_token",
    "parse_duration",
    "slots_between",
    "token_hash",
]
