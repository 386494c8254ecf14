"""Schedules turn a point in time into the next slot: an integer of ms since 1970 (UTC).

Every instance must compute the same slots without talking to the others, so a slot is
derived from the schedule alone, never from when an instance started:

* :class:`Every` uses a grid counted from 1970-01-01T00:00:00Z, so ``every 10s`` fires at
  :00, :10, :20 on every machine.
* :class:`Cron` evaluates a cron expression on the wall clock of a time zone.

Daylight saving time, for :class:`Cron`, follows Vixie/Debian cron. A cron expression is
either *periodic* or *time-of-day*:

* periodic: its second or minute field matches several values (``*/15 * * * *``,
  ``0,30 9 * * *``), or its hour field is a wildcard or a step (``0 * * * *``,
  ``0 */2 * * *``). It fires whenever the wall clock shows a matching time. When clocks fall
  back it runs through both occurrences of the repeated hour (02:45 CEST, then 02:00,
  02:15 ... CET); when they spring forward the skipped times never show, so nothing fires
  for them. Either way the job keeps its rhythm in real time: ``*/15`` fires every 15
  minutes straight through both changes.
* time-of-day: one second, one minute and specific hours (``30 2 * * *``, ``0 8,20 * * 1-5``).
  Each matching wall-clock time fires once: at its first occurrence when it happens twice
  (fall back), and right after the jump when it does not exist (spring forward: a daily
  ``30 2 * * *`` job in Europe/Paris runs at 03:00 CEST on the last Sunday of March). A
  daily job runs every day, once.

CronJob's shorthands are taken too (:data:`MACROS`): ``@daily`` is ``0 0 * * *`` and so on.

An expression that matches no date at all (``0 0 30 2 *``) is refused when it is parsed,
with a :class:`ScheduleError`; a rare one (``0 0 29 2 *``, once every four years) is fine.

Cost: :meth:`Cron.next_after` asks croniter for a handful of candidate wall-clock times,
whatever the expression; ``tests/engine/test_schedule.py`` bounds the count and
``bench/bench_schedule.py`` prints the time.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

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


#: The Gregorian calendar repeats every 400 years: an expression with no match in that long
#: never matches. croniter's own default (50 years) would refuse rare but possible ones.
_CYCLE_YEARS: Final = 400
_CYCLE: Final = timedelta(days=146_097)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_TINY: Final = timedelta(microseconds=1)
_ONE_VALUE_RANGE: Final = re.compile(r"(?<![0-9A-Za-z])([0-9A-Za-z]+)-\1(?:/[0-9]+)?(?![0-9A-Za-z])", re.IGNORECASE)


#: The shorthands Kubernetes' CronJob accepts (robfig/cron's descriptors, ``@every`` aside:
#: that is ``spec.every``), so a schedule moved over from a CronJob means the same here.
MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def expand_macro(expression: str) -> str:
    """The five fields a shorthand (``@daily``) stands for; any other expression as it is."""
    return MACROS.get(expression.strip(), expression)


def _ms(instant: datetime) -> int:
    """An aware datetime as ms since the epoch, exactly (no float rounding)."""
    return (instant - _EPOCH) // timedelta(milliseconds=1)


@dataclass(frozen=True)
class Cron:
    """A cron expression in a time zone (5 fields, or 6 with seconds first).

    See the module docstring for what happens when clocks change.
    """

    expression: str
    tz: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _six: bool = field(init=False, repr=False, compare=False)
    _periodic: bool = field(init=False, repr=False, compare=False)
    _walker: croniter = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = expand_macro(self.expression).split()
        if self.expression.strip().startswith("@") and self.expression.strip() not in MACROS:
            raise ScheduleError(f"cron: {self.expression!r} is not one of {', '.join(MACROS)}")
        if len(fields) not in (5, 6):
            raise ScheduleError(
                f"cron: {self.expression!r} has {len(fields)} fields; use 5 (minute hour day month weekday)"
                " or 6 (second first)"
            )
        six = len(fields) == 6
        # croniter reads a one-value range (5-5) as a full turn (every minute); cron means 5.
        expression = " ".join(_ONE_VALUE_RANGE.sub(r"\1", f) for f in fields)
        if not croniter.is_valid(expression, second_at_beginning=six):
            raise ScheduleError(f"cron: {self.expression!r} is not a valid cron expression")
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ScheduleError(f"timeZone: unknown time zone {self.tz!r}") from exc
        # croniter's expansion: minute, hour, day, month, weekday[, second]; '*' = every value.
        expanded = croniter.expand(expression, second_at_beginning=six)[0]
        hour_field = fields[2 if six else 1]
        periodic = (six and _several(expanded[5])) or _several(expanded[0]) or expanded[1] == ["*"] or "/" in hour_field
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_six", six)
        object.__setattr__(self, "_periodic", periodic)
        walker = croniter(expression, max_years_between_matches=_CYCLE_YEARS, second_at_beginning=six)
        object.__setattr__(self, "_walker", walker)
        # Refused now rather than when the slot loop asks: the probe raises if no slot comes.
        self._search(time.time_ns() // 1_000_000)

    @property
    def periodic(self) -> bool:
        """True if the job runs through a repeated hour (see the module docstring)."""
        return self._periodic

    def next_after(self, t_ms: int) -> int:
        return _next_after(self, t_ms)

    def _search(self, t_ms: int) -> tuple[int, int]:
        """The first slot after ``t_ms``, and how many candidate times croniter produced for it.

        The count is what a test bounds: the work is a few candidates, never a walk through
        every slot of an hour.
        """
        now = self._local(t_ms)
        wall = now.replace(tzinfo=None, fold=0)
        steps = [0]
        slot = self._scan(wall, t_ms, steps)
        u0, u1 = self._instants(wall)
        if self._periodic and now.fold == 0 and u0 < u1:
            # t is in the first pass of a repeated hour: the second pass, from the start of the
            # repeated times, may hold an earlier slot than the times still ahead on this pass.
            change = self._change(u0, u1)
            repeat_from = self._local(change).replace(tzinfo=None)
            slot = min(slot, self._scan(repeat_from - _TINY, t_ms, steps))
        return slot, steps[0]

    def _scan(self, after: datetime, t_ms: int, steps: list[int]) -> int:
        """The earliest slot after ``t_ms`` among the matching wall-clock times after ``after``.

        Only valid where wall-clock times after ``after`` reach their slots in order, which
        :meth:`_search` arranges.
        """
        limit = after + _CYCLE
        walk = self._walk(after)
        while True:
            try:
                wall: datetime = walk.get_next(datetime)
            except CroniterBadDateError as exc:
                raise ScheduleError(
                    f"cron: {self.expression!r} never fires: no date matches its day-of-month, month and"
                    " day-of-week fields together"
                ) from exc
            steps[0] += 1
            if wall > limit:
                raise ScheduleError(
                    f"cron: {self.expression!r} never fires in {self.tz}: a clock change skips every time it matches"
                )
            u0, u1 = self._instants(wall)
            if u0 < u1:  # repeated: the first occurrence, and the second for a periodic job
                later = [u for u in ((u0, u1) if self._periodic else (u0,)) if u > t_ms]
                if later:
                    return min(later)
            elif u0 > u1:  # skipped: periodic jobs do not fire, time-of-day ones right after the jump
                change = self._change(u1, u0)
                if not self._periodic and change > t_ms:
                    return change
                walk = self._walk(self._local(change).replace(tzinfo=None) - _TINY)
            elif u0 > t_ms:
                return u0

    def _walk(self, after: datetime) -> croniter:
        """The matching wall-clock times after ``after``, in order.

        One croniter per Cron, moved to ``after``: a new one would expand the expression again
        (half the cost of a search). Safe because a search runs to its end without yielding
        to the event loop, and each search moves it before reading it.
        """
        self._walker.set_current(after, force=True)
        return self._walker

    def _local(self, t_ms: int) -> datetime:
        """The instant ``t_ms`` on the zone's wall clock (aware; fold 1 in the second pass of a repeated time)."""
        return (_EPOCH + timedelta(milliseconds=t_ms)).astimezone(self._zone)

    def _instants(self, wall: datetime) -> tuple[int, int]:
        """``wall``'s instants read with fold 0 and fold 1: equal if the time happens once,
        increasing if it happens twice, decreasing if it does not exist (PEP 495)."""
        return _ms(wall.replace(tzinfo=self._zone, fold=0)), _ms(wall.replace(tzinfo=self._zone, fold=1))

    def _offset(self, t_ms: int) -> timedelta | None:
        return self._local(t_ms).utcoffset()

    def _change(self, lo: int, hi: int) -> int:
        """The instant in ``(lo, hi]`` at which the zone's offset changes (one change there)."""
        after = self._offset(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset(mid) == after:
                hi = mid
            else:
                lo = mid
        return hi

    @property
    def fingerprint(self) -> str:
        return f"cron:{' '.join(expand_macro(self.expression).split())}@{self.tz}"

    def __str__(self) -> str:
        return f"cron {self.expression!r} in {self.tz}"


def _several(values: Sequence[object]) -> bool:
    """A croniter field expansion matches more than one value (``['*']`` matches all)."""
    return values == ["*"] or len(values) > 1


def every(period: str | int) -> Every:
    """``every("10s")``: a period on the UTC grid (units ms, s, m, h, d)."""
    ms = parse_duration(period, what="every")
    if ms <= 0:
        raise ScheduleError(f"every: the period must be positive, got {period!r}")
    return Every(ms)


@functools.lru_cache(maxsize=1024)
def cron(expression: str, tz: str = "UTC") -> Cron:
    """``cron("0 8 * * *", tz="Europe/Paris")``: a cron expression on a zone's wall clock.

    Cached: a Cron is immutable, and checking an expression costs croniter's expansion and a
    probe, paid on every event of a job otherwise (each replica's status
    writes wake every replica with the job's body, whose schedule is parsed again).
    """
    return Cron(expression, tz)


@functools.lru_cache(maxsize=4096)
def _next_after(cron: Cron, t_ms: int) -> int:
    """:meth:`Cron.next_after`, computed once for every job of the same expression and zone (equal
    Crons): at an aligned slot every job on ``* * * * *`` asks for the same next slot, and
    croniter's answer is slow (bench/README.md)."""
    return cron._search(t_ms)[0]


def slots_between(schedule: Schedule, after_ms: int, until_ms: int) -> Iterator[int]:
    """Yield the slots ``s`` with ``after_ms < s <= until_ms``, oldest first."""
    slot = schedule.next_after(after_ms)
    while slot <= until_ms:
        yield slot
        slot = schedule.next_after(slot)
