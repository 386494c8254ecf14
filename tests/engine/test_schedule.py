"""Schedules and durations: pure functions, no store, no waiting."""

from __future__ import annotations

import functools
import itertools
import tomllib
import zoneinfo
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anarchon.engine import Cron, ScheduleError, cron, every, format_duration, parse_duration, schedule, slots_between

from .cron_reference import Reference


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


# -- impossible and rare expressions --------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    ["0 0 30 2 *", "0 0 31 2 *", "0 0 31 4 *", "0 0 31 9,11 *", "0 0 30,31 2 *", "0 0 0 30 2 *", "0 0 31 2 1#5"],
)
def test_cron_that_matches_no_date_is_refused_when_parsed(expr: str) -> None:
    with pytest.raises(ScheduleError, match=r"never fires: no date matches its day-of-month, month and day-of-week"):
        cron(expr, "Europe/Paris")


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # Once every four years, and eight years apart around 2100 (not a leap year).
        ("0 0 29 2 *", ms(2026, 3, 1), "2028-02-29T00:00:00"),
        ("0 0 29 2 *", ms(2096, 3, 1), "2104-02-29T00:00:00"),
        # The fifth Monday of February: only when February 1 of a leap year is a Monday.
        ("0 0 * 2 1#5", ms(2026, 1, 1), "2044-02-29T00:00:00"),
        # Day of month and day of week both restricted: either may match (Mondays of April).
        ("0 0 31 4 1", ms(2026, 1, 1), "2026-04-06T00:00:00"),
    ],
)
def test_rare_but_possible_cron_is_accepted(expr: str, after: int, expected: str) -> None:
    assert utc(cron(expr).next_after(after)) == expected


def test_cron_whose_every_time_is_skipped_by_a_clock_change_is_refused() -> None:
    # The fifth Sunday of March is the last one, when Paris skips 02:00-03:00: no 02:xx time exists.
    with pytest.raises(ScheduleError, match="never fires in Europe/Paris: a clock change skips every time"):
        cron("*/5 2 * 3 0#5", "Europe/Paris")
    cron("*/5 2 * 3 0#5", "UTC")  # the same expression fires where clocks do not change


def test_legacy_zone_name_resolves_from_the_tzdata_package() -> None:
    """``US/Central`` and friends come with the package, not with the image's /usr/share/zoneinfo."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "tzdata" in pyproject["project"]["dependencies"]  # unconditional, not only on Windows
    saved = zoneinfo.TZPATH
    zoneinfo.reset_tzpath(to=[])  # no system zone files: only the tzdata package remains
    try:
        zone = zoneinfo.ZoneInfo.no_cache("US/Central")
        assert datetime(2026, 1, 15, 12, tzinfo=zone).utcoffset() == timedelta(hours=-6)
        assert utc(cron("0 8 * * *", "US/Central").next_after(ms(2026, 7, 1))) == "2026-07-01T13:00:00"
    finally:
        zoneinfo.reset_tzpath(to=saved)


# -- daylight saving: the rule of Vixie cron -----------------------------------------------------


def local(sched: Cron, slots: Iterable[int]) -> list[str]:
    """Slots as wall-clock times with their UTC offset, in the schedule's zone."""
    zone = ZoneInfo(sched.tz)
    return [datetime.fromtimestamp(s / 1000, UTC).astimezone(zone).strftime("%m-%d %H:%M%z") for s in slots]


def test_periodic_cron_runs_through_both_passes_of_the_repeated_hour() -> None:
    # 2026-10-25, Paris: 03:00 CEST is followed by 02:00 CET. Four slots used to be lost.
    sched = cron("*/15 * * * *", "Europe/Paris")
    slots = list(slots_between(sched, ms(2026, 10, 24, 23, 30), ms(2026, 10, 25, 2, 0)))
    assert local(sched, slots) == [
        "10-25 01:45+0200",
        "10-25 02:00+0200",
        "10-25 02:15+0200",
        "10-25 02:30+0200",
        "10-25 02:45+0200",
        "10-25 02:00+0100",
        "10-25 02:15+0100",
        "10-25 02:30+0100",
        "10-25 02:45+0100",
        "10-25 03:00+0100",
    ]
    assert {b - a for a, b in itertools.pairwise(slots)} == {15 * 60_000}  # its rhythm, in real time


