"""A job shared between clusters (``spec.sharedName``): each cluster's spec noted, SharedSpecMismatch if they differ.

The AnarchonJobs of one sharedName in several clusters are one job in the store (its key is the
shared name alone: :func:`.spec.engine_key`), claimed by the replicas of every cluster. So what
decides which slots exist and how a run is claimed and relaunched must be the same everywhere:
the fields of :func:`fingerprint` (crossCluster among them: whether a lost cluster's run is
relaunched is decided by the other clusters' backups). The rest may differ per cluster (the Pod template, say an
image from a regional registry; suspend, to take one cluster out; timeouts, retries, history
limits, jitter).

Each replica notes its cluster's fingerprint with the job in the store when it applies the job
and then every ``every_s`` (:class:`SharedSpecs`), and reads every cluster's note back
(:mod:`anarchon.engine.shared`). When the live notes differ, every replica of every cluster says
so (Ready=False, reason SharedSpecMismatch, and a Warning Event naming the fields and the
clusters); the claims follow the fingerprint held longest, and a cluster with another one
claims no new slot (its job loop is suspended) until its spec agrees. Nothing is ever merged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from ...engine import ConfigError, SharedSpecStore, Store
from ...engine.durations import format_duration
from ...engine.errors import StoreError
from ...engine.shared import SharedSide, agreed
from .periodic import Periodic
from .spec import JobSpec, schedule_column

log = logging.getLogger("anarchon.kube.job.shared")

SHARED_SPEC_MISMATCH = "SharedSpecMismatch"
#: A cluster's note lives this many checks: one whose replicas all stopped noting is gone after it.
TTL_PERIODS = 3


def fingerprint(spec: JobSpec) -> str:
    """What must agree between the clusters sharing ``spec``'s job, as readable ``field=value`` parts.

    Readable, so that a mismatch can say which field differs and how. The lease (given, or 3
    heartbeats) is in it: a backup in one cluster takes a run over from another after it.
    """
    opts = spec.options
    parts = {
        "schedule": schedule_column(spec.schedule),
        "overlap": str(opts.overlap),
        "catchUp": f"{opts.catch_up} within {format_duration(opts.catch_up_window_ms)}",
        "startingDeadline": "none" if opts.starting_deadline_ms is None else format_duration(opts.starting_deadline_ms),
        "maxAttempts": str(spec.max_attempts),
        "lease": format_duration(opts.effective_lease_ms),
        "crossCluster": str(opts.cross_cluster),
    }
    return "; ".join(f"{k}={v}" for k, v in parts.items())


def _parts(fp: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in fp.split("; ") if "=" in part)


@dataclass(frozen=True)
class Verdict:
    """What the clusters' notes say to this cluster about one shared job."""

    #: This cluster's spec is not the one the claims follow: it claims no new slot.
    waits: bool
    #: Why the clusters disagree (the Ready condition's and the Event's words); None while they agree.
    mismatch: str | None


def verdict(sides: Iterable[SharedSide], cluster: str, fp: str, shared_name: str) -> Verdict:
    """This cluster's verdict from every live cluster's note (its own among them)."""
    sides = sorted(sides, key=lambda s: s.cluster)
    follow = agreed(sides)
    waits = follow is not None and follow != fp
    if len({s.fingerprint for s in sides}) <= 1:
        return Verdict(waits, None)
    parts = {s.cluster: _parts(s.fingerprint) for s in sides}
    fields = dict.fromkeys(f for p in parts.values() for f in p)  # in the fingerprint's order
    diffs = [
        f"{f}: " + ", ".join(f"{c} {p.get(f, '?')!r}" for c, p in parts.items())
        for f in fields
        if len({p.get(f) for p in parts.values()}) > 1
    ]
    leaders = [s.cluster for s in sides if s.fingerprint == follow]
    waiting = [s.cluster for s in sides if s.fingerprint != follow]
    us = f"this cluster ({cluster}) starts" if waits else f"{', '.join(waiting)} start"
    return Verdict(
        waits,
        f"the clusters sharing {shared_name!r} disagree on its spec ({'; '.join(diffs)}): the runs follow"
        f" the spec of {', '.join(leaders)} (held the longest), and {us} no run until its spec agrees;"
        " make the spec the same in every cluster (docs/multicluster.md)",
    )


