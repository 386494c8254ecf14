"""The store data of jobs deleted while no replica watched: found by their notes of service.

A replica that sees a job deleted forgets its store data (:meth:`.JobController.remove`), and
so does one whose watch broke off meanwhile, at its next listing. But a job deleted while
every replica was down is never seen to go, and a replica cannot sweep the store for the jobs
it does not know: a store may be shared with releases that watch other namespaces, or other
clusters. So each replica notes, in one store call every NOTE_EVERY_MS, that the jobs it runs
are served; and every FORGET_EVERY_MS it forgets the jobs that no replica anywhere noted for
FORGET_AFTER_MS. A job whose replicas were all down that long also loses its records (its
catch-up then starts afresh, from when a replica takes it up again).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from ...engine import HistoryStore, Store
from ...engine.clock import Clock

log = logging.getLogger("anarchon.kube.job.served")

#: How often a replica notes the jobs it serves (one store call for all of them).
NOTE_EVERY_MS = 10 * 60_000
#: How often a replica forgets the jobs nobody noted; the first time this long after its first note.
FORGET_EVERY_MS = 60 * 60_000
#: How long a job may go unnoted before its store data is forgotten.
FORGET_AFTER_MS = 7 * 24 * 3_600_000


class ServedJobs:
    """Notes the jobs this replica serves, and forgets those nobody noted for a week."""

    def __init__(self, backend: Store, clock: Clock) -> None:
        self.backend = backend
        self.clock = clock
        self._noted_ms: int | None = None
        self._forgot_ms: int | None = None  # the first forget waits a period after the first note

    async def tick(self, jobs: Collection[str]) -> None:
        """At each periodic pass, with the engine keys of the jobs this replica serves."""
        if not isinstance(self.backend, HistoryStore):
            return  # a claim-only store keeps nothing per job to forget
        now = self.clock.now_ms()
        if self._noted_ms is None or now - self._noted_ms >= NOTE_EVERY_MS:
            await self.backend.note_served(sorted(jobs), now)
            self._noted_ms = now
            if self._forgot_ms is None:
                self._forgot_ms = now  # by the first forget every job listed at start is noted
        if self._forgot_ms is not None and now - self._forgot_ms >= FORGET_EVERY_MS:
            gone = await self.backend.forget_unserved(now - FORGET_AFTER_MS)
            self._forgot_ms = now
            if gone:
                log.info("forgot the store data of %d job(s) nobody served for a week: %s", len(gone), gone[:20])