def test_periodic_cron_skips_the_times_that_do_not_exist() -> None:
    sched = cron("*/30 * * * *", "America/New_York")  # 2026-03-08: 02:00 EST becomes 03:00 EDT
    assert local(sched, slots_between(sched, ms(2026, 3, 8, 6, 0), ms(2026, 3, 8, 7, 30))) == [
        "03-08 01:30-0500",
        "03-08 03:00-0400",
        "03-08 03:30-0400",
    ]


def test_hourly_cron_runs_in_both_occurrences_of_the_repeated_hour() -> None:
    sched = cron("0 * * * *", "America/New_York")  # 2026-11-01: 02:00 EDT becomes 01:00 EST
    assert local(sched, slots_between(sched, ms(2026, 11, 1, 4, 30), ms(2026, 11, 1, 7, 0))) == [
        "11-01 01:00-0400",
        "11-01 01:00-0500",
        "11-01 02:00-0500",
    ]


def test_time_of_day_cron_runs_once_at_the_first_occurrence() -> None:
    sched = cron("30 2 * * *", "Europe/Paris")
    assert local(sched, slots_between(sched, ms(2026, 10, 23), ms(2026, 10, 27))) == [
        "10-23 02:30+0200",
        "10-24 02:30+0200",
        "10-25 02:30+0200",  # not again at 02:30+0100
        "10-26 02:30+0100",
    ]


def test_time_of_day_cron_whose_time_is_skipped_runs_right_after_the_jump() -> None:
    sched = cron("30 2 * * *", "Europe/Paris")  # 2026-03-29: 02:00 CET becomes 03:00 CEST
    assert local(sched, slots_between(sched, ms(2026, 3, 27), ms(2026, 3, 31))) == [
        "03-27 02:30+0100",
        "03-28 02:30+0100",
        "03-29 03:00+0200",
        "03-30 02:30+0200",
    ]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "until", "expected"),
    [
        # Lord Howe moves by 30 minutes: 02:00 LHDT (+11) becomes 01:30 LHST (+10:30) on 2026-04-05.
        (
            "*/15 * * * *",
            "Australia/Lord_Howe",
            ms(2026, 4, 4, 14, 30),
            ms(2026, 4, 4, 15, 30),
            ["04-05 01:45+1100", "04-05 01:30+1030", "04-05 01:45+1030", "04-05 02:00+1030"],
        ),
        # ... and 02:00 LHST becomes 02:30 LHDT on 2026-10-04: 02:15 does not exist.
        (
            "15 2 * * *",
            "Australia/Lord_Howe",
            ms(2026, 10, 1),
            ms(2026, 10, 5),
            ["10-02 02:15+1030", "10-03 02:15+1030", "10-04 02:30+1100", "10-05 02:15+1100"],
        ),
        # Santiago changes at midnight: 2026-09-06 00:00 -04 becomes 01:00 -03; a midnight job runs at 01:00.
        (
            "0 0 * * *",
            "America/Santiago",
            ms(2026, 9, 4),
            ms(2026, 9, 8),
            ["09-04 00:00-0400", "09-05 00:00-0400", "09-06 01:00-0300", "09-07 00:00-0300"],
        ),
        # ... and 2026-04-05 00:00 -03 becomes 04-04 23:00 -04: 23:30 happens twice, runs once.
        (
            "30 23 * * *",
            "America/Santiago",
            ms(2026, 4, 3),
            ms(2026, 4, 7),
            ["04-02 23:30-0300", "04-03 23:30-0300", "04-04 23:30-0300", "04-05 23:30-0400"],
        ),
        # Troll (Antarctica) moves by two hours: 2026-03-29 01:00 +00 becomes 03:00 +02.
        (
            "0 1,2 * * *",
            "Antarctica/Troll",
            ms(2026, 3, 28),
            ms(2026, 3, 30),
            ["03-28 01:00+0000", "03-28 02:00+0000", "03-29 03:00+0200", "03-30 01:00+0200", "03-30 02:00+0200"],
        ),
    ],
)
def test_dst_rule_in_other_zones(expr: str, tz: str, after: int, until: int, expected: list[str]) -> None:
    sched = cron(expr, tz)
    assert local(sched, slots_between(sched, after, until)) == expected


