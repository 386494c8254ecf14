"""The chaos soak: three replicas run a mix of jobs while the API server, the store and the replicas fail.

Everything is real: the replicas are OS processes talking to the test API server through
the HTTP fault proxy (tests/faults/apiproxy.py) and to a private store (PostgreSQL, or Redis
with the chart's append-only file) through toxiproxy (tests/faults/toxiproxy.py); KWOK runs
the Pods. Faults, at random from a seeded generator:

* API: 500/503/429 answers, creates whose reply is lost, slow replies, cut watches;
* store: frozen for a moment (SIGSTOP), crashed and restarted (SIGKILL, then start), and
  through toxiproxy: unreachable, connections reset, replies lost after the server acted, slow;
* replicas: SIGTERM (a rolling update), SIGKILL, SIGSTOP past the lease, short stalls.

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

from anarchon.kube.client import Kube, connect, path
from anarchon.kube.constants import RUNS
from tests.faults.apiproxy import ApiFaultProxy, Fault
from tests.faults.toxiproxy import StoreProxy
from tests.operator.conftest import Cluster, Replicas, job_manifest
from tests.servers.postgres import PostgresServer
from tests.servers.redis import RedisServer

from .checker import Checker

HEARTBEAT_S = 1.0
#: Long beside the heartbeat so that a hand-over and a takeover at lease expiry cannot be told
#: apart by chance: a dead runner's lease runs out no sooner than LEASE_S - HEARTBEAT_S after
#: its last heartbeat, well past HANDOVER_BOUND_S.
LEASE_S = 8.0
#: The issue's bound. A backup that knows of a run looks at it every half to one heartbeat;
#: then it claims and writes the run's status through the fault proxy, and the referee sees
#: that through its own watch: 2 s for all of that.
HANDOVER_BOUND_S = HEARTBEAT_S + 2
#: A hand-over needs the store: one that is frozen or down around a SIGTERM turns it into a
#: takeover at lease expiry, which the soak then does not judge as a hand-over.
STORE_FAULT_MARGIN_S = 3.0


@dataclass(frozen=True)
class Plan:
    """One job of the mix: its period, overlap policy and what its Pods do (KWOK annotations)."""

    name: str
    every_s: int
    overlap: str
    pod: dict[str, str]


MIX = [
    Plan("allow-short", 1, "Allow", {"anarchon.test/run-seconds": "1"}),
    Plan("skip-short", 1, "Skip", {"anarchon.test/run-seconds": "0.3"}),
    Plan("skip-long", 1, "Skip", {"anarchon.test/run-seconds": "4"}),
    Plan("skip-failing", 1, "Skip", {"anarchon.test/run-seconds": "0.3", "anarchon.test/exit-code": "3"}),
    Plan("replace-long", 2, "Replace", {"anarchon.test/run-seconds": "3"}),
    Plan("allow-long", 2, "Allow", {"anarchon.test/run-seconds": "5"}),
]


@dataclass
class Report:
    slots: int = 0
    seconds: float = 0.0
    phases: Counter[str] = field(default_factory=Counter)
    api_faults: Counter[str] = field(default_factory=Counter)
    store_faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    handover_s: list[float] = field(default_factory=list)
    #: Hand-overs slower than the bound: (delay, run, victim), for the evidence.
    slow_handovers: list[tuple[float, str, str]] = field(default_factory=list)
    handover_store_down: int = 0  # SIGTERMs near a store fault: not judged as hand-overs
    takeover_after_kill_s: list[float] = field(default_factory=list)
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    #: What the replicas logged about the runs behind a broken timing rule (empty if none).
    evidence: str = ""
    pods: int = 0

    def text(self) -> str:
        def dist(xs: list[float]) -> str:
            if not xs:
                return "none"
            xs = sorted(xs)
            return f"n={len(xs)} p50={xs[len(xs) // 2]:.1f}s max={xs[-1]:.1f}s"

        lines = [
            f"chaos soak: {self.slots} slots in {self.seconds:.0f}s, {self.pods} Pods, runs {dict(self.phases)}",
            f"  API faults fired: {dict(self.api_faults)}",
            f"  store faults: {dict(self.store_faults)}",
            f"  replica faults: {dict(self.kills)}",
            f"  takeovers: {self.takeovers}; hand-over after SIGTERM: {dist(self.handover_s)} "
            f"(bound {HANDOVER_BOUND_S:.0f}s; {self.handover_store_down} SIGTERMs near a store fault not judged); "
            f"takeover after SIGKILL: {dist(self.takeover_after_kill_s)}",
            "  violations: " + ", ".join(f"{k}={self.violations.get(k, 0)}" for k in RULES),
        ]
        for rule, examples in self.examples.items():
            if examples:
                lines.append(f"    {rule}: {examples}")
        return "\n".join(lines)


RULES = (
    "two_live_pods",
    "skip_overlap",
    "lost_slots",
    "not_terminal",
    "phase_mismatch",
    "given_up_while_live",
    "final_reopened",
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
    """The soak's store: a real server of its own with toxiproxy in front; the replicas use :attr:`url`."""

    #: What may befall it, and how often (weights).
    KINDS = {
        "frozen 2s": 2,  # SIGSTOP of the server: connections open, nothing answers
        "crashed and restarted": 2,  # SIGKILL, a second down, started again on its data
    }
    #: The TCP faults of toxiproxy (``ANARCHON_SOAK_STORE_FAULTS=server`` leaves them out). A
    #: 20,000-slot run with them once lost 4 slots (its logs were not kept); two ways to lose one
    #: were found and fixed since: a Skip recorded by a claim whose reply was lost, and a run
    #: ended in the store (replaced, given up) before any attempt had written its object.
    TCP_KINDS = {
        "unreachable 2s": 1,  # the proxy closes every connection and refuses new ones
        "connections reset": 1,  # every request for half a second answered by a TCP reset
        "replies lost": 1,  # for half a second the server acts, the reply never comes
        "slow 5s": 1,  # every reply 300 ± 100 ms late for 5 s
    }

    def __init__(self, server: PostgresServer | RedisServer, proxy: StoreProxy) -> None:
        self.server = server
        self.proxy = proxy
        self.url = proxy.url_for(server.url)

    async def fault(self, kind: str) -> None:
        """Let ``kind`` befall the store, and end it."""
        server, proxy = self.server, self.proxy
        if kind == "frozen 2s":
            await asyncio.to_thread(server.pause)
            try:
                await asyncio.sleep(2)
            finally:
                await asyncio.to_thread(server.resume)
            return
        if kind == "crashed and restarted":
            await asyncio.to_thread(server.kill)
            try:
                await asyncio.sleep(1)
            finally:
                await asyncio.to_thread(server.restart)  # even when the soak's loops are cancelled
            return
        start, seconds = {
            "unreachable 2s": (proxy.down, 2.0),
            "connections reset": (proxy.reset, 0.5),
            "replies lost": (proxy.lose_replies, 0.5),
            "slow 5s": (lambda: proxy.latency(300, 100), 5.0),
        }[kind]
        fault = await asyncio.to_thread(start)
        try:
            await asyncio.sleep(seconds)
        finally:
            await asyncio.to_thread(fault.remove)

    async def calm(self) -> None:
        """Every fault off and the server up."""
        await asyncio.to_thread(self.proxy.clear)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.server.resume)


