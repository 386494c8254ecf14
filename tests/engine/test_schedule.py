"""Schedules and durations: pure functions, no store, no waiting."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from anarchon.engine import ScheduleError, cron, every, format_duration, parse_duration, slots_between


def ms(*args: int, tz: object = UTC) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)  # type: ignore[misc]


def utc(slot: int) -> str:
    return datetime.fromtimestamp(slot / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250ms", 250),
        ("10s", 10_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("1m500ms", 60_500),
        (1500, 1500),
    ],
)
def test_parse_duration(text: str | int, expected: int) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "10", "s", "10x", "-5s", "1.5s", "10 s", "1h 30m", -1, True])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ScheduleError, match="jitter"):
        parse_duration(bad, what="jitter")  # type: ignore[arg-type]


def test_format_duration_round_trips() -> None:
    for value in (250, 10_000, 5_400_000, 90_061_001):
        assert parse_duration(format_duration(value)) == value


def test_every_is_a_utc_grid_from_the_epoch_whatever_the_start() -> None:
    sched = every("10s")
    starts = [ms(2026, 12, 2, 12, 0, 3), ms(2026, 12, 2, 12, 0, 7), ms(2026, 12, 2, 12, 0, 0) + 1]
    assert {sched.next_after(t) for t in starts} == {ms(2026, 12, 2, 12, 0, 10)}
    assert sched.next_after(ms(2026, 12, 2, 12, 0, 10)) == ms(2026, 12, 2, 12, 0, 20)  # strictly after
    assert list(slots_between(sched, ms(2026, 1, 1), ms(2026, 1, 1, 0, 0, 30))) == [
        ms(2026, 1, 1, 0, 0, 10),
        ms(2026, 1, 1, 0, 0, 20),
        ms(2026, 1, 1, 0, 0, 30),
    ]


@pytest.mark.parametrize("bad", ["0s", "0", "abc", "-1m"])
def test_every_rejects(bad: str) -> None:
    with pytest.raises(ScheduleError):
        every(bad)


def test_cron_five_fields_in_a_time_zone() -> None:
    sched = cron("0 8 * * *", "Europe/Paris")
    # 08:00 in Paris is 07:00 UTC in winter and 06:00 UTC in summer.
    assert utc(sched.next_after(ms(2026, 12, 2))) == "2026-12-02T07:00:00"
    assert utc(sched.next_after(ms(2026, 7, 1))) == "2026-07-01T06:00:00"


def test_cron_six_fields_has_seconds_first() -> None:
    sched = cron("*/15 * * * * *")
    assert [utc(s) for s in slots_between(sched, ms(2026, 1, 1), ms(2026, 1, 1, 0, 0, 45))] == [
        "2026-01-01T00:00:15",
        "2026-01-01T00:00:30",
        "2026-01-01T00:00:45",
    ]


def test_cron_spring_forward_slot_is_skipped() -> None:
    # Europe/Paris jumps from 02:00 to 03:00 on 2026-03-29: 02:30 does not exist that day.
    sched = cron("30 2 * * *", "Europe/Paris")
    days = [utc(s)[:10] for s in slots_between(sched, ms(2026, 3, 27), ms(2026, 3, 31))]
    assert days == ["2026-03-27", "2026-03-28", "2026-03-30"]


def test_cron_fall_back_slot_runs_once_at_first_occurrence() -> None:
    # On 2026-10-25 Paris repeats 02:00-03:00; 02:30 happens twice, the slot once (CEST, 00:30 UTC).
    sched = cron("30 2 * * *", "Europe/Paris")
    slots = [utc(s) for s in slots_between(sched, ms(2026, 10, 24), ms(2026, 10, 26))]
    assert slots == ["2026-10-24T00:30:00", "2026-10-25T00:30:00"]


def test_cron_fall_back_repeated_hour_is_not_run_twice() -> None:
    sched = cron("*/30 * * * *", "Europe/Paris")
    slots = list(slots_between(sched, ms(2026, 10, 24, 23, 0), ms(2026, 10, 25, 3, 0)))
    labels = [datetime.fromtimestamp(s / 1000, UTC).astimezone(sched._zone).strftime("%H:%M") for s in slots]
    assert len(labels) == len(set(labels)), labels  # each wall-clock label once
    assert "02:30" in labels


def test_same_slots_on_every_instance_for_cron() -> None:
    sched = cron("0 */6 * * *", "America/New_York")
    a = sched.next_after(ms(2026, 6, 1, 1, 2, 3))
    b = sched.next_after(ms(2026, 6, 1, 3, 59, 59))
    assert a == b


@pytest.mark.parametrize(
    ("expr", "tz", "match"),
    [
        ("0 8 * *", "UTC", "fields"),
        ("61 8 * * *", "UTC", "not a valid"),
        ("0 8 * * *", "Mars/Base", "time zone"),
        ("* * * * * * *", "UTC", "fields"),
    ],
)
def test_cron_rejects(expr: str, tz: str, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        cron(expr, tz)


def test_fingerprint_changes_with_the_slots_only() -> None:
    assert every("10s").fingerprint == every("10000ms").fingerprint
    assert every("10s").fingerprint != every("20s").fingerprint
    assert cron("0 8 * * *", "UTC").fingerprint != cron("0 8 * * *", "Europe/Paris").fingerprint
    assert cron("0  8 * * *").fingerprint == cron("0 8 * * *").fingerprint
