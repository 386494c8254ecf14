"""The parts of ``anarchon ui`` that need no cluster: schedules in words, the timeline's drawing, the flags."""

from __future__ import annotations

import re

import pytest

from anarchon.cli.records import run_record
from anarchon.cli.ui import loopback
from anarchon.engine.schedule import Cron, every
from anarchon.kube.job.spec import slot_time
from anarchon.ui.timeline import Row, span_of, svg
from anarchon.ui.words import in_words
from tests.harness.cli import one_line_error, run_cli


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        (every("2s"), "every 2 seconds"),
        (every("1h30m"), "every 1 hour and 30 minutes"),
        (Cron("0 8 * * *", "Europe/Paris"), "at 08:00, every day"),
        (Cron("*/5 * * * *"), "every 5 minutes"),
        (Cron("0 8,20 * * mon-fri"), "at 08:00 and 20:00, on Monday to Friday"),
        (Cron("30 2 1 * *"), "at 02:30, on day 1 of the month"),
        (Cron("@hourly"), "every hour, on the hour"),
        (Cron("0 0 * * 7"), "at 00:00, on Sunday"),
        (Cron("0 */2 * * *"), "every 2 hours at :00"),
        (Cron("0 0 1 1 *"), "at 00:00, on day 1 of the month, in January"),
        (Cron("0 0 8 * * *"), "at 08:00, every day"),
        # What it does not put in words is said as it is, never guessed at.
        (Cron("1-5/2 * * * *"), "cron 1-5/2 * * * *"),
        (Cron("30 0 8 * * *"), "cron 30 0 8 * * *"),
    ],
)
def test_a_schedule_in_words(schedule: object, words: str) -> None:
    assert in_words(schedule) == words  # type: ignore[arg-type]


def _run(name: str, slot: int, phase: str, start: int, end: int | None, **status: object) -> dict[str, object]:
    tries = [{"try": 1, "podName": name, "startTime": slot_time(start)}]
    body = {"phase": phase, "tries": tries, "startTime": slot_time(start), **status}
    if end is not None:
        body["finishTime"] = slot_time(end)
    return run_record({"metadata": {"name": name}, "spec": {"job": "j", "slot": slot}, "status": body})


def test_the_timeline_shows_the_late_start_and_stacks_only_overlapping_runs() -> None:
    t = 1_800_000_000_000
    runs = [
        _run("j-1", t, "Succeeded", t + 30_000, t + 60_000),  # started 30 s late
        _run("j-2", t + 60_000, "Failed", t + 61_000, t + 90_000),  # right after: same lane
        _run("j-3", t + 70_000, "Running", t + 71_000, None),  # overlaps j-2: a lane of its own
    ]
    drawing = svg([Row("j", "/jobs/ns/j", "/runs/ns/", runs)], t - 10_000, t + 200_000, now_ms=t + 120_000)
    assert drawing.count('class="run"') == 3
    assert 'href="/runs/ns/j-1"' in drawing and "Pod started +30.0s after the slot" in drawing
    bars = re.findall(r'<rect class="bar ph-(\w+)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)"', drawing)
    ys = {phase: float(y) for phase, _, y, _ in bars}
    assert ys["Succeeded"] == ys["Failed"] < ys["Running"], bars
    # j-1's lead runs from its slot to its bar: 30 s of the 210 s shown, over the drawing's width.
    lead = re.search(r'<line class="lead" x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)"', drawing)
    assert lead and float(lead.group(2)) - float(lead.group(1)) > 100, lead
    # The running run's bar reaches now.
    running = next(b for b in bars if b[0] == "Running")
    assert float(running[3]) > 200, running


def test_all_spans_every_kept_run() -> None:
    t = 1_800_000_000_000
    runs = [_run("j-1", t, "Succeeded", t + 1000, t + 5000), _run("j-2", t + 3_600_000, "Skipped", t, None)]
    start, end = span_of([Row("j", "", "", runs)], now_ms=t + 7_200_000)
    assert start < t and end > t + 3_600_000


def test_loopback_addresses_and_bad_ports() -> None:
    assert all(loopback(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(loopback(a) for a in ("0.0.0.0", "::", "10.1.2.3", "example.org"))
    one_line_error(run_cli("ui", "--port", "70000"), 2, "--port", "expected a port from 0 to 65535")


def test_the_events_kept_are_the_jobs_and_their_runs_pods() -> None:
    from anarchon.ui.model import _our_event, run_of_pod

    def event(kind: str, name: str) -> dict[str, object]:
        return {"involvedObject": {"kind": kind, "name": name}}

    assert _our_event(event("AnarchonJob", "nightly"))
    assert _our_event(event("Pod", "nightly-1800000000")) and _our_event(event("Pod", "nightly-1800000000-r2"))
    assert not _our_event(event("Pod", "web-5d4f8c7b9-x2k4q")) and not _our_event(event("Node", "n-1"))
    assert run_of_pod("nightly-1800000000-r2") == run_of_pod("nightly-1800000000") == "nightly-1800000000"


def test_a_late_page_is_told_what_changed_since_it_was_drawn() -> None:
    from anarchon.ui.model import CHANGES_KEPT, Model

    model = Model(None, ["ns"])  # type: ignore[arg-type] - no watch is started: only its changes
    drawn = model.version
    model.publish({"runs:ns/a", "run:ns/a-1"})
    model.publish({"job:ns/b"})
    assert model.since(drawn) == {"runs:ns/a", "run:ns/a-1", "job:ns/b"}
    assert model.since(drawn + 1) == {"job:ns/b"} and model.since(model.version) == set()
    for i in range(CHANGES_KEPT):
        model.publish({f"job:ns/j{i}"})
    assert model.since(drawn) == {"*"}  # further back than is kept: everything may have changed
    assert model.since(model.version - 1) == {f"job:ns/j{CHANGES_KEPT - 1}"}
