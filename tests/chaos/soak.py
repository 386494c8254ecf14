"""The chaos soak: three replicas run a mix of jobs while the API server, the store and the replicas fail.

Everything is real: the replicas are OS processes talking to the test API server through
the HTTP fault proxy (tests/faults/apiproxy.py) and to a private store (PostgreSQL, or Redis)
through toxiproxy (tests/faults/toxiproxy.py); KWOK runs the Pods. Faults, at random from a
seeded generator:

* API: 500/503/429 answers, creates whose reply is lost, slow replies, cut watches;
* store: frozen (SIGSTOP), crashed and restarted (SIGKILL, then start), and through
  toxiproxy: unreachable, connections reset, replies lost after the server acted, slow;
  Redis without persistence restarted empty;
* replicas: SIGTERM (a rolling update), SIGKILL, SIGSTOP past the lease, short stalls, and
  one outage of every replica.

How hard, and with which jobs, is a :class:`Profile`: :data:`GENTLE` (lease 8 s, Pods of at
most 5 s, no store state lost) or :data:`HARSH` (issue 25: lease 3 s, Pods outliving several
takeovers, stalls past the lease, Redis losing its data, a timeout KWOK does not enforce).

The referee (checker.py) watches the API server directly. :func:`soak` returns a
:class:`Report`; the test asserts its violation counts are all zero and prints it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from anarchon.kube.api.client import Kube, connect, path
from anarchon.kube.constants import RUNS
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.faults.toxiproxy import StoreProxy
from tests.harness.cluster import Cluster, Replicas, job_manifest
from tests.servers.postgres import PostgresServer
from tests.servers.redis import RedisServer

from .checker import Checker


@dataclass(frozen=True)
class Plan:
    """One job of the mix: its period, overlap policy, what its Pods do (KWOK annotations) and
    any further spec fields (``timeout``, ``catchUp``...)."""

    name: str
    every_s: int
    overlap: str
    pod: dict[str, str]
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def catches_up(self) -> bool:
        return str((self.spec.get("catchUp") or {}).get("policy", "None")) != "None"


@dataclass(frozen=True)
class StoreFault:
    """One kind of store fault: ``action`` for a time drawn from ``seconds``, drawn with ``weight``.

    Actions: ``freeze`` (SIGSTOP of the server: connections open, nothing answers), ``crash``
    (SIGKILL, down for the time, started again: on its data, or empty for Redis without
    persistence), and toxiproxy's ``down`` (every connection closed, new ones refused),
    ``reset`` (every request answered by a TCP reset), ``lose`` (the server acts, the reply
    never comes), ``slow`` (every reply 300 ± 100 ms late).
    """

    label: str
    action: str
    seconds: tuple[float, float]
    weight: int
    tcp: bool = False
    #: Only on a store that keeps its data across a restart (a crash of Redis without
    #: persistence is a wipe, which the profile times on its own).
    keeps_data_only: bool = False


@dataclass(frozen=True)
class Profile:
    """How hard the soak is: the jobs' timing and mix, and every fault's kind, length and rate."""

    name: str
    heartbeat_s: float
    #: Long beside the heartbeat in the gentle profile, so that a hand-over and a takeover at
    #: lease expiry cannot be told apart by chance.
    lease_s: float
    mix: tuple[Plan, ...]
    #: The size when ANARCHON_SOAK_SLOTS is not set.
    default_slots: int
    #: The stores the test runs this profile on when ANARCHON_SOAK_STORE is not set.
    stores: tuple[str, ...]
    #: A replica fault every 0.5-1.5 times this; its kind drawn from ``replica_faults``.
    kill_every_s: float
    replica_faults: tuple[str, ...]
    #: How long a SIGSTOPped replica stays frozen (drawn from the range).
    sigstop_s: tuple[float, float]
    #: A store fault every 0.5-1.5 times this.
    store_every_s: float
    store_faults: tuple[StoreFault, ...]
    #: Redis with the chart's append-only file (a restart keeps the data), or without persistence.
    redis_persistent: bool
    #: Redis without persistence restarted (so emptied) every 0.8-1.2 times this; None: never.
    redis_wipe_every_s: float | None
    #: One outage of every replica (SIGKILL of all, started again after this long); None: none.
    outage_s: float | None
    #: When the outage begins, as a share of the soak's expected length.
    outage_at: float
    #: How long settling (every run final, no Pod live) may take after the faults stop.
    settle_s: float

    @property
    def handover_bound_s(self) -> float:
        """The issue's bound: a backup that knows of a run looks at it every half to one heartbeat;
        then it claims and writes the run's status through the fault proxy, and the referee sees
        that through its own watch: 2 s for all of that."""
        return self.heartbeat_s + 2

    @property
    def takeover_bound_s(self) -> float:
        return self.lease_s + 2 * self.heartbeat_s + 2

    def slots_per_s(self) -> float:
        return sum(1 / p.every_s for p in self.mix)


#: A hand-over needs the store: one that is frozen or down around a SIGTERM turns it into a
#: takeover at lease expiry, which the soak then does not judge as a hand-over (nor a SIGKILL
#: whose takeover a store fault or the outage delays).
STORE_FAULT_MARGIN_S = 3.0

_TCP_GENTLE = (
    StoreFault("unreachable 2s", "down", (2, 2), 1, tcp=True),
    StoreFault("connections reset", "reset", (0.5, 0.5), 1, tcp=True),
    StoreFault("replies lost", "lose", (0.5, 0.5), 1, tcp=True),
    StoreFault("slow 5s", "slow", (5, 5), 1, tcp=True),
)

#: Today's soak, unchanged: a lease of 8 s, Pods of at most 5 s, no store state lost.
GENTLE = Profile(
    name="gentle",
    heartbeat_s=1.0,
    lease_s=8.0,
    mix=(
        Plan("allow-short", 1, "Allow", {"anarchon.test/run-seconds": "1"}),
        Plan("skip-short", 1, "Skip", {"anarchon.test/run-seconds": "0.3"}),
        Plan("skip-long", 1, "Skip", {"anarchon.test/run-seconds": "4"}),
        Plan("skip-failing", 1, "Skip", {"anarchon.test/run-seconds": "0.3", "anarchon.test/exit-code": "3"}),
        Plan("replace-long", 2, "Replace", {"anarchon.test/run-seconds": "3"}),
        Plan("allow-long", 2, "Allow", {"anarchon.test/run-seconds": "5"}),
    ),
    default_slots=3000,
    stores=("postgres",),
    kill_every_s=15.0,
    replica_faults=("SIGTERM", "SIGKILL", "SIGSTOP", "stall"),
    sigstop_s=(10.0, 10.0),  # the lease + 2 s
    store_every_s=20.0,
    store_faults=(
        StoreFault("frozen 2s", "freeze", (2, 2), 2),
        StoreFault("crashed and restarted", "crash", (1, 1), 2),
        *_TCP_GENTLE,
    ),
    redis_persistent=True,
    redis_wipe_every_s=None,
    outage_s=None,
    outage_at=0.0,
    settle_s=120.0,
)


def _run_s(seconds: float, **more: str) -> dict[str, str]:
    return {"anarchon.test/run-seconds": f"{seconds:g}", **more}


_MAX3 = {"maxAttempts": 3}

#: Issue 25's mix: lease 3 x a 1 s heartbeat, maxAttempts 3, Pods of 5-20 leases (15-60 s) that
#: outlive several takeovers, failing Pods, Skip/Allow/Replace, a timeout shorter than its Pods
#: on a node that ignores activeDeadlineSeconds (KWOK), a catch-up job; a replica killed, frozen
#: past the lease or terminated every ~15 s, store stalls longer than the lease, Redis restarted
#: without its data every ~60 s, one 20 s outage of every replica.
HARSH = Profile(
    name="harsh",
    heartbeat_s=1.0,
    lease_s=3.0,
    mix=(
        Plan("skip-short", 5, "Skip", _run_s(2), _MAX3),
        Plan("skip-15s", 5, "Skip", _run_s(15), _MAX3),
        Plan("skip-30s", 5, "Skip", _run_s(30), _MAX3),
        Plan("skip-60s", 10, "Skip", _run_s(60), _MAX3),
        Plan("skip-failing-20s", 5, "Skip", _run_s(20, **{"anarchon.test/exit-code": "3"}), _MAX3),
        Plan("allow-20s", 5, "Allow", _run_s(20), _MAX3),
        Plan("allow-45s", 10, "Allow", _run_s(45), _MAX3),
        Plan("allow-failing-30s", 10, "Allow", _run_s(30, **{"anarchon.test/exit-code": "3"}), _MAX3),
        Plan("replace-15s", 20, "Replace", _run_s(15), _MAX3),
        Plan("replace-40s", 15, "Replace", _run_s(40), _MAX3),
        # KWOK ignores activeDeadlineSeconds: only the operator can end these Pods at 6 s.
        Plan("timeout-6s", 10, "Skip", _run_s(20), {**_MAX3, "timeout": "6s"}),
        Plan("catchup-all", 5, "Skip", _run_s(3), {**_MAX3, "catchUp": {"policy": "All", "window": "1h"}}),
    ),
    default_slots=280,  # ~2.7 minutes of slots (1.7 a second): CI runs it twice, under its 45 minutes
    stores=("redis", "postgres"),
    kill_every_s=15.0,
    replica_faults=("SIGTERM", "SIGKILL", "SIGSTOP"),
    sigstop_s=(4.0, 8.0),  # always past the 3 s lease
    store_every_s=20.0,
    store_faults=(
        StoreFault("frozen 4-7s", "freeze", (4, 7), 3),
        StoreFault("crashed and restarted", "crash", (1, 1), 1, keeps_data_only=True),
        StoreFault("unreachable 4-7s", "down", (4, 7), 1, tcp=True),
        StoreFault("connections reset", "reset", (0.5, 0.5), 1, tcp=True),
        StoreFault("replies lost", "lose", (0.5, 0.5), 1, tcp=True),
        StoreFault("slow 5s", "slow", (5, 5), 1, tcp=True),
    ),
    redis_persistent=False,
    redis_wipe_every_s=60.0,  # two wipes at least in CI's run
    outage_s=20.0,
    outage_at=0.45,
    settle_s=120.0,  # the longest Pod (60 s) twice over
)

PROFILES = {p.name: p for p in (GENTLE, HARSH)}


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"ANARCHON_SOAK_PROFILE={name!r}: one of {sorted(PROFILES)}") from None


@dataclass
class Report:
    profile: str = ""
    store: str = ""
    slots: int = 0
    #: Slots of jobs without catch-up that fell in the all-replica outage (not expected to run),
    #: and how many of them the operator reported Missed.
    outage_slots: int = 0
    outage_missed: int = 0
    #: Other slots the operator recorded as missed (a ``Missed`` Event): not lost.
    missed_recorded: int = 0
    seconds: float = 0.0
    phases: Counter[str] = field(default_factory=Counter)
    api_faults: Counter[str] = field(default_factory=Counter)
    store_faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    outage: str = "none"
    settling: str = ""
    takeovers: int = 0
    handover_bound_s: float = 0.0
    takeover_bound_s: float = 0.0
    handover_s: list[float] = field(default_factory=list)
    #: Hand-overs slower than the bound: (delay, run, victim), for the evidence.
    slow_handovers: list[tuple[float, str, str]] = field(default_factory=list)
    handover_store_down: int = 0  # SIGTERMs near a store fault: not judged as hand-overs
    takeover_after_kill_s: list[float] = field(default_factory=list)
    slow_takeovers: list[tuple[float, str, str]] = field(default_factory=list)
    takeover_store_down: int = 0  # SIGKILLs near a store fault or the outage: not judged
    violations: Counter[str] = field(default_factory=Counter)
    by_job: dict[str, Counter[str]] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    #: What the replicas logged about the runs behind a broken rule (empty if none).
    evidence: str = ""
    pods: int = 0

    def text(self) -> str:
        def dist(xs: list[float]) -> str:
            if not xs:
                return "none"
            xs = sorted(xs)
            return f"n={len(xs)} p50={xs[len(xs) // 2]:.1f}s max={xs[-1]:.1f}s"

        lines = [
            f"chaos soak ({self.profile} profile, {self.store}): {self.slots} slots in {self.seconds:.0f}s "
            f"({self.outage_slots} in the outage not expected, {self.outage_missed} of them and"
            f" {self.missed_recorded} others recorded Missed), "
            f"{self.pods} Pods, runs {dict(self.phases)}",
            f"  API faults fired: {dict(self.api_faults)}",
            f"  store faults: {dict(self.store_faults)}",
            f"  replica faults: {dict(self.kills)}; outage of every replica: {self.outage}",
            f"  settling: {self.settling}",
            f"  takeovers: {self.takeovers}; hand-over after SIGTERM: {dist(self.handover_s)} "
            f"(bound {self.handover_bound_s:.0f}s; {self.handover_store_down} SIGTERMs near a store fault not judged); "
            f"takeover after SIGKILL: {dist(self.takeover_after_kill_s)} (bound {self.takeover_bound_s:.0f}s; "
            f"{self.takeover_store_down} SIGKILLs near a store fault or the outage not judged)",
            "  violations: " + ", ".join(f"{k}={self.violations.get(k, 0)}" for k in RULES),
        ]
        for rule in RULES:
            if self.examples.get(rule):
                jobs = ", ".join(f"{job} {n}" for job, n in sorted(self.by_job.get(rule, Counter()).items()))
                lines.append(f"    {rule}: {jobs}" if jobs else f"    {rule}:")
                lines += [f"      {example}" for example in self.examples[rule]]
        return "\n".join(lines)


#: Each replica checks that it shares its store every second (its window is 20 s), so that the
#: store_not_shared rule judges the soak's minutes of store faults, not only their end.
REPLICA_FLAGS = ("--store-check", "1s")

RULES = (
    "two_live_pods",
    "skip_overlap",
    "lost_slots",
    "not_terminal",
    "phase_mismatch",
    "ended_while_live",
    "final_reopened",
    "attempt_rewound",
    "store_not_shared",
    "slow_handover",
    "slow_takeover",
)


async def _watch(kube: Kube, namespace: str, plural: str, feed: Callable[[str, dict[str, Any]], None]) -> None:
    """List, then watch for ever, as an informer does: a watch that ends is resumed from the last
    version seen (a relist would miss what changed and vanished in between: a run that ended and
    was deleted by its history limit would stay Running in the referee's eyes). Only when the
    server no longer has that version (410 Gone) does it list again; what the listing lacks then
    was deleted meanwhile, and is fed as deleted in its last known state.
    """
    known: dict[str, dict[str, Any]] = {}
    version: str | None = None

    def note(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            known.pop(name, None)
        else:
            known[name] = obj
        feed(kind, obj)

    while True:
        try:
            if version is None:
                listing = await kube.request("GET", path(plural, namespace))
                items = listing.get("items") or []
                present = {item["metadata"]["name"] for item in items}
                for name in [n for n in known if n not in present]:
                    note("DELETED", known[name])
                for item in items:
                    note("ADDED", item)
                version = str(listing["metadata"]["resourceVersion"])
            params = {"watch": True, "allowWatchBookmarks": True, "resourceVersion": version, "timeoutSeconds": 300}
            response = await kube.stream(path(plural, namespace), params, 330)
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        if (event.get("object") or {}).get("code") == 410:
                            version = None  # too old: list again
                        break
                    if event.get("type") != "BOOKMARK":
                        note(str(event["type"]), event["object"])
                    version = str(event["object"]["metadata"]["resourceVersion"])
            finally:
                response.release()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if getattr(exc, "status", None) == 410:
                version = None
            await asyncio.sleep(0.5)


class SoakStore:
    """The soak's store: a real server of its own with toxiproxy in front; the replicas use :attr:`url`.

    ``keeps_data``: whether a restart finds the data (PostgreSQL, Redis with its append-only
    file) or an empty store (Redis without persistence).
    """

    def __init__(
        self, server: PostgresServer | RedisServer, proxy: StoreProxy, *, kind: str = "", keeps_data: bool = True
    ) -> None:
        self.server = server
        self.proxy = proxy
        self.kind = kind
        self.keeps_data = keeps_data
        self.url = proxy.url_for(server.url)
        self._lock = asyncio.Lock()  # one fault at a time: a wipe waits for a freeze to end

    async def fault(self, fault: StoreFault, seconds: float) -> None:
        """Let ``fault`` befall the store for ``seconds``, and end it."""
        server, proxy = self.server, self.proxy
        async with self._lock:
            if fault.action == "freeze":
                await asyncio.to_thread(server.pause)
                try:
                    await asyncio.sleep(seconds)
                finally:
                    await asyncio.to_thread(server.resume)
                return
            if fault.action == "crash":
                await asyncio.to_thread(server.kill)
                try:
                    await asyncio.sleep(seconds)
                finally:
                    await asyncio.to_thread(server.restart)  # even when the soak's loops are cancelled
                return
            start = {
                "down": proxy.down,
                "reset": proxy.reset,
                "lose": proxy.lose_replies,
                "slow": lambda: proxy.latency(300, 100),
            }[fault.action]
            toxic = await asyncio.to_thread(start)
            try:
                await asyncio.sleep(seconds)
            finally:
                await asyncio.to_thread(toxic.remove)

    async def calm(self) -> None:
        """Every fault off and the server up."""
        await asyncio.to_thread(self.proxy.clear)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.server.resume)


#: Redis without persistence killed and started again: an empty store.
WIPE = StoreFault("restarted without its data", "crash", (1, 1), 0)


class Chaos:
    """The faults, each loop on its own timer, all drawn from one seeded generator."""

    def __init__(
        self,
        profile: Profile,
        rng: random.Random,
        proxy: ApiFaultProxy,
        store: SoakStore,
        replicas: Replicas,
        checker: Checker,
    ) -> None:
        self.profile = profile
        self.rng = rng
        self.proxy = proxy
        self.store = store
        self.replicas = replicas
        self.checker = checker
        self.report_kills: Counter[str] = Counter()
        self.store_faults: Counter[str] = Counter()
        self.store_down: list[tuple[float, float]] = []  # (from, to), monotonic
        # (when, victim, its running runs with their attempt)
        self.watch_handover: list[tuple[float, str, dict[str, int]]] = []
        self.watch_takeover: list[tuple[float, str, dict[str, int]]] = []
        self.api_rules: list[Fault] = []
        #: The all-replica outage: monotonic (from, to), and wall-clock ms of its kill and restart.
        self.outage_mono: tuple[float, float] | None = None
        self.outage_wall_ms: tuple[int, int] | None = None
        self._replica_lock = asyncio.Lock()  # one replica fault at a time; the outage waits its turn

    def api_faults(self, scale: float) -> None:
        """Rate-based rules on every request; the first rule that fires wins."""
        for fault in (
            Fault("status", code=500, rate=0.02 * scale),
            Fault("status", code=503, rate=0.01 * scale),
            Fault("status", code=429, rate=0.01 * scale),
            Fault("lost_reply", verb="create", rate=0.02 * scale),
            Fault("latency", seconds=1.0, rate=0.01 * scale),
            Fault("cut_watch", seconds=20.0, rate=0.3 * scale),
        ):
            self.api_rules.append(self.proxy.add(fault))

    def _start(self, name: str) -> None:
        # Through the fault proxy like at the start: a restarted replica must meet the faults too.
        self.replicas.start(name, "--kubeconfig", str(self.proxy.kubeconfig), *REPLICA_FLAGS)

    async def replicas_loop(self) -> None:
        names = sorted(self.replicas.procs)
        profile = self.profile
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * profile.kill_every_s)
            victim = self.rng.choice(names)
            kind = self.rng.choice(profile.replica_faults)
            pause = _draw(self.rng, profile.sigstop_s) if kind == "SIGSTOP" else 0.0
            if kind == "stall":
                pause = self.rng.uniform(0.3, 1.5)
            async with self._replica_lock:
                self.report_kills[kind] += 1
                running = self.checker.running_on(victim, since=self.replicas.started.get(victim, 0.0))
                now = time.monotonic()
                if kind in ("SIGTERM", "SIGKILL"):
                    # The victim named with the wall time, to find the moment in the replicas' logs.
                    who = f"{victim} at {datetime.now().strftime('%H:%M:%S,%f')[:-3]}"
                    (self.watch_handover if kind == "SIGTERM" else self.watch_takeover).append((now, who, running))
                    sig = signal.SIGTERM if kind == "SIGTERM" else signal.SIGKILL
                    await asyncio.to_thread(self.replicas.kill, victim, sig)
                    await asyncio.sleep(2)
                    self._start(victim)
                else:
                    self.replicas.kill(victim, signal.SIGSTOP)
                    try:
                        await asyncio.sleep(pause)
                    finally:
                        self.replicas.kill(victim, signal.SIGCONT)

    async def outage(self, after_s: float, seconds: float) -> None:
        """Once: every replica SIGKILLed, all started again ``seconds`` later."""
        await asyncio.sleep(after_s)
        async with self._replica_lock:
            began, began_ms = time.monotonic(), int(time.time() * 1000)
            names = sorted(self.replicas.procs)
            for name in names:
                with contextlib.suppress(ProcessLookupError):  # one that died on its own is down already
                    await asyncio.to_thread(self.replicas.kill, name, signal.SIGKILL)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.outage_wall_ms = (began_ms, int(time.time() * 1000))
                for name in names:
                    self._start(name)
                self.outage_mono = (began, time.monotonic())

    async def store_loop(self) -> None:
        tcp = os.environ.get("ANARCHON_SOAK_STORE_FAULTS", "all") != "server"
        faults = [
            f
            for f in self.profile.store_faults
            if (tcp or not f.tcp) and (self.store.keeps_data or not f.keeps_data_only)
        ]
        weights = [f.weight for f in faults]
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * self.profile.store_every_s)
            fault = self.rng.choices(faults, weights)[0]
            await self._store_fault(fault)

    async def wipe_loop(self, every_s: float) -> None:
        """Redis without persistence killed and started again (so empty) every 0.8-1.2 times ``every_s``."""
        await asyncio.sleep(self.rng.uniform(0.4, 0.8) * every_s)
        while True:
            await self._store_fault(WIPE)
            await asyncio.sleep(self.rng.uniform(0.8, 1.2) * every_s)

    async def _store_fault(self, fault: StoreFault) -> None:
        seconds = _draw(self.rng, fault.seconds)
        began = time.monotonic()
        try:
            await self.store.fault(fault, seconds)
        finally:
            self.store_faults[fault.label] += 1
            self.store_down.append((began, time.monotonic()))

    def disturbed_near(self, at: float, within_s: float) -> bool:
        """A store fault or the outage from STORE_FAULT_MARGIN_S before ``at`` to ``within_s`` after it."""
        spans = [*self.store_down, *([self.outage_mono] if self.outage_mono else [])]
        return any(a - within_s <= at <= b + STORE_FAULT_MARGIN_S for a, b in spans)


def _draw(rng: random.Random, between: tuple[float, float]) -> float:
    """A time from the range; a fixed one draws nothing (the gentle profile's faults come in the
    same order as before the profiles)."""
    low, high = between
    return low if low == high else rng.uniform(low, high)


async def soak(
    cluster: Cluster,
    replicas: Replicas,
    proxy: ApiFaultProxy,
    store: SoakStore,
    *,
    slots: int,
    seed: int = 0,
    profile: Profile = GENTLE,
) -> Report:
    rng = random.Random(seed)
    mix = profile.mix
    checker = Checker(
        skip_jobs=frozenset(p.name for p in mix if p.overlap == "Skip"),
        replace_jobs=frozenset(p.name for p in mix if p.overlap == "Replace"),
    )
    kube = await connect(str(cluster.cp.kubeconfig))
    watches = [
        asyncio.create_task(_watch(kube, cluster.namespace, "pods", checker.pod)),
        asyncio.create_task(_watch(kube, cluster.namespace, RUNS, checker.run)),
        asyncio.create_task(_watch(kube, cluster.namespace, "events", checker.event)),
    ]
    chaos = Chaos(profile, rng, proxy, store, replicas, checker)
    loops: list[asyncio.Task[None]] = []
    report = Report(
        profile=profile.name,
        store=f"{store.kind} {'keeping' if store.keeps_data else 'losing'} its data on restart",
        handover_bound_s=profile.handover_bound_s,
        takeover_bound_s=profile.takeover_bound_s,
    )
    try:
        chaos.api_faults(scale=1.0)  # from the start: the replicas' watches meet them too
        for i in range(3):
            replicas.start(f"replica-{i}", "--kubeconfig", str(proxy.kubeconfig), *REPLICA_FLAGS)
        for plan in mix:
            manifest = job_manifest(
                plan.name,
                every=f"{plan.every_s}s",
                overlap=plan.overlap,
                heartbeat=f"{profile.heartbeat_s:.0f}s",
                lease=f"{profile.lease_s:.0f}s",
                successfulRunsHistoryLimit=20,
                failedRunsHistoryLimit=20,
                annotations=plan.pod,
                **plan.spec,
            )
            await asyncio.to_thread(cluster.apply, manifest)
        started = time.monotonic()
        await _until(lambda: {job for job, _ in checker.run_job.values()} >= {p.name for p in mix}, 120, "first runs")
        loops = [
            asyncio.create_task(chaos.replicas_loop()),
            asyncio.create_task(chaos.store_loop()),
        ]
        if profile.redis_wipe_every_s and not store.keeps_data:
            loops.append(asyncio.create_task(chaos.wipe_loop(profile.redis_wipe_every_s)))
        if profile.outage_s:
            after = profile.outage_at * slots / profile.slots_per_s()
            loops.append(asyncio.create_task(chaos.outage(after, profile.outage_s)))
        while len(_expected(checker, mix, time.time())) < slots:  # noqa: ASYNC110 - time passing is the point
            await asyncio.sleep(1)
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        end = time.time()
        # Calm: every rule off, every replica and the store up, no new slots.
        proxy.clear()
        for name, proc in replicas.procs.items():
            if proc.poll() is None:
                replicas.kill(name, signal.SIGCONT)
            else:
                replicas.start(name, "--kubeconfig", str(proxy.kubeconfig), *REPLICA_FLAGS)
        await store.calm()
        for plan in mix:
            await _suspend(cluster, plan.name)
        # Settled: every run final and no Pod of a run live. Runs that never get there are the
        # not_terminal rule's (and Pods live past their run's end, ended_while_live's): judged, not fatal.
        calm = time.monotonic()
        settled = True
        try:
            await _until(lambda: not _unsettled(checker) and not checker.live_pod_names(), profile.settle_s, "settling")
        except AssertionError:
            settled = False
        await asyncio.sleep(2)
        stuck, live = _unsettled(checker), checker.live_pod_names()
        report.settling = (
            f"{time.monotonic() - calm:.0f}s"
            if settled
            else f"not within {profile.settle_s:.0f}s: {len(stuck)} runs not final, {len(live)} Pods live"
        )
        schedule = _expected(checker, mix, end)
        expected, in_outage = _outside_outage(checker, mix, schedule, chaos.outage_wall_ms)
        checker.settled(expected)
        report.seconds = time.monotonic() - started
        report.slots = len(schedule)
        report.outage_slots = len(in_outage)
        report.outage_missed = sum(1 for job, slot in in_outage if checker.was_missed(job, slot))
        report.missed_recorded = checker.missed_recorded
        report.phases = checker.phases()
        report.pods = len(checker.pods_seen)
        report.api_faults = Counter({f"{f.action} {f.code or ''}".strip(): f.fired for f in chaos.api_rules})
        report.store_faults = chaos.store_faults
        report.kills = chaos.report_kills
        if chaos.outage_wall_ms:
            a, b = chaos.outage_wall_ms
            report.outage = (
                f"{(b - a) / 1000:.0f}s from {datetime.fromtimestamp(a / 1000):%H:%M:%S}; "
                f"{len(in_outage)} slots of jobs without catch-up in it"
            )
        report.takeovers = checker.takeovers()
        hb, tb = profile.handover_bound_s, profile.takeover_bound_s
        judged = [m for m in chaos.watch_handover if not chaos.disturbed_near(m[0], hb)]
        handovers = _delays(checker, judged)
        report.handover_s = [d for d, _, _ in handovers]
        report.slow_handovers = [h for h in handovers if h[0] > hb]
        # A run whose hand-over never came (its next attempt never seen) is slow too.
        report.slow_handovers += [(float("inf"), run, who) for run, who in _never(checker, judged, hb)]
        report.handover_store_down = len(chaos.watch_handover) - len(judged)
        judged = [m for m in chaos.watch_takeover if not chaos.disturbed_near(m[0], tb)]
        takeovers = _delays(checker, judged)
        report.takeover_after_kill_s = [d for d, _, _ in takeovers]
        report.slow_takeovers = [t for t in takeovers if t[0] > tb]
        report.takeover_store_down = len(chaos.watch_takeover) - len(judged)
        report.violations = Counter(checker.violations)
        report.violations["slow_handover"] = len(report.slow_handovers)
        report.violations["slow_takeover"] = len(report.slow_takeovers)
        report.examples = dict(checker.examples)
        report.by_job = dict(checker.by_job)
        report.examples["slow_handover"] = [
            f"{run}: {d:.1f}s after {victim}'s SIGTERM" for d, run, victim in report.slow_handovers
        ][:5]
        report.examples["slow_takeover"] = [
            f"{run}: {d:.1f}s after {victim}'s SIGKILL" for d, run, victim in report.slow_takeovers
        ][:5]
        slow = [run for _, run, _ in report.slow_handovers[:2]]
        if slow or stuck:
            report.evidence = _evidence(replicas, [*slow, *stuck[:2]], lines=60)
        return report
    finally:
        for task in [*loops, *watches]:
            task.cancel()
        await asyncio.gather(*loops, *watches, return_exceptions=True)
        await kube.close()


def _unsettled(checker: Checker) -> list[str]:
    return [
        f"{name}: {s.get('phase')} {s.get('message', '')!r}"
        for name, s in checker.runs.items()
        if not _final_or_skipped(s)
    ]


async def _suspend(cluster: Cluster, job: str) -> None:
    """Suspend a job of the mix; the referee's own kubectl call is retried (a loaded API server may time out)."""
    patch = ("patch", "anarchonjob", job, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    for _ in range(10):
        done = await asyncio.to_thread(cluster.kubectl, *patch, check=False)
        if done.returncode == 0:
            return
        await asyncio.sleep(2)
    raise AssertionError(f"soak: could not suspend {job}: {done.stderr}")


#: What a replica logs when it stops (and so hands its runs over): kept in the evidence.
_LIFE = "handing running attempts over"


def _evidence(replicas: Replicas, stuck: list[str], lines: int = 40) -> str:
    """What the replicas logged about the runs that never settled: the soak's logs are gone after it."""
    out = []
    for entry in stuck:
        run = entry.split(":", 1)[0]
        slot = run.rsplit("-", 1)[-1]
        for name in sorted(replicas.procs):
            # The run's own lines, and each replica's stops and starts (a hand-over's timing).
            hits = [line for line in replicas.log(name).splitlines() if run in line or slot in line or _LIFE in line]
            out += [f"--- {name} on {run}: {len(hits)} lines, the last {lines}:", *hits[-lines:]]
    return "\n".join(out)


def _final_or_skipped(status: dict[str, Any]) -> bool:
    phase = status.get("phase")
    return phase in ("Succeeded", "Failed", "Skipped") or (phase == "Interrupted" and bool(status.get("finishTime")))


def _expected(checker: Checker, mix: tuple[Plan, ...], until: float) -> list[tuple[str, int]]:
    """Every slot of every job from its first run seen up to ``until`` (less 5 s in flight)."""
    until_ms = int(until * 1000) - 5_000
    slots = []
    for plan in mix:
        first = min(slot for job, slot in checker.run_job.values() if job == plan.name)
        slots += [(plan.name, slot) for slot in range(first, until_ms + 1, plan.every_s * 1000)]
    return slots


#: Slots this long before the outage's SIGKILLs may be unclaimed (the jitter, a claim in flight).
OUTAGE_BEFORE_MS = 2_000
#: A job's loop runs again at most this long after the replicas were started again.
OUTAGE_STARTUP_MS = 30_000


def _outside_outage(
    checker: Checker, mix: tuple[Plan, ...], schedule: list[tuple[str, int]], outage: tuple[int, int] | None
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The slots that must have a run, and those a job without catch-up may miss in the outage.

    Slots missed while no replica ran under ``catchUp: None`` are reported Missed only if the
    store still knows the job's last slot (engine/jobloop.py ``_start_cursor``); the soak's Redis
    forgets everything now and then, so those are not judged lost (the report counts how many
    were recorded Missed): from just before the SIGKILLs until the job's first slot run after
    the restart (at most OUTAGE_STARTUP_MS after it). A job with catch-up must run every one.
    """
    if outage is None:
        return schedule, []
    killed, restarted = outage
    catching_up = {p.name for p in mix if p.catches_up}
    first_after: dict[str, int] = {}
    for job, slot in checker.run_job.values():
        if slot >= restarted and slot < first_after.get(job, restarted + OUTAGE_STARTUP_MS):
            first_after[job] = slot
    keep, excused = [], []
    for job, slot in schedule:
        upto = first_after.get(job, restarted + OUTAGE_STARTUP_MS)
        if job not in catching_up and killed - OUTAGE_BEFORE_MS <= slot < upto:
            excused.append((job, slot))
        else:
            keep.append((job, slot))
    return keep, excused


def _delays(checker: Checker, marks: list[tuple[float, str, dict[str, int]]]) -> list[tuple[float, str, str]]:
    """For each run a victim was running: how long until the next attempt began (taken over), the run, the victim."""
    delays = []
    for at, victim, running in marks:
        for run, attempt in running.items():
            taken = checker.next_attempt_at(run, attempt, _instance(victim))
            if taken is not None:
                delays.append((taken - at, run, victim))
    return delays


def _instance(victim: str) -> str:
    """The replica of a mark's victim ("replica-1 at 12:00:00,000")."""
    return victim.split(" at ", 1)[0]


def _never(checker: Checker, marks: list[tuple[float, str, dict[str, int]]], bound_s: float) -> list[tuple[str, str]]:
    """The runs a SIGTERMed victim was running that no next attempt ever took, and that were not
    final either within the bound after the signal: their hand-over never happened."""
    never = []
    for at, victim, running in marks:
        for run, attempt in running.items():
            taken = checker.next_attempt_at(run, attempt, _instance(victim))
            if taken is None and not checker.final_by(run, at + bound_s):
                never.append((run, victim))
    return never


async def _until(check: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"soak: timed out waiting for {what}")
        await asyncio.sleep(0.5)