class SharedSpecs:
    """This replica's notes of its shared jobs' specs, and the verdicts they brought back."""

    def __init__(
        self,
        backend: Store,
        cluster: str | None,
        now_ms: Callable[[], int],
        *,
        every_s: float,
        specs: Callable[[], Iterable[JobSpec]] = lambda: (),
        on_change: Callable[[JobSpec, Verdict], Awaitable[None]] | None = None,
        each: Callable[[JobSpec], Awaitable[None]] | None = None,
    ) -> None:
        self.backend = backend
        self.cluster = cluster
        self.now_ms = now_ms
        self.every_s = every_s
        self.specs = specs
        self.on_change = on_change
        #: What else is done for each shared job at each check (show the other clusters' runs: :mod:`.elsewhere`).
        self.each = each
        self._verdicts: dict[str, Verdict] = {}
        self._periodic = Periodic("anarchon-shared-specs", every_s, self._checked)

    def check_usable(self) -> None:
        """ConfigError unless this replica can run a shared job: a cluster name and a lease store."""
        if not self.cluster:
            raise ConfigError(
                "spec.sharedName needs the operator's cluster name (--cluster-name, chart value clusterName),"
                " the same in every replica of this cluster and different in each cluster"
            )
        if not isinstance(self.backend, SharedSpecStore):
            raise ConfigError(
                f"spec.sharedName needs a lease store (Redis or PostgreSQL) reachable from every cluster;"
                f" {self.backend.capabilities.name} cannot keep the clusters' specs"
            )

    def verdict(self, key: str) -> Verdict | None:
        """The last verdict on a shared job (by store key); None if none yet."""
        return self._verdicts.get(key)

    def mismatch(self, key: str) -> str | None:
        """Why the clusters disagree on the job's spec, None while they agree (or it is not shared)."""
        v = self._verdicts.get(key)
        return None if v is None else v.mismatch

    async def note(self, spec: JobSpec) -> tuple[Verdict, bool]:
        """Note the cluster's spec of ``spec``'s job and read the others': the verdict, and whether it changed.

        A store error keeps the last verdict (the claims fail too meanwhile); with none yet,
        the cluster waits: it must not run a spec nobody compared.
        """
        assert self.cluster is not None and isinstance(self.backend, SharedSpecStore) and spec.shared_name
        fp = fingerprint(spec)
        old = self._verdicts.get(spec.key)
        try:
            sides = await self.backend.note_shared_spec(
                spec.key, self.cluster, fp, self.now_ms(), round(self.every_s * TTL_PERIODS * 1000)
            )
        except StoreError as exc:
            log.warning("%s: noting its spec for the other clusters failed: %s", spec.engine_name, exc)
            new = old or Verdict(waits=True, mismatch=None)
        else:
            new = verdict(sides, self.cluster, fp, spec.shared_name)
        self._verdicts[spec.key] = new
        return new, new != old

    async def drop(self, spec_key: str) -> None:
        """The job was deleted in this cluster: its note goes (the other clusters still run the job)."""
        self._verdicts.pop(spec_key, None)
        if self.cluster and isinstance(self.backend, SharedSpecStore):
            await self.backend.drop_shared_spec(spec_key, self.cluster)

    def forget(self, key: str) -> None:
        self._verdicts.pop(key, None)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def check(self) -> None:
        """One pass: note every shared job again; a changed verdict goes to ``on_change``, then ``each``."""
        for spec in list(self.specs()):
            if not spec.shared_name:
                continue
            new, changed = await self.note(spec)
            if changed and self.on_change is not None:
                await self.on_change(spec, new)
            if self.each is not None:
                await self.each(spec)

    async def _checked(self) -> None:
        try:
            await self.check()
        except Exception as exc:
            log.warning("noting the shared jobs' specs, or showing the other clusters' runs, failed: %s", exc)