class Chaos:
    """The faults, each loop on its own timer, all drawn from one seeded generator."""

    def __init__(
        self, rng: random.Random, proxy: ApiFaultProxy, store: SoakStore, replicas: Replicas, checker: Checker
    ) -> None:
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

    async def replicas_loop(self, every_s: float) -> None:
        names = sorted(self.replicas.procs)
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * every_s)
            victim = self.rng.choice(names)
            kind = self.rng.choice(["SIGTERM", "SIGKILL", "SIGSTOP", "stall"])
            self.report_kills[kind] += 1
            running = self.checker.running_on(victim)
            now = time.monotonic()
            if kind in ("SIGTERM", "SIGKILL"):
                # The victim named with the wall time, to find the moment in the replicas' logs.
                who = f"{victim} at {datetime.now().strftime('%H:%M:%S,%f')[:-3]}"
                (self.watch_handover if kind == "SIGTERM" else self.watch_takeover).append((now, who, running))
                sig = signal.SIGTERM if kind == "SIGTERM" else signal.SIGKILL
                await asyncio.to_thread(self.replicas.kill, victim, sig)
                await asyncio.sleep(2)
                # Through the fault proxy like at the start: a restarted replica must meet the faults too.
                self.replicas.start(victim, "--kubeconfig", str(self.proxy.kubeconfig))
            else:
                pause = LEASE_S + 2 if kind == "SIGSTOP" else self.rng.uniform(0.3, 1.5)
                self.replicas.kill(victim, signal.SIGSTOP)
                try:
                    await asyncio.sleep(pause)
                finally:
                    self.replicas.kill(victim, signal.SIGCONT)

    async def store_loop(self, every_s: float) -> None:
        tcp = os.environ.get("ANARCHON_SOAK_STORE_FAULTS", "all") != "server"
        every = SoakStore.KINDS | (SoakStore.TCP_KINDS if tcp else {})
        kinds, weights = zip(*every.items(), strict=True)
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * every_s)
            kind = self.rng.choices(kinds, weights)[0]
            self.store_faults[kind] += 1
            began = time.monotonic()
            try:
                await self.store.fault(kind)
            finally:
                self.store_down.append((began, time.monotonic()))

    def store_was_down_near(self, at: float) -> bool:
        return any(a - STORE_FAULT_MARGIN_S <= at <= b + STORE_FAULT_MARGIN_S for a, b in self.store_down)


