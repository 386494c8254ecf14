"""The windows of missed slots a job's status keeps: merged per reason, counted once, bounded."""

from __future__ import annotations

from anarchon.engine.schedule import every
from anarchon.kube.constants import MISSED_WINDOWS_KEPT
from anarchon.kube.job import missed

TEN_S = every("10s")
T = 1_800_000_000_000


def _window(first: int, last: int, message: str = "3000 ms late, past the starting deadline") -> missed.Window:
    return missed.window(list(range(T + first * 10_000, T + last * 10_000 + 1, 10_000)), message)


def test_reasons_are_named_from_the_engine_words() -> None:
    assert missed.reason_of("5100 ms late, past the starting deadline") == "StartingDeadline"
    assert missed.reason_of("missed while no instance ran: catch-up policy None runs 0 of 3") == "NoReplica"
    assert missed.reason_of("missed while suspended: catch-up policy Latest runs 1 of 9") == "Suspended"
    assert missed.reason_of("store unreachable until the deadline: reset") == "StoreUnreachable"
    assert missed.reason_of("something new") == "Missed"


def test_consecutive_and_overlapping_windows_of_one_reason_join_and_count_each_slot_once() -> None:
    joined = missed.merged([_window(0, 2)], [_window(3, 4), _window(2, 6)], TEN_S)
    assert [(w.first_ms, w.last_ms, w.count) for w in joined] == [(T, T + 60_000, 7)]
    gap = missed.merged([_window(0, 2)], [_window(5, 5)], TEN_S)
    assert [w.count for w in gap] == [3, 1], "a slot between: two windows"
    other = missed.merged([_window(0, 2)], [_window(1, 1, "missed while no instance ran")], TEN_S)
    assert sorted(w.reason for w in other) == ["NoReplica", "StartingDeadline"]
    same = missed.merged([_window(0, 2)], [_window(0, 2)], TEN_S)
    assert [w.count for w in same] == [3], "the same report from every replica is one window"


def test_the_newest_windows_are_kept_and_survive_the_status_round_trip() -> None:
    many = [_window(i * 3, i * 3) for i in range(MISSED_WINDOWS_KEPT + 5)]
    kept = missed.merged([], many, TEN_S)
    assert len(kept) == MISSED_WINDOWS_KEPT and kept[-1] == many[-1] and kept[0] == many[5]
    read = missed.from_status({"missed": [w.record() for w in kept] + [{"from": "garbage"}]})
    assert [(w.first_ms, w.last_ms, w.count, w.reason) for w in read] == [
        (w.first_ms, w.last_ms, w.count, w.reason) for w in kept
    ]
    assert missed.covers(read, many[-3:]) and not missed.covers(read, many[:1])
