"""A second, brute-force implementation of cron slots, to check :class:`anarchon.engine.Cron` against.

Obviously correct rather than fast: it walks real time (UTC) one resolution step (a minute,
or a second for 6 fields) at a time, reads the zone's wall clock at each step and applies the
rule of ``anarchon.engine.schedule`` in its plainest words:

* periodic: a slot at every instant whose wall-clock time matches;
* time-of-day: a slot at the first instant the wall clock reaches or passes a matching time
  (the clock passes the times of a skipped hour in one jump, and never passes a repeated time
  again, so the high-water mark of the wall clock decides).

It parses the expression itself (numbers, ``*``, ranges, steps and lists; no names, ``L`` or
``#``) and shares no code with the engine or croniter. Day of month and day of week combine
as in croniter and Vixie cron: if both are restricted, either one may match.

It assumes offsets of whole minutes (true of every zone since 1972), so that the wall-clock
times it reads on the UTC grid are on the wall-clock grid too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

# (lowest, highest) of: second, minute, hour, day of month, month, day of week (7 is Sunday too).
_SECOND, _MINUTE, _HOUR, _DOM, _MONTH, _DOW = (0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_field(text: str, bounds: tuple[int, int]) -> frozenset[int]:
    """The values one cron field matches."""
    lo, hi = bounds
    values: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            first, last = (int(part) for part in base.split("-"))
        else:
            first = int(base)
            last = hi if step_text else first  # croniter: "5/20" is 5, 25, 45
        values.update(range(first, last + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Reference:
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    six: bool
    periodic: bool

    @classmethod
    def parse(cls, expression: str) -> Reference:
        fields = expression.split()
        six = len(fields) == 6
        if not six:
            fields = ["0", *fields]
        second, minute, hour, dom, month, dow = fields
        seconds, minutes = parse_field(second, _SECOND), parse_field(minute, _MINUTE)
        hours = parse_field(hour, _HOUR)
        weekdays = frozenset(d % 7 for d in parse_field(dow, _DOW))
        periodic = len(seconds) > 1 or len(minutes) > 1 or len(hours) == 24 or "/" in hour
        return cls(seconds, minutes, hours, parse_field(dom, _DOM), parse_field(month, _MONTH), weekdays, six, periodic)

    def matches(self, wall: datetime) -> bool:
        if not (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and wall.month in self.months
        ):
            return False
        in_days = wall.day in self.days
        in_weekdays = (wall.weekday() + 1) % 7 in self.weekdays
        if len(self.days) == 31 or len(self.weekdays) == 7:
            return in_days and in_weekdays
        return in_days or in_weekdays

    def slots(self, zone: ZoneInfo, after_ms: int, until_ms: int, *, preroll_ms: int) -> list[int]:
        """The slots in ``(after_ms, until_ms]``; the walk starts ``preroll_ms`` earlier.

        The pre-roll must cover the longest backward clock change just before ``after_ms``:
        a time-of-day job needs to know how far the wall clock had already gone.
        """
        step = 1000 if self.six else 60_000
        unit = timedelta(milliseconds=step)
        high: datetime | None = None
        found: list[int] = []
        for t in range((after_ms - preroll_ms) // step * step, until_ms + 1, step):
            wall = (_EPOCH + timedelta(milliseconds=t)).astimezone(zone).replace(tzinfo=None, fold=0)
            if self.periodic:
                hit = self.matches(wall)
            else:
                hit = high is not None and wall > high and any(self.matches(w) for w in _walk(high + unit, wall, unit))
                high = wall if high is None else max(high, wall)
            if hit and t > after_ms:
                found.append(t)
        return found


def _walk(first: datetime, last: datetime, unit: timedelta) -> Iterator[datetime]:
    while first <= last:
        yield first
        first += unit
