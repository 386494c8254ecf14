"""The soak's referee: it watches Pods, AnarchonRuns and Events itself and holds the operator to its promises.

It reads the API server directly (never through the fault proxy the replicas use) and keeps
every version of every object it sees, so a run deleted by the history limit is still
judged. The rules, each a count that must end at zero:

* ``two_live_pods``: two Pods of one run (one slot) live at once;
* ``skip_overlap``: a Pod of an overlap-Skip or -Replace job live beside a live Pod of another
  run of the job (for Replace, longer than REPLACE_MARGIN_S: the old Pod is deleted right
  before the new one is created, and both show in one watch stream, in the server's order);
* ``lost_slots``: a slot of the schedule without an AnarchonRun (nor a ``Missed`` Event);
* ``not_terminal``: a run not final once everything has settled;
* ``phase_mismatch``: the run's phase is not what its Pods did: Succeeded without a succeeded
  Pod; Failed without a failed Pod, unless it timed out and every Pod of it stopped without
  succeeding; Failed or Interrupted although a Pod succeeded; Interrupted although a Pod failed;
* ``ended_while_live``: a run final Interrupted or Failed while one of its Pods lived: a Pod of
  it still live (or live again) more than END_MARGIN_S after the referee first saw the run final
  (the two watch streams are not ordered with each other); a Pod that then succeeds is live
  until it does;
* ``final_reopened``: a final run seen not final again;
* ``attempt_rewound``: a run's attempt seen going down, or a running run seen on another
  instance under the same attempt (a takeover after the store forgot the run that did not
  continue above the run object's attempt);
* ``store_not_shared``: a ``StoreNotShared`` Event, although every replica of the soak uses one
  store: store faults and restarts (presence records lost or not written) must not be taken for
  replicas on stores of their own.

"Live" is a Pod in Pending or Running without a deletionTimestamp: one whose containers run
or are about to.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

FINAL = frozenset({"Succeeded", "Failed", "Skipped"})
LABEL_JOB = "anarchon.io/job"
LABEL_RUN = "anarchon.io/run"
LABEL_SLOT = "anarchon.io/slot"
#: A Pod of a run seen live this long after the run was seen final was live when it ended.
END_MARGIN_S = 2.0
#: Replace deletes the old Pod (grace 0) right before it creates the new one.
REPLACE_MARGIN_S = 0.5


def _live(pod: dict[str, Any], deleted: bool) -> bool:
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return not deleted and not pod["metadata"].get("deletionTimestamp") and phase in ("Pending", "Running")


def _story(status: dict[str, Any]) -> str:
    """A run's attempts in one line, for a violation's example."""
    steps = [
        f"a{a.get('attempt')}@{a.get('instance')}={a.get('outcome')}({a.get('message', '')})"
        for a in status.get("attempts") or []
    ]
    return f"{status.get('message', '')!r} [{'; '.join(steps)}]"


def _final(status: dict[str, Any]) -> bool:
    phase = status.get("phase")
    return phase in FINAL or (phase == "Interrupted" and bool(status.get("finishTime")))


def _timed_out(status: dict[str, Any]) -> bool:
    return status.get("reason") == "DeadlineExceeded" or "timed out" in str(status.get("message"))


_SLOT_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{3})?Z"
_MISSED_ONE = re.compile(rf"^slot ({_SLOT_TIME})")
_MISSED_MANY = re.compile(rf"^\d+ slots, ({_SLOT_TIME}) to ({_SLOT_TIME})")


def _slot_ms(text: str) -> int:
    """A slot as the operator writes it (kube/spec.py ``slot_time``), in ms."""
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ" if "." in text else "%Y-%m-%dT%H:%M:%SZ"
    return round(datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp() * 1000)


@dataclass
class PodLife:
    """One Pod (one uid: a lost try is launched again under the same name) and when it was live."""

    name: str
    run: str
    job: str
    slot: int
    lives: list[tuple[float, float]] = field(default_factory=list)  # (from, to), monotonic
    live_since: float | None = None
    phase: str = "Pending"

    def spans(self, now: float) -> list[tuple[float, float]]:
        return [*self.lives, *([(self.live_since, now)] if self.live_since is not None else [])]


@dataclass
class Checker:
    """Feed it watch events (:meth:`pod`, :meth:`run`, :meth:`event`); read the verdicts after :meth:`settled`."""

    skip_jobs: frozenset[str] = frozenset()
    replace_jobs: frozenset[str] = frozenset()
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    live_pods: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # run -> Pods
    pod_phases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # run -> phases seen
    pod_lives: dict[str, PodLife] = field(default_factory=dict)  # uid -> its life
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> last status seen
    run_job: dict[str, tuple[str, int]] = field(default_factory=dict)  # run -> (job, slot)
    #: run -> when the referee first saw it final Interrupted or Failed, and that status.
    ended: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    final_at: dict[str, float] = field(default_factory=dict)  # run -> first seen final
    attempts: dict[str, list[tuple[float, int, str]]] = field(default_factory=lambda: defaultdict(list))
    pods_seen: set[str] = field(default_factory=set)
    #: (job, slot) the operator reported Missed in an Event: not lost.
    missed: set[tuple[str, int]] = field(default_factory=set)
    #: (job, first, last) of the Missed Events naming a range of slots.
    missed_ranges: set[tuple[str, int, int]] = field(default_factory=set)
    missed_recorded: int = 0

    #: rule -> job -> count, to tell which kind of job broke a rule.
    by_job: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def _violate(self, rule: str, example: str, job: str = "") -> None:
        self.violations[rule] += 1
        if not job:  # the example begins with the run's name, or the job's ("job:" or "job@slot")
            head = example.split(":", 1)[0].split("@", 1)[0]
            job = self.job_of(head) if head in self.run_job else head
        self.by_job[rule][job] += 1
        if len(self.examples[rule]) < 5:
            self.examples[rule].append(example)

    def job_of(self, run: str) -> str:
        return self.run_job.get(run, (run.rsplit("-", 1)[0], 0))[0]

    def pod(self, kind: str, pod: dict[str, Any], at: float | None = None) -> None:
        now = time.monotonic() if at is None else at
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        run, job, name = labels.get(LABEL_RUN), labels.get(LABEL_JOB), meta["name"]
        if not run or not job:
            return
        self.pods_seen.add(name)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        self.pod_phases[run].add(phase)
        uid = str(meta.get("uid") or name)
        life = self.pod_lives.get(uid)
        if life is None:
            slot = int(labels.get(LABEL_SLOT) or 0) if str(labels.get(LABEL_SLOT) or "").isdigit() else 0
            life = self.pod_lives[uid] = PodLife(name, run, job, slot)
        life.phase = phase
        if _live(pod, kind == "DELETED"):
            if life.live_since is None:
                life.live_since = now
            self.live_pods[run].add(name)
            if len(self.live_pods[run]) > 1:
                self._violate("two_live_pods", f"{run}: {sorted(self.live_pods[run])}", job)
        else:
            if life.live_since is not None:
                life.lives.append((life.live_since, now))
                life.live_since = None
            self.live_pods[run].discard(name)

    def run(self, kind: str, body: dict[str, Any], at: float | None = None) -> None:
        now = time.monotonic() if at is None else at
        name = body["metadata"]["name"]
        spec = body.get("spec") or {}
        self.run_job[name] = (str(spec.get("job")), int(spec.get("slot") or 0))
        status = dict(body.get("status") or {})
        before = self.runs.get(name) or {}
        if before and _final(before) and not _final(status) and kind != "DELETED":
            self._violate("final_reopened", f"{name}: {before.get('phase')} -> {status.get('phase')}")
        attempt = int(status.get("attempt") or 0)
        instance = str(status.get("instance") or "")
        running = status.get("phase") == "Running"
        if kind != "DELETED" and before:
            was = int(before.get("attempt") or 0)
            moved = running and before.get("phase") == "Running" and instance != str(before.get("instance") or "")
            if attempt < was or (moved and attempt == was):
                self._violate(
                    "attempt_rewound",
                    f"{name}: attempt {was} on {before.get('instance')} then attempt {attempt} on {instance}",
                )
        history = self.attempts[name]
        if not history or history[-1][1] != attempt or (running and history[-1][2] != instance):
            history.append((now, attempt, instance))
        if _final(status):
            self.final_at.setdefault(name, now)
            if status.get("phase") in ("Interrupted", "Failed") and name not in self.ended:
                self.ended[name] = (now, status)
        if kind != "DELETED" or not before:
            self.runs[name] = status

    def event(self, kind: str, body: dict[str, Any], at: float | None = None) -> None:
        """A ``Missed`` Event of a job: its slots were reported missed, not lost. A
        ``StoreNotShared`` one: a false alarm here (one store)."""
        if kind == "DELETED":
            return
        if body.get("reason") == "StoreNotShared":
            job = str((body.get("involvedObject") or {}).get("name"))
            self._violate("store_not_shared", f"{job}: {body.get('message')}", job)
            return
        if body.get("reason") != "Missed":
            return
        job = str((body.get("involvedObject") or {}).get("name"))
        message = str(body.get("message") or "")
        if m := _MISSED_ONE.match(message):
            self.missed.add((job, _slot_ms(m.group(1))))
        elif m := _MISSED_MANY.match(message):
            self.missed_ranges.add((job, _slot_ms(m.group(1)), _slot_ms(m.group(2))))

    def was_missed(self, job: str, slot: int) -> bool:
        return (job, slot) in self.missed or any(j == job and a <= slot <= b for j, a, b in self.missed_ranges)

    def live_pod_names(self) -> list[str]:
        return sorted(life.name for life in self.pod_lives.values() if life.live_since is not None)

    def running_on(self, instance: str, since: float = 0.0) -> dict[str, int]:
        """The runs an instance runs right now, with their attempt (for hand-over timing).

        Only attempts first seen at ``since`` or later (the instance's process started then): a
        run whose object still names the instance but whose attempt began under an earlier
        process of that name was orphaned when that one died, and the signal to this one cannot
        hand it over (the quiet harsh soak blamed 16 slow hand-overs on one SIGTERM so).
        """
        found = {}
        for name, s in self.runs.items():
            if s.get("phase") != "Running" or s.get("instance") != instance:
                continue
            attempt = int(s.get("attempt") or 0)
            history = reversed(self.attempts.get(name, []))
            seen = next((t for t, a, i in history if a == attempt and i == instance), None)
            if seen is None or seen >= since:
                found[name] = attempt
        return found

    def next_attempt_at(self, run: str, after_attempt: int, instance: str = "") -> float | None:
        """When the run was first seen under a later attempt, or (a takeover that did not count up,
        the attempt_rewound rule's) under the same attempt on another instance than ``instance``."""
        return next(
            (
                t
                for t, a, i in self.attempts.get(run, [])
                if a > after_attempt or (instance and a == after_attempt and i and i != instance)
            ),
            None,
        )

    def final_by(self, run: str, when: float) -> bool:
        return run in self.final_at and self.final_at[run] <= when

    def settled(self, expected_slots: Iterable[tuple[str, int]]) -> None:
        """Judge the end state: every expected slot has a run, every run is final and true to its Pods."""
        now = time.monotonic()
        have = set(self.run_job.values())
        for job, slot in expected_slots:
            if (job, slot) in have:
                continue
            if self.was_missed(job, slot):
                self.missed_recorded += 1
            else:
                self._violate("lost_slots", f"{job}@{slot}")
        pods_of: dict[str, list[PodLife]] = defaultdict(list)
        for life in self.pod_lives.values():
            pods_of[life.run].append(life)
        for name, status in self.runs.items():
            phase = status.get("phase")
            pods = self.pod_phases.get(name, set())
            still_live = any(life.live_since is not None for life in pods_of.get(name, []))
            if not _final(status):
                self._violate("not_terminal", f"{name}: {phase} {status.get('message', '')!r} Pods {sorted(pods)}")
            if phase == "Succeeded" and "Succeeded" not in pods:
                self._violate("phase_mismatch", f"{name}: Succeeded, Pods {sorted(pods)}: {_story(status)}")
            if phase == "Failed" and "Failed" not in pods and not (_timed_out(status) and not still_live):
                self._violate("phase_mismatch", f"{name}: Failed, Pods {sorted(pods)}: {_story(status)}")
            if "Succeeded" in pods and phase in ("Failed", "Interrupted"):
                self._violate("phase_mismatch", f"{name}: {phase} although a Pod succeeded: {_story(status)}")
            elif "Failed" in pods and phase == "Interrupted" and _final(status):
                self._violate("phase_mismatch", f"{name}: Interrupted although a Pod failed: {_story(status)}")
        for name, (ended_at, status) in self.ended.items():
            late = [
                (to - ended_at, life)
                for life in pods_of.get(name, [])
                for _, to in life.spans(now)
                if to > ended_at + END_MARGIN_S
            ]
            if late:
                seconds, life = max(late, key=lambda x: x[0])
                still = " (still live at the end)" if life.live_since is not None else ""
                self._violate(
                    "ended_while_live",
                    f"{name}: {status.get('phase')} while Pod {life.name} lived {seconds:.1f}s more{still}, "
                    f"ending {life.phase}: {_story(status)}",
                )
        self._overlaps(now)

    def _overlaps(self, now: float) -> None:
        """Skip and Replace: no Pod of a run live beside a live Pod of another run of the job."""
        by_job: dict[str, list[tuple[float, float, PodLife]]] = defaultdict(list)
        for life in self.pod_lives.values():
            if life.job in self.skip_jobs or life.job in self.replace_jobs:
                by_job[life.job] += [(a, b, life) for a, b in life.spans(now)]
        for job, spans in by_job.items():
            margin = REPLACE_MARGIN_S if job in self.replace_jobs else 0.0
            spans.sort(key=lambda s: s[0])
            counted: set[frozenset[str]] = set()
            for i, (_, b1, p1) in enumerate(spans):
                for a2, b2, p2 in spans[i + 1 :]:
                    if a2 >= b1:
                        break
                    pair = frozenset((p1.run, p2.run))
                    overlap = min(b1, b2) - a2
                    if p1.run == p2.run or pair in counted or overlap <= margin:
                        continue
                    counted.add(pair)
                    old, new = sorted((p1, p2), key=lambda p: self.run_job.get(p.run, (job, p.slot))[1])
                    old_status = self.runs.get(old.run, {})
                    self._violate(
                        "skip_overlap",
                        f"{job}: {new.name} live beside {old.name} for {overlap:.1f}s "
                        f"(older run {old_status.get('phase')} {old_status.get('message', '')!r}, "
                        f"its Pod ended {old.phase})",
                    )

    def phases(self) -> Counter[str]:
        return Counter(str(s.get("phase")) for s in self.runs.values())

    def takeovers(self) -> int:
        return sum(max(0, max(a for _, a, _ in h) - 1) for h in self.attempts.values() if h)
