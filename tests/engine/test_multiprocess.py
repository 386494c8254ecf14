"""Instances as separate OS processes on one real store: duplicates, SIGKILL, SIGSTOP.

Real time here, because real processes and signals are what is under test; bounds are
generous for a loaded 2-core machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLOTS = int(os.environ.get("ANARCHON_MP_SLOTS", "1200"))
pytestmark = pytest.mark.slow


class Procs:
    def __init__(self, store: str, job: str, out_dir: Path) -> None:
        self.store, self.job, self.out_dir = store, job, out_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, mode: str) -> None:
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'operator'}:{REPO}"}
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.engine.mp_worker",
                "--store",
                self.store,
                "--instance",
                name,
                "--job",
                self.job,
                "--out",
                str(self.out_dir / f"{name}.out"),
                "--mode",
                mode,
            ],
            cwd=REPO,
            env=env,
            stderr=open(self.out_dir / f"{name}.err", "wb"),  # noqa: SIM115
        )

    def lines(self, name: str | None = None) -> list[list[str]]:
        names = [name] if name else list(self.procs)
        out = []
        for n in names:
            path = self.out_dir / f"{n}.out"
            if path.exists():
                out += [line.split() for line in path.read_text().splitlines() if line.strip()]
        return out

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            for name, proc in self.procs.items():
                if proc.poll() not in (None, -9, -15, 0):
                    err = (self.out_dir / f"{name}.err").read_text()[-3000:]
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n{err}")
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def procs(lease_store_url: str, job_name: str, tmp_path: Path) -> Iterator[Procs]:
    p = Procs(lease_store_url, job_name, tmp_path)
    yield p
    p.stop()


def test_thousands_of_slots_no_duplicate_no_loss(procs: Procs) -> None:
    for i in range(3):
        procs.start(f"p{i}", "dup")
    procs.wait_for(lambda: len([e for e in procs.lines() if e[0] == "ready"]) == 3, 60, "3 ready instances")
    procs.wait_for(
        lambda: len({e[1] for e in procs.lines() if e[0] == "start"}) >= SLOTS, SLOTS * 0.2 + 120, f"{SLOTS} slots"
    )
    procs.stop()
    starts = [e for e in procs.lines() if e[0] == "start"]
    counts = Counter(e[1] for e in starts)
    dups = {s: c for s, c in counts.items() if c > 1}
    assert not dups, f"duplicate winners: {[e for e in starts if e[1] in dups][:10]}"
    by_job: dict[str, list[int]] = {}
    for key in counts:
        job, slot = key.rsplit("@", 1)
        by_job.setdefault(job, []).append(int(slot))
    assert len(by_job) == 50, sorted(by_job)
    # No slot lost between a job's first and last one run (every instance was up throughout).
    missing = [
        (job, slot)
        for job, slots in by_job.items()
        for slot in sorted(set(range(min(slots), max(slots) + 1, 1000)) - set(slots))
    ]
    assert not missing, f"{len(missing)} slots lost, e.g. {missing[:5]}"
    by_instance = Counter(e[3] for e in starts)
    assert len(by_instance) == 3, by_instance


def test_sigkill_of_runner_backup_takes_attempt_2(procs: Procs) -> None:
    for i in range(3):
        procs.start(f"p{i}", "long")
    first = procs.wait_for(lambda: [e for e in procs.lines() if e[0] == "start"], 60, "attempt 1")[0]  # type: ignore[index]
    slot, runner = first[1], first[3]
    os.kill(procs.procs[runner].pid, signal.SIGKILL)
    killed = time.monotonic()
    second = procs.wait_for(
        lambda: [e for e in procs.lines() if e[0] == "start" and e[1] == slot and e[2] == "2"], 30, "attempt 2"
    )[0]  # type: ignore[index]
    took = time.monotonic() - killed
    assert second[3] != runner
    # lease 2 s + 2 heartbeats of 0.5 s, plus slack for process scheduling on a loaded machine
    assert took <= 2 + 1 + 2, f"takeover took {took:.2f}s"


def test_sigstop_runner_is_fenced_after_sigcont(procs: Procs) -> None:
    for i in range(2):
        procs.start(f"p{i}", "long")
    first = procs.wait_for(lambda: [e for e in procs.lines() if e[0] == "start"], 60, "attempt 1")[0]  # type: ignore[index]
    slot, runner = first[1], first[3]
    os.kill(procs.procs[runner].pid, signal.SIGSTOP)
    second = procs.wait_for(
        lambda: [e for e in procs.lines() if e[0] == "start" and e[1] == slot and e[2] == "2"], 30, "attempt 2"
    )[0]  # type: ignore[index]
    assert second[3] != runner
    time.sleep(1)
    os.kill(procs.procs[runner].pid, signal.SIGCONT)
    ended = procs.wait_for(
        lambda: [e for e in procs.lines(runner) if e[0] == "end" and e[1] == slot and e[2] == "1"],
        30,
        "the woken runner to stop",
    )[0]  # type: ignore[index]
    assert ended[3] in ("fenced", "lease"), ended  # "lease lost" splits into two words
    # The woken runner never ended the run: attempt 2 does, with "done".
    procs.wait_for(
        lambda: [e for e in procs.lines(second[3]) if e[0] == "end" and e[1] == slot and e[2] == "2"],
        30,
        "attempt 2 to finish",
    )
    assert not [e for e in procs.lines(runner) if e[0] == "end" and e[2] == "1" and e[3] == "done"]