def test_which_crons_are_periodic() -> None:
    periodic = ["* * * * *", "*/15 * * * *", "0,30 9 * * *", "0 * * * *", "0 */2 * * *", "0 1-23/2 * * *"]
    periodic += ["0 0-23 * * *", "*/10 0 8 * * *", "0 0 * * * *"]
    time_of_day = ["30 2 * * *", "0 8,20 * * 1-5", "0 9-17 * * *", "15 30 2 * * *", "0 0 29 2 *"]
    assert [cron(e).periodic for e in periodic] == [True] * len(periodic)
    assert [cron(e).periodic for e in time_of_day] == [False] * len(time_of_day)


# -- properties: a second implementation, bounded cost, the DST rule over years ----------------------

ZONES = [
    "UTC",
    "Europe/Paris",
    "Europe/Dublin",  # negative DST: winter is the "summer" offset
    "America/New_York",
    "America/Santiago",  # southern, changes at midnight
    "America/St_Johns",  # -03:30
    "Australia/Lord_Howe",  # 30-minute changes
    "Pacific/Chatham",  # +12:45 / +13:45
    "Antarctica/Troll",  # 2-hour changes
    "Africa/Casablanca",  # four changes a year (Ramadan)
    "Asia/Kolkata",
    "US/Central",
]
#: Whole years of zone rules the properties look at.
YEARS = (1996, 2040)
#: Enough to cover every backward change of the zones above (Troll: 2 hours).
PREROLL_MS = 3 * 3_600_000
#: Most croniter steps one next_after may take, whatever the expression, zone and instant.
MAX_STEPS = 4


def transitions(zone: ZoneInfo, year: int) -> list[int]:
    """The instants (ms) at which ``zone`` changes its UTC offset during ``year``: sampled daily, then bisected."""
    found = []
    start = int(datetime(year, 1, 1, tzinfo=UTC).timestamp()) * 1000
    end = int(datetime(year + 1, 1, 1, tzinfo=UTC).timestamp()) * 1000

    def offset(t: int) -> timedelta | None:
        return datetime.fromtimestamp(t / 1000, UTC).astimezone(zone).utcoffset()

    for lo in range(start, end, 86_400_000):
        hi = lo + 86_400_000
        if offset(lo) != offset(hi):
            while hi - lo > 1000:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if offset(mid) != offset(lo) else (mid, hi)
            found.append(hi)
    return found


@functools.cache
def zone_transitions(tz: str, year: int) -> list[int]:
    return transitions(ZoneInfo(tz), year)


