"""Whether this replica shares its store with the replicas it sees at work: StoreNotShared if not.

Replicas on stores of their own (a SQLite file each, two Redis databases) each win every slot
in their own store. Pod names keep it to one Pod a slot, but they all follow it and all write
its run, while each looks healthy. Nothing in one store tells of the other, but Kubernetes shows
every replica at work: only a replica itself adds an attempt naming it to a run, or ends a run
Skipped in its name, each time right after its store let it claim the run (the run cache sees
those writes: :meth:`.RunCache.acted`). So every ``every_s`` each replica

* notes itself in its store (:meth:`PresenceStore.note_presence`), a record that lives TTL_PERIODS
  periods, so one that shares the store is never missing from it for a whole period;
* asks its store (:meth:`PresenceStore.present`) about the others it saw at work within
  WINDOW_PERIODS periods; one the store does not know is *absent* from that check on;
* suspects an absent replica once it was seen at work more than a period after it was first
  found absent (a replica sharing the store would have noted itself meanwhile, even after a
  Redis restart that lost every record), and calls it a stranger once it has been a suspect
  at every check for SUSPECT_PERIODS periods: a replica that shares the store but was frozen
  or starved longer than its record lives acts at once when it wakes (its writes were queued)
  and notes itself only at its next check, which its backlog may hold up for a while.

Not a stranger, then: a replica that has stopped (it is at work no more), one that shares the
store but lost its record (it notes itself again within a period), an older version during
an upgrade (only acts seen after this replica has watched for WINDOW_PERIODS count; by then
the rollout is over). A stranger stops being one when its store record appears (the stores
became one) or when it has not been seen at work for WINDOW_PERIODS, or for twice the longest
gap seen between two of its acts if that is longer (it is gone, or quiet: a replica whose jobs
run hourly is at work once an hour, and must not be a stranger for only minutes of each hour).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from ...engine import PresenceStore
from ...engine.errors import StoreError
from .periodic import Periodic

log = logging.getLogger("anarchon.kube.job.sharing")

#: How often a replica notes itself in its store and checks the others (``--store-check``).
CHECK_EVERY_S = 10.0
#: A presence record lives this many periods.
TTL_PERIODS = 3
#: How long a replica counts as at work after its last act, and how long this replica watches
#: before it calls anyone a stranger, in periods.
WINDOW_PERIODS = 20
#: How long a replica must be seen at work while absent from the store before it is called a
#: stranger, in periods: longer than a sharing replica's backlog after a freeze.
SUSPECT_PERIODS = 3

STORE_NOT_SHARED = "StoreNotShared"


class StoreSharing:
    """This replica's presence in its store, and the replicas at work that its store does not know."""

    def __init__(
        self,
        backend: PresenceStore,
        instance: str,
        acted: Callable[[], Mapping[str, float]],
        now_ms: Callable[[], int],
        *,
        every_s: float = CHECK_EVERY_S,
        on_change: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.instance = instance
        self.acted = acted  # replica -> when (monotonic) it was last seen at work
        self.now_ms = now_ms
        self.every_s = every_s
        self.window_s = every_s * WINDOW_PERIODS
        self.on_change = on_change
        self.monotonic = monotonic
        #: The replicas seen at work that this replica's store does not know.
        self.strangers: frozenset[str] = frozenset()
        self._since = monotonic()
        self._absent: dict[str, float] = {}  # replica -> the first check that found it absent
        self._suspect_since: dict[str, float] = {}  # replica -> the first check of its suspicion
        self._last_act: dict[str, float] = {}  # each replica's last act seen at a check
        self._gap: dict[str, float] = {}  # the longest time seen between two of its acts
        self._failing = False
        self._periodic = Periodic("anarchon-store-sharing", every_s, self._checked)

    def message(self) -> str | None:
        """What the StoreNotShared condition and Event say; None while no stranger is seen."""
        if not self.strangers:
            return None
        others = ", ".join(sorted(self.strangers))
        return (
            f"the replicas do not share one store: {others} start runs of the jobs here too, but the"
            f" {self.backend.capabilities.name} store of {self.instance} does not know them, so each wins"
            " every slot in a store of its own; give every replica the same store URL (a SQLite file serves"
            " one replica only)"
        )

    async def note(self) -> None:
        """Note this replica in its store (before it claims anything, then at every check)."""
        ttl_ms = round(self.every_s * TTL_PERIODS * 1000)
        await self.backend.note_presence(self.instance, self.now_ms(), ttl_ms)

    async def check(self) -> None:
        """One check: note ourselves, ask the store about the others at work, update the strangers."""
        await self.note()
        now = self.monotonic()
        acted = {i: t for i, t in self.acted().items() if i != self.instance}
        self._note_gaps(acted)
        recent = sorted(i for i, t in acted.items() if now - t <= max(self.window_s, 2 * self._gap.get(i, 0.0)))
        present = await self.backend.present(recent, self.now_ms()) if recent else set()
        for gone in [i for i in self._absent if i not in acted]:
            del self._absent[gone]  # forgotten by the run cache
        suspects = set()
        for i in recent:
            if i in present:
                self._absent.pop(i, None)
                continue
            since = self._absent.setdefault(i, now)
            if acted[i] > since + self.every_s and acted[i] > self._since + self.window_s:
                suspects.add(i)
        self._suspect_since = {i: self._suspect_since.get(i, now) for i in suspects}
        held = SUSPECT_PERIODS * self.every_s
        strangers = frozenset(i for i, since in self._suspect_since.items() if now - since >= held)
        if strangers != self.strangers:
            self.strangers = strangers
            if strangers:
                log.warning("StoreNotShared: %s", self.message())
            else:
                log.info("the replicas seen at work share this replica's store again (or are gone)")
            if self.on_change is not None:
                self.on_change()

    def _note_gaps(self, acted: Mapping[str, float]) -> None:
        """Keep, for each replica at work, the longest gap seen between two of its acts."""
        for i, t in acted.items():
            last = self._last_act.get(i)
            if last is not None and t > last:
                self._gap[i] = max(self._gap.get(i, 0.0), t - last)
            self._last_act[i] = t
        for gone in [i for i in self._last_act if i not in acted]:
            del self._last_act[gone]  # forgotten by the run cache
            self._gap.pop(gone, None)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def _checked(self) -> None:
        try:
            await self.check()
        except StoreError as exc:
            if not self._failing:
                log.warning("checking that the store is shared failed (tried again each %gs): %s", self.every_s, exc)
            self._failing = True
            return
        except Exception:
            log.exception("checking that the store is shared failed")
            return
        self._failing = False
