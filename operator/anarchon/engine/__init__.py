"""The slot-claim engine: schedules, claims, leases and backends, free of Kubernetes.

See ``seed-core-concepts`` in the README for the vocabulary (instance, job, slot, run,
attempt, claim, jitter, backend, lease, backup, token).
"""

from .backend import (
    Backend,
    Capabilities,
    ClaimRequest,
    ClaimStore,
    HistoryStore,
    LeaseBackend,
    LeaseStore,
    PresenceStore,
    SharedSpecStore,
    Store,
    TakeoverRequest,
)
from .clock import Clock, ScaledClock, SystemClock
from .durations import format_duration, parse_duration
from .errors import (
    AnarchonError,
    ConfigError,
    RunCancelled,
    RunFailed,
    RunGivenUp,
    RunInterrupted,
    RunSkipped,
    ScheduleError,
    StoreError,
    StoreLostState,
)
from .events import EngineListener
from .job import Handler, Job, JobOptions, RunContext
from .jobloop import JobLoop
from .model import (
    Attempt,
    CatchUp,
    Cause,
    ClaimOutcome,
    ClaimResult,
    CrossCluster,
    Overlap,
    Run,
    RunState,
    new_token,
    token_hash,
)
from .observed import StoreObserver, observed
from .schedule import Cron, Every, Schedule, cron, every, slots_between
from .scheduler import Scheduler, default_instance_id, job_options

__all__ = [
    "AnarchonError",
    "Attempt",
    "Backend",
    "Capabilities",
    "CatchUp",
    "Cause",
    "ClaimOutcome",
    "ClaimRequest",
    "ClaimResult",
    "ClaimStore",
    "Clock",
    "ConfigError",
    "Cron",
    "CrossCluster",
    "EngineListener",
    "Every",
    "Handler",
    "HistoryStore",
    "Job",
    "JobLoop",
    "JobOptions",
    "LeaseBackend",
    "LeaseStore",
    "Overlap",
    "PresenceStore",
    "Run",
    "RunCancelled",
    "RunContext",
    "RunFailed",
    "RunGivenUp",
    "RunInterrupted",
    "RunSkipped",
    "RunState",
    "ScaledClock",
    "Schedule",
    "ScheduleError",
    "Scheduler",
    "SharedSpecStore",
    "Store",
    "StoreError",
    "StoreLostState",
    "StoreObserver",
    "SystemClock",
    "TakeoverRequest",
    "cron",
    "default_instance_id",
    "every",
    "format_duration",
    "job_options",
    "new_token",
    "observed",
    "parse_duration",
    "slots_between",
    "token_hash",
]