def field(values: st.SearchStrategy[int], lo: int, hi: int) -> st.SearchStrategy[str]:
    """One cron field: ``*``, ``*/s``, ``n``, ``a-b``, ``a-b/s``, ``n/s``, or a list of them."""
    step = st.integers(1, max(1, (hi - lo) // 2))
    bounds = st.tuples(values, values).map(sorted)
    item = st.one_of(
        st.just("*"),
        step.map(lambda s: f"*/{s}"),
        values.map(str),
        bounds.map(lambda b: f"{b[0]}-{b[1]}"),
        st.tuples(bounds, step).map(lambda bs: f"{bs[0][0]}-{bs[0][1]}/{bs[1]}"),
        st.tuples(values, step).map(lambda vs: f"{vs[0]}/{vs[1]}"),
    )
    return st.one_of(item, st.lists(item, min_size=2, max_size=3).map(",".join))


def expressions(six: bool) -> st.SearchStrategy[str]:
    parts = [
        field(st.integers(0, 59), 0, 59),
        field(st.integers(0, 23), 0, 23),
        # Days up to 28: the properties want slots in a window, not months without a match.
        st.one_of(st.just("*"), field(st.integers(1, 28), 1, 28)),
        st.one_of(st.just("*"), field(st.integers(1, 12), 1, 12)),
        st.one_of(st.just("*"), field(st.integers(0, 6), 0, 6)),
    ]
    if six:
        parts.insert(0, field(st.integers(0, 59), 0, 59))
    return st.tuples(*parts).map(" ".join)


@st.composite
def windows(draw: st.DrawFn, span_ms: int) -> tuple[str, int, int]:
    """A zone and a window ``(after, until]`` of at most ``span_ms``: half of them around a clock change."""
    tz = draw(st.sampled_from(ZONES))
    year = draw(st.integers(*YEARS))
    changes = zone_transitions(tz, year)
    if changes and draw(st.booleans()):
        center = draw(st.sampled_from(changes))
    else:
        center = int(datetime(year, 1, 1, tzinfo=UTC).timestamp() * 1000) + draw(st.integers(0, 364 * 86_400_000))
    after = center + draw(st.integers(-span_ms, span_ms // 4))
    return tz, after, after + draw(st.integers(1, span_ms))


#: Deterministic (the same examples on every run), no database, no per-example deadline.
PROPERTIES = settings(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_against_reference(expr: str, tz: str, after: int, until: int) -> None:
    sched = cron(expr, tz)
    ref = Reference.parse(expr)
    assert sched.periodic == ref.periodic, expr
    expected = ref.slots(ZoneInfo(tz), after, until, preroll_ms=PREROLL_MS)
    got = list(slots_between(sched, after, until))
    assert got == expected, (expr, tz, local(sched, got), local(sched, expected))
    for t in [after, *got]:
        assert sched._search(t)[1] <= MAX_STEPS, (expr, tz, t)


@settings(PROPERTIES, max_examples=150)
@given(expressions(six=False), windows(span_ms=2 * 86_400_000))
def test_five_field_cron_agrees_with_the_brute_force_reference(expr: str, window: tuple[str, int, int]) -> None:
    check_against_reference(expr, *window)


@settings(PROPERTIES, max_examples=40)
@given(expressions(six=True), windows(span_ms=2 * 3_600_000))
def test_six_field_cron_agrees_with_the_brute_force_reference(expr: str, window: tuple[str, int, int]) -> None:
    check_against_reference(expr, *window)


@settings(PROPERTIES, max_examples=100)
@given(
    st.one_of(expressions(six=False), expressions(six=True)),
    st.sampled_from(ZONES),
    st.integers(int(datetime(YEARS[0], 1, 1, tzinfo=UTC).timestamp() * 1000), 2_000_000_000_000),
)
def test_slots_strictly_increase(expr: str, tz: str, start: int) -> None:
    sched = cron(expr, tz)
    slots = [start]
    for _ in range(20):
        slots.append(sched.next_after(slots[-1]))
    assert all(a < b for a, b in itertools.pairwise(slots))


#: One expression per class of cost: every second ... once in four years, rarer still, and DST-bound.
COST_CLASSES = [
    "* * * * * *",
    "*/7 * * * * *",
    "30 * * * * *",
    "* * * * *",
    "*/15 * * * *",
    "0 * * * *",
    "0 */2 * * *",
    "30 2 * * *",
    "0 8,20 * * 1-5",
    "0 9 * * 1",
    "0 0 1 * *",
    "0 0 L * *",
    "0 0 1 1 *",
    "0 0 29 2 *",
    "0 0 * 2 1#5",
    "*/5 2 * * 0",
    "59 23 31 12 *",
]


@settings(PROPERTIES, max_examples=300)
@given(st.sampled_from(COST_CLASSES), windows(span_ms=3 * 3_600_000))
def test_next_after_takes_a_bounded_number_of_steps_for_every_class(expr: str, window: tuple[str, int, int]) -> None:
    tz, after, until = window
    sched = cron(expr, tz)
    for t in range(after, until, max(1, (until - after) // 20)):
        slot, steps = sched._search(t)
        assert slot > t
        assert steps <= MAX_STEPS, (expr, tz, t, steps)


@pytest.mark.parametrize("tz", [z for z in ZONES if z not in ("UTC", "Asia/Kolkata", "Africa/Casablanca")])
def test_dst_rule_holds_every_year(tz: str) -> None:
    """Across every clock change of 1996-2040: ``*/15`` keeps 15 real minutes between slots (the changes
    here are multiples of 15 minutes), and a daily time-of-day job runs exactly once each local day."""
    zone = ZoneInfo(tz)
    quarter = cron("*/15 * * * *", tz)
    for year in range(YEARS[0], YEARS[1] + 1):
        for change in zone_transitions(tz, year):
            slots = list(slots_between(quarter, change - 3 * 3_600_000, change + 3 * 3_600_000))
            assert {b - a for a, b in itertools.pairwise(slots)} == {15 * 60_000}, (tz, local(quarter, slots))
            before, after = (datetime.fromtimestamp(t / 1000, UTC).astimezone(zone) for t in (change - 1, change))
            middle = {after.date() + timedelta(days=d) for d in (-1, 0, 1)}
            # The times of day near the change: the others are not affected by it.
            for hour in {(h + d) % 24 for h in (before.hour, after.hour) for d in (-1, 0, 1)}:
                for minute in (0, 15, 30, 45):
                    daily = cron(f"{minute} {hour} * * *", tz)
                    around = list(slots_between(daily, change - 3 * 86_400_000, change + 3 * 86_400_000))
                    days = Counter(datetime.fromtimestamp(s / 1000, UTC).astimezone(zone).date() for s in around)
                    assert set(days.values()) == {1} and middle <= days.keys(), (tz, daily, local(daily, around))


def test_one_value_range_means_that_value() -> None:
    """croniter alone reads ``1-1`` as a full turn (every day); the reference found it."""
    assert utc(cron("0 9 * * 1-1").next_after(ms(2026, 12, 1))) == "2026-12-07T09:00:00"  # a Monday
    # Also after a skipped hour: 02:xx does not exist on 2026-03-29 in Paris, the next is a day later.
    sched = cron("*/30 2-2 * * *", "Europe/Paris")
    assert local(sched, [sched.next_after(ms(2026, 3, 29))]) == ["03-30 02:00+0200"]


def test_jobs_of_the_same_cron_and_zone_compute_each_next_slot_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """At an aligned slot 1,000 jobs on ``* * * * *`` each asked croniter for the same next slot
    (4 % of a replica's CPU): equal Crons now share one answer; another zone is another answer."""
    searched: Counter[str] = Counter()
    search = Cron._search

    def counted(self: Cron, t_ms: int) -> tuple[int, int]:
        searched[self.tz] += 1
        return search(self, t_ms)

    jobs = [Cron("* * * * *") for _ in range(1000)] + [Cron("* * * * *", "Asia/Kolkata")]
    monkeypatch.setattr(Cron, "_search", counted)
    schedule._next_after.cache_clear()
    t = 1_796_545_200_123
    assert {cron.next_after(t) for cron in jobs[:-1]} == {1_796_545_260_000}
    assert jobs[-1].next_after(t) == 1_796_545_260_000
    assert searched == {"UTC": 1, "Asia/Kolkata": 1}, searched
