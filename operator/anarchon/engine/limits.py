"""The smallest and largest values the engine accepts, each with the reason it exists.

One place for them: the engine checks jobs against them (:func:`anarchon.engine.job.resolve_options`,
:class:`anarchon.engine.job.Job`), the operator's spec parser reports them per field, and the
CRD's rules repeat them at admission (a test keeps the three in agreement). A value past one of
them is not a preference but a mistake that costs something: store traffic, spurious
takeovers, or a slot no store can hold.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

#: Shortest ``every`` period. The finest cron grain (6 fields) is one second too; below it each
#: slot still costs a claim in the store (and, in the operator, an AnarchonRun and a Pod that
#: cannot even start that fast), so a shorter period only piles up store traffic and Skipped runs.
MIN_EVERY_MS: Final = 1_000

#: Shortest heartbeat. A heartbeat is one store write per running attempt: at 500 ms that is at
#: most two a second per run, where a shorter one is bound only by the store's round trip. It
#: also puts the shortest lease (:data:`MIN_LEASE_HEARTBEATS` of them) at
#: one second, longer than an ordinary event-loop stall or store hiccup.
MIN_HEARTBEAT_MS: Final = 500

#: The lease must last this many heartbeats. With less, one late heartbeat (a slow store write,
#: a busy event loop) lets the lease run out under a live runner, and a backup takes over a run
#: that was fine: a spurious takeover.
MIN_LEASE_HEARTBEATS: Final = 2

#: Shortest catch-up window. Slots are at least a second apart (``every`` and cron alike), so a
#: shorter window can never hold a missed slot: catch-up would be on and never run anything.
MIN_CATCH_UP_WINDOW_MS: Final = 1_000

#: Shortest attempt timeout. The operator turns it into the Pod's ``activeDeadlineSeconds``,
#: whole seconds; a shorter timeout would fail every attempt before its work could start.
MIN_TIMEOUT_MS: Final = 1_000

#: Shortest pendingTimeout (operator only). A Pod needs at least about a second to be scheduled
#: and have its containers started; a shorter bound would fail healthy runs as stuck.
MIN_PENDING_TIMEOUT_MS: Final = 1_000

#: Longest jitter. Jitter delays every run's start by up to its value to spread claims over the
#: instances; seconds do that. An hour or more only makes runs late (or never, past a starting
#: deadline), which is a typo rather than a policy.
MAX_JITTER_MS: Final = 3_600_000

#: How much longer than the jitter a starting deadline must be. A run waits up to the jitter
#: before its claim, and the claim itself takes a moment on a busy replica: a deadline within
#: that misses slots at random (``startingDeadline: 0s`` missed every one), which is a mistake
#: the operator can name rather than a run of ``Missed`` Events.
MIN_STARTING_DEADLINE_OVER_JITTER_MS: Final = 1_000

#: Attempts of one run. At least one; at most ten, because attempts beyond the first follow
#: interruptions (a lost runner or Pod), and a run interrupted ten times will not be saved by an
#: eleventh: it is better reported ``Interrupted``.
MIN_ATTEMPTS: Final = 1
MAX_ATTEMPTS: Final = 10

#: Attempts a run may have in all, counting takeovers, for a handler that resumes work still
#: running elsewhere (``JobOptions.resumable``: the operator adopts a live Pod) and counts its
#: own relaunches against ``maxAttempts``. Only a guard against runners failing in a loop: one
#: takeover needs a lease to run out, and a Pod outliving a thousand of them is not plausible.
MAX_TAKEOVERS: Final = 1_000

#: Runs kept per outcome (``successfulRunsHistoryLimit``, ``failedRunsHistoryLimit``). Each kept
#: run is an AnarchonRun and a Pod, every status refresh of the job reads all of them and every
#: replica holds them in memory: at a thousand that is megabytes per job. A longer record of what ran belongs in logs
#: or metrics, not in live objects (CronJob users who set 10,000 met the same wall in etcd).
MAX_HISTORY_LIMIT: Final = 1_000

#: Slots a run may have, in ms since 1970-01-01T00:00:00Z: from the epoch to the last
#: millisecond of year 9999. Every store holds them (PostgreSQL ``bigint``, SQLite ``INTEGER``,
#: Redis integers all stop at 2**63 - 1) and Python's ``datetime`` can show them; a slot outside
#: them (a manual trigger of ``99999999999999999999``) is refused up front instead of failing in
#: the store on every retry.
MIN_SLOT_MS: Final = 0
MAX_SLOT_MS: Final = (datetime.max.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)

#: Retries of a run whose work failed (``retries.limit``, the operator's ``backoffLimit``). Each
#: retry is a new Pod after a growing backoff; a workload that failed twenty times in a row will
#: not be saved by a twenty-first try, and the slot's next run is a better one.
MAX_RETRIES: Final = 20

#: Shortest backoff before a retry. Below a second a failing workload is relaunched as fast as
#: the API server takes it: a crash loop, each turn a Pod created, scheduled and torn down.
MIN_RETRY_BACKOFF_MS: Final = 1_000

#: Longest backoff (``retries.backoff`` and ``retries.maxBackoff``). A retry more than a day
#: after the failure is a later slot's job, not a retry of this one.
MAX_RETRY_BACKOFF_MS: Final = 86_400_000