async def soak(
    cluster: Cluster,
    replicas: Replicas,
    proxy: ApiFaultProxy,
    store: SoakStore,
    *,
    slots: int,
    seed: int = 0,
    kill_every_s: float = 15.0,
    store_every_s: float = 20.0,
) -> Report:
    rng = random.Random(seed)
    checker = Checker(skip_jobs=frozenset(p.name for p in MIX if p.overlap == "Skip"))
    kube = await connect(str(cluster.cp.kubeconfig))
    watches = [
        asyncio.create_task(_watch(kube, cluster.namespace, "pods", checker.pod)),
        asyncio.create_task(_watch(kube, cluster.namespace, RUNS, checker.run)),
    ]
    chaos = Chaos(rng, proxy, store, replicas, checker)
    loops: list[asyncio.Task[None]] = []
    report = Report()
    try:
        chaos.api_faults(scale=1.0)  # from the start: the replicas' watches meet them too
        for i in range(3):
            replicas.start(f"replica-{i}", "--kubeconfig", str(proxy.kubeconfig))
        for plan in MIX:
            manifest = job_manifest(
                plan.name,
                every=f"{plan.every_s}s",
                overlap=plan.overlap,
                heartbeat=f"{HEARTBEAT_S:.0f}s",
                lease=f"{LEASE_S:.0f}s",
                successfulRunsHistoryLimit=20,
                failedRunsHistoryLimit=20,
                annotations=plan.pod,
            )
            await asyncio.to_thread(cluster.apply, manifest)
        started = time.monotonic()
        await _until(lambda: {job for job, _ in checker.run_job.values()} >= {p.name for p in MIX}, 120, "first runs")
        loops = [
            asyncio.create_task(chaos.replicas_loop(kill_every_s)),
            asyncio.create_task(chaos.store_loop(store_every_s)),
        ]
        while len(_expected(checker, time.time())) < slots:  # noqa: ASYNC110 - time passing is the point
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
                replicas.start(name, "--kubeconfig", str(proxy.kubeconfig))
        await store.calm()
        for plan in MIX:
            await _suspend(cluster, plan.name)
        try:
            await _until(lambda: not _unsettled(checker), 120, "settling")
        except AssertionError as exc:
            stuck = _unsettled(checker)
            raise AssertionError(f"{exc}: {stuck[:5]}\n{_evidence(replicas, stuck[:2])}") from None
        await asyncio.sleep(2)
        expected = _expected(checker, end)
        checker.settled(expected)
        report.seconds = time.monotonic() - started
        report.slots = len(expected)
        report.phases = checker.phases()
        report.pods = len(checker.pods_seen)
        report.api_faults = Counter({f"{f.action} {f.code or ''}".strip(): f.fired for f in chaos.api_rules})
        report.store_faults = chaos.store_faults
        report.kills = chaos.report_kills
        report.takeovers = checker.takeovers()
        handovers = _delays(checker, [m for m in chaos.watch_handover if not chaos.store_was_down_near(m[0])])
        report.handover_s = [d for d, _, _ in handovers]
        report.slow_handovers = [h for h in handovers if h[0] > HANDOVER_BOUND_S]
        report.handover_store_down = sum(1 for at, _, _ in chaos.watch_handover if chaos.store_was_down_near(at))
        report.takeover_after_kill_s = [d for d, _, _ in _delays(checker, chaos.watch_takeover)]
        report.violations = Counter(checker.violations)
        report.violations["slow_handover"] = len(report.slow_handovers)
        report.violations["slow_takeover"] = sum(
            1 for d in report.takeover_after_kill_s if d > LEASE_S + 2 * HEARTBEAT_S + 2
        )
        report.examples = dict(checker.examples)
        report.examples["slow_handover"] = [
            f"{run}: {d:.1f}s after {victim}'s SIGTERM" for d, run, victim in report.slow_handovers
        ][:5]
        if report.slow_handovers:
            report.evidence = _evidence(replicas, [run for _, run, _ in report.slow_handovers[:2]], lines=60)
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


def _expected(checker: Checker, until: float) -> list[tuple[str, int]]:
    """Every slot of every job from its first run seen up to ``until`` (less 5 s in flight)."""
    until_ms = int(until * 1000) - 5_000
    slots = []
    for plan in MIX:
        first = min(slot for job, slot in checker.run_job.values() if job == plan.name)
        slots += [(plan.name, slot) for slot in range(first, until_ms + 1, plan.every_s * 1000)]
    return slots


def _delays(checker: Checker, marks: list[tuple[float, str, dict[str, int]]]) -> list[tuple[float, str, str]]:
    """For each run a victim was running: how long until the next attempt began (taken over), the run, the victim."""
    delays = []
    for at, victim, running in marks:
        for run, attempt in running.items():
            taken = checker.next_attempt_at(run, attempt)
            if taken is not None:
                delays.append((taken - at, run, victim))
    return delays


async def _until(check: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"soak: timed out waiting for {what}")
        await asyncio.sleep(0.5)
