"""A schedule in words, for people who do not read cron: ``at 08:00, Monday to Friday``.

Only the common shapes are put in words (a fixed time or a step of minutes or hours, on every
day, some weekdays, some days of the month or some months); anything else is said as the
expression itself rather than guessed at. The page shows the expression beside the words, and
the time zone apart: the words are on the job's wall clock.
"""

from __future__ import annotations

import re

from ..engine.durations import format_duration
from ..engine.schedule import Cron, Every, Schedule, expand_macro

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_NAMES = {name[:3].lower(): i for i, name in enumerate(_DAYS)} | {
    name[:3].lower(): i + 1 for i, name in enumerate(_MONTHS)
}
_UNITS = (("d", "day"), ("h", "hour"), ("ms", "millisecond"), ("m", "minute"), ("s", "second"))
_PART = re.compile(r"([0-9]+)(ms|d|h|m|s)")
_NUMBER = re.compile(r"[0-9]+|[a-z]{3}")


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _every(schedule: Every) -> str:
    units = dict(_UNITS)
    parts = [_plural(int(n), units[u]) for n, u in _PART.findall(format_duration(schedule.period_ms))]
    return "every " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1])


def _value(text: str) -> int | None:
    text = text.lower()
    if not _NUMBER.fullmatch(text):
        return None
    return int(text) if text.isdigit() else _NAMES.get(text)


def _values(field: str) -> list[tuple[int, int]] | None:
    """A field of values and ranges (``1-5``, ``1,3,5``, ``mon-fri``) as (first, last) pairs; None
    for steps and anything else."""
    out = []
    for item in field.split(","):
        first, _, last = item.partition("-")
        a, b = _value(first), _value(last or first)
        if a is None or b is None:
            return None
        out.append((a, b))
    return out


def _list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _spans(pairs: list[tuple[int, int]], names: tuple[str, ...] | None, base: int = 0) -> str:
    def one(n: int) -> str:
        return names[(n - base) % len(names)] if names else str(n)

    return _list([one(a) if a == b else f"{one(a)} to {one(b)}" for a, b in pairs])


def _time(minute: str, hour: str) -> str | None:
    step = re.fullmatch(r"\*/([0-9]+)", minute)
    if hour == "*" and minute == "*":
        return "every minute"
    if hour == "*" and step:
        return f"every {_plural(int(step.group(1)), 'minute')}"
    minutes = _values(minute)
    if minutes is None or any(a != b for a, b in minutes):
        return None
    hour_step = re.fullmatch(r"(?:\*|0)/([0-9]+)", hour)
    at = _list([f":{a:02d}" for a, _ in minutes])
    if hour == "*":
        return "every hour, on the hour" if minutes == [(0, 0)] else f"every hour at {at}"
    if hour_step:
        return f"every {_plural(int(hour_step.group(1)), 'hour')} at {at}"
    hours = _values(hour)
    if hours is None or any(a != b for a, b in hours):
        return None
    return "at " + _list([f"{h:02d}:{m:02d}" for h, _ in hours for m, _ in minutes])


def _days(day: str, month: str, weekday: str) -> str | None:
    parts = []
    if day != "*":
        days = _values(day)
        if days is None:
            return None
        parts.append(f"on day {_spans(days, None)} of the month")
    if weekday != "*":
        weekdays = _values(weekday)
        if weekdays is None:
            return None
        parts.append(("or " if parts else "") + f"on {_spans(weekdays, _DAYS)}")
    if month != "*":
        months = _values(month)
        if months is None:
            return None
        parts.append(f"in {_spans(months, tuple(_MONTHS), base=1)}")
    return ", ".join(parts) if parts else "every day"


def _cron(expression: str) -> str:
    fields = expand_macro(expression).split()
    if len(fields) == 6:
        if fields[0] != "0":
            return f"cron {expression}"
        fields = fields[1:]
    minute, hour, day, month, weekday = fields
    time, days = _time(minute, hour), _days(day, month, weekday)
    if time is None or days is None:
        return f"cron {expression}"
    if days == "every day" and not time.startswith("at "):
        return time
    return f"{time}, {days}"


def in_words(schedule: Schedule) -> str:
    """``every 2 seconds``, ``at 08:00, Monday to Friday``, or ``cron <expression>`` for the rest."""
    if isinstance(schedule, Every):
        return _every(schedule)
    if isinstance(schedule, Cron):
        return _cron(schedule.expression)
    return str(schedule)
