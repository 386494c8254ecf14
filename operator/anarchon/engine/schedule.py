"""Schedules turn a point in time into the next slot: an integer of ms since 1970 (UTC).

Every instance must compute the same slots without talking to the others, so a slot is
derived from the schedule alone, never from when an instance started:

* :class:`Every` uses a grid counted from 1970-01-01T00:00:00Z, so ``every 10s`` fires at
  :00, :10, :20 on every machine.
* :class:`Cron` evaluates a cron expression on the wall clock of a time zone.

Daylight saving time, for :class:`Cron`: the expression is matched against wall-clock
labels. A label that does not exist (the hour skipped when clocks spring forward) has no
slot: that run is skipped. A label that exists twice (the hour repeated when clocks fall
back) has one slot, at its first occurrence. So a daily ``30 2 * * *`` job does not run on
the spring-forward day in Europe/Paris, and runs once on the fall-back day.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from .durations import format_duration, parse_duration
from .errors import ScheduleError


class Schedule(Protocol):
    """What the scheduler needs from a schedule."""

    def next_after(self, t_ms: int) -> int:
        """Return the first slot strictly after ``t_ms``."""
        ...

    @property
    def fingerprint(self) -> str:
        """A stable text that changes when, and only when, the slots change."""
        ...


@dataclass(frozen=True)
class Every:
    """A fixed period on the UTC grid counted from the epoch."""

    period_ms: int

    def __post_init__(self) -> None:
        if self.period_ms <= 0:
            raise ScheduleError(f"every: the period must be positive, got {self.period_ms} ms")

    def next_after(self, t_ms: int) -> int:
        return (t_ms // self.period_ms + 1) * self.period_ms

    @property
    def fingerprint(self) -> str:
        return f"every:{self.period_ms}"

    def __str__(self) -> str:
        return f"every {format_duration(self.period_ms)}"


def _wall_to_utc_ms(wall: datetime, zone: ZoneInfo) -> int | None:
    """Map a naive wall-clock time to its first UTC instant, or None if it does not exist."""
    aware = wall.replace(tzinfo=zone, fold=0)
    back = aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
    if back != wall:
        return None  # skipped by a spring-forward change
    return int(aware.astimezone(UTC).timestamp() * 1000)


@dataclass(frozen=True)
class Cron:
    """A cron expression in a time zone (5 fields, or 6 with seconds first)."""

    expression: str
    tz: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) not in (5, 6):
            raise ScheduleError(
                f"cron: {self.expression!r} has {len(fields)} fields; use 5 (minute hour day month weekday)"
                " or 6 (second first)"
            )
        if not croniter.is_valid(self.expression, second_at_beginning=len(fields) == 6):
            raise ScheduleError(f"cron: {self.expression!r} is not a valid cron expression")
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ScheduleError(f"timeZone: unknown time zone {self.tz!r}") from exc
        object.__setattr__(self, "_zone", zone)

    def _iter_wall(self, start: datetime) -> Iterator[datetime]:
        six = len(self.expression.split()) == 6
        it = croniter(self.expression, start, second_at_beginning=six)
        while True:
            yield it.get_next(datetime)

    def next_after(self, t_ms: int) -> int:
        utc = datetime.fromtimestamp(t_ms / 1000, UTC)
        wall = utc.astimezone(self._zone).replace(tzinfo=None)
        # Start one hour back so that a wall time in a repeated (fall-back) hour whose first
        # occurrence is still ahead of us is not missed; slots <= t_ms are filtered out.
        for candidate in self._iter_wall(wall - timedelta(hours=1, microseconds=1)):
            slot = _wall_to_utc_ms(candidate, self._zone)
            if slot is not None and slot > t_ms:
                return slot
        raise AssertionError("unreachable: croniter iterates forever")  # pragma: no cover

    @property
    def fingerprint(self) -> str:
        return f"cron:{' '.join(self.expression.split())}@{self.tz}"

    def __str__(self) -> str:
        return f"cron {self.expression!r} in {self.tz}"


def every(period: str | int) -> Every:
    """``every("10s")``: a period on the UTC grid (units ms, s, m, h, d)."""
    ms = parse_duration(period, what="every")
    if ms <= 0:
        raise ScheduleError(f"every: the period must be positive, got {period!r}")
    return Every(ms)


def cron(expression: str, tz: str = "UTC") -> Cron:
    """``cron("0 8 * * *", tz="Europe/Paris")``: a cron expression on a zone's wall clock."""
    return Cron(expression, tz)


def slots_between(schedule: Schedule, after_ms: int, until_ms: int) -> Iterator[int]:
    """Yield the slots ``s`` with ``after_ms < s <= until_ms``, oldest first."""
    slot = schedule.next_after(after_ms)
    while slot <= until_ms:
        yield slot
        slot = schedule.next_after(slot)


def schedule_hash(schedule: Schedule) -> str:
    """A short digest of the fingerprint, small enough to store with every run."""
    return hashlib.sha256(schedule.fingerprint.encode()).hexdigest()[:16]
