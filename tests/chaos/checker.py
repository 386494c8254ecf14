"""The soak's referee: it watches Pods and AnarchonRuns itself and holds the operator to its promises.

It reads the API server directly (never through the fault proxy the replicas use) and keeps
every version of every object it sees, so a run deleted by the history limit is still
judged. The rules, each a count that must end at zero:

* ``two_live_pods``: two Pods of one run (one slot) live at once;
* ``skip_overlap``: two slots of an overlap-Skip job live at once;
* ``lost_slots``: a slot of the schedule without an AnarchonRun;
* ``not_terminal``: a run not final once everything has settled;
* ``phase_mismatch``: Succeeded without a succeeded Pod, Failed without a failed Pod, or a
  succeeded Pod recorded Failed or Interrupted;
* ``given_up_while_live``: a run given up (final Interrupted) while one of its Pods lived.

"Live" is a Pod in Pending or Running without a deletionTimestamp: one whose containers run
or are about to.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FINAL = frozenset({"Succeeded", "Failed", "Skipped"})
LABEL_JOB = "anarchon.io/job"
LABEL_RUN = "anarchon.io/run"
LABEL_SLOT = "anarchon.io/slot"


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


@dataclass
class Checker:
    """Feed it watch events (:meth:`pod`, :meth:`run`); read the verdicts after :meth:`settled`."""

    skip_jobs: frozenset[str] = frozenset()
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    live_pods: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # run -> Pods
    live_slots: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # job -> runs
    pod_phases: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # run -> phases seen
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> last status seen
    run_job: dict[str, tuple[str, int]] = field(default_factory=dict)  # run -> (job, slot)
    attempts: dict[str, list[tuple[float, int, str]]] = field(default_factory=lambda: defaultdict(list))
    pods_seen: set[str] = field(default_factory=set)

    def _violate(self, rule: str, example: str) -> None:
        self.violations[rule] += 1
        if len(self.examples[rule]) < 5:
            self.examples[rule].append(example)

    def pod(self, kind: str, pod: dict[str, Any], at: float | None = None) -> None:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        run, job, name = labels.get(LABEL_RUN), labels.get(LABEL_JOB), meta["name"]
        if not run or not job:
            return
        self.pods_seen.add(name)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        self.pod_phases[run].add(phase)
        if _live(pod, kind == "DELETED"):
            self.live_pods[run].add(name)
            if len(self.live_pods[run]) > 1:
                self._violate("two_live_pods", f"{run}: {sorted(self.live_pods[run])}")
            self.live_slots[job].add(run)
            if job in self.skip_jobs and len(self.live_slots[job]) > 1:
                self._violate("skip_overlap", f"{job}: {sorted(self.live_slots[job])}")
        else:
            self.live_pods[run].discard(name)
            if not self.live_pods[run]:
                self.live_slots[job].discard(run)

    def run(self, kind: str, body: dict[str, Any], at: float | None = None) -> None:
        name = body["metadata"]["name"]
        spec = body.get("spec") or {}
        self.run_job[name] = (str(spec.get("job")), int(spec.get("slot") or 0))
        status = dict(body.get("status") or {})
        before = self.runs.get(name) or {}
        if before and _final(before) and not _final(status) and kind != "DELETED":
            self._violate("final_reopened", f"{name}: {before.get('phase')} -> {status.get('phase')}")
        attempt = int(status.get("attempt") or 0)
        history = self.attempts[name]
        if not history or history[-1][1] != attempt:
            history.append((time.monotonic() if at is None else at, attempt, str(status.get("instance") or "")))
        given_up = str(status.get("message") or "").startswith("gave up")
        if given_up and status.get("finishTime") and self.live_pods.get(name):
            self._violate("given_up_while_live", f"{name}: {status.get('message')} / {sorted(self.live_pods[name])}")
        if kind != "DELETED" or not before:
            self.runs[name] = status

    def running_on(self, instance: str) -> dict[str, int]:
        """The runs an instance runs right now, with their attempt (for hand-over timing)."""
        return {
            name: int(s.get("attempt") or 0)
            for name, s in self.runs.items()
            if s.get("phase") == "Running" and s.get("instance") == instance
        }

    def next_attempt_at(self, run: str, after_attempt: int) -> float | None:
        return next((t for t, a, _ in self.attempts.get(run, []) if a > after_attempt), None)

    def settled(self, expected_slots: Iterable[tuple[str, int]]) -> None:
        """Judge the end state: every expected slot has a run, every run is final and true to its Pods."""
        have = set(self.run_job.values())
        for job, slot in expected_slots:
            if (job, slot) not in have:
                self._violate("lost_slots", f"{job}@{slot}")
        for name, status in self.runs.items():
            phase = status.get("phase")
            pods = self.pod_phases.get(name, set())
            if not _final(status):
                self._violate("not_terminal", f"{name}: {phase} {status.get('message', '')}")
            if phase == "Succeeded" and "Succeeded" not in pods:
                self._violate("phase_mismatch", f"{name}: Succeeded, Pods {sorted(pods)}: {_story(status)}")
            if phase == "Failed" and "Failed" not in pods and "timed out" not in str(status.get("message")):
                self._violate("phase_mismatch", f"{name}: Failed, Pods {sorted(pods)}: {_story(status)}")
            if "Succeeded" in pods and phase in ("Failed", "Interrupted"):
                self._violate("phase_mismatch", f"{name}: {phase} although a Pod succeeded: {_story(status)}")

    def phases(self) -> Counter[str]:
        return Counter(str(s.get("phase")) for s in self.runs.values())

    def takeovers(self) -> int:
        return sum(max(0, max(a for _, a, _ in h) - 1) for h in self.attempts.values() if h)
