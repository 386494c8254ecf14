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
from typing import TypeVar

import pytest

from tests.harness.controlplane import REPO
from tests.harness.until import until

T = TypeVar("T")
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

    def checked(self, predicate: Callable[[], T]) -> Callable[[], T]:
        """``predicate`` for :func:`until`, failing at once with its stderr if an instance died."""

        def check() -> T:
            found = predicate()
            if not found:
                for name, proc in self.procs.items():
                    if proc.poll() not in (None, -9, -15, 0):
                        err = (self.out_dir / f"{name}.err").read_text()[-3000:]
                        raise AssertionError(f"{name} exited with {proc.returncode}:\n{err}")
            return found

        return check

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


def _start(
    procs: Procs, what: str, *, timeout: float, slot: str | None = None, attempt: str | None = None
) -> list[str]:
    """The first "start" line (of ``slot``'s ``attempt``, if given) any instance wrote."""

    def starts() -> list[list[str]]:
        return [e for e in procs.lines() if e[0] == "start" and slot in (None, e[1]) and attempt in (None, e[2])]

    return until(what, procs.checked(starts), timeout=timeout, interval=0.05)[0]


def test_thousands_of_slots_no_duplicate_no_loss(procs: Procs) -> None:
    for i in range(3):
        procs.start(f"p{i}", "dup")
    until(
        "3 ready instances",
        procs.checked(lambda: len([e for e in procs.lines() if e[0] == "ready"]) == 3),
        timeout=60,
        interval=0.05,
    )
    until(
        f"{SLOTS} slots",
        procs.checked(lambda: len({e[1] for e in procs.lines() if e[0] == "start"}) >= SLOTS),
        timeout=SLOTS * 0.2 + 120,
        interval=0.05,
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
    first = _start(procs, "attempt 1", timeout=60)
    slot, runner = first[1], first[3]
    os.kill(procs.procs[runner].pid, signal.SIGKILL)
    killed = time.monotonic()
    second = _start(procs, "attempt 2", timeout=30, slot=slot, attempt="2")
    took = time.monotonic() - killed
    assert second[3] != runner
    # lease 2 s + 2 heartbeats of 0.5 s, plus slack for process scheduling on a loaded machine
    assert took <= 2 + 1 + 2, f"takeover took {took:.2f}s"


def test_sigstop_runner_is_fenced_after_sigcont(procs: Procs) -> None:
    for i in range(2):
        procs.start(f"p{i}", "long")
    first = _start(procs, "attempt 1", timeout=60)
    slot, runner = first[1], first[3]
    os.kill(procs.procs[runner].pid, signal.SIGSTOP)
    second = _start(procs, "attempt 2", timeout=30, slot=slot, attempt="2")
    assert second[3] != runner
    time.sleep(1)
    os.kill(procs.procs[runner].pid, signal.SIGCONT)
    ended = until(
        "the woken runner to stop",
        procs.checked(lambda: [e for e in procs.lines(runner) if e[0] == "end" and e[1] == slot and e[2] == "1"]),
        timeout=30,
        interval=0.05,
    )[0]
    assert ended[3] in ("fenced", "lease"), ended  # "lease lost" splits into two words
    # The woken runner never ended the run: attempt 2 does, with "done".
    until(
        "attempt 2 to finish",
        procs.checked(lambda: [e for e in procs.lines(second[3]) if e[0] == "end" and e[1] == slot and e[2] == "2"]),
        timeout=30,
        interval=0.05,
    )
    assert not [e for e in procs.lines(runner) if e[0] == "end" and e[2] == "1" and e[3] == "done"]
