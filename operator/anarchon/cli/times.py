"""The next times of a schedule as people read them: on the job's wall clock, clock changes marked.

The slots are the engine's (:meth:`anarchon.engine.schedule.Schedule.next_after`, what every
replica computes), never a second implementation that could disagree with what runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from ..engine.limits import MAX_SLOT_MS
from ..engine.schedule import Cron, Schedule
from ..kube.job.spec import slot_time

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def zone_of(schedule: Schedule) -> str:
    """The zone whose wall clock the schedule follows: a cron's ``timeZone``; ``every`` is a UTC grid."""
    return schedule.tz if isinstance(schedule, Cron) else "UTC"


def _offset(t: datetime) -> str:
    delta = t.utcoffset() or timedelta(0)
    sign, minutes = ("-" if delta < timedelta(0) else "+"), abs(delta) // timedelta(minutes=1)
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def upcoming(schedule: Schedule, after_ms: int, count: int) -> list[dict[str, Any]]:
    """The first ``count`` slots after ``after_ms``, each with its local time and, when the zone's
    offset changed since the time before it (or since ``after_ms`` for the first), the change."""
    zone = ZoneInfo(zone_of(schedule))
    previous = (_EPOCH + timedelta(milliseconds=after_ms)).astimezone(zone)
    out: list[dict[str, Any]] = []
    slot = after_ms
    while len(out) < count:
        slot = schedule.next_after(slot)
        if slot > MAX_SLOT_MS:
            break
        local = (_EPOCH + timedelta(milliseconds=slot)).astimezone(zone)
        change = None
        if local.utcoffset() != previous.utcoffset():
            change = f"{previous.tzname()} ({_offset(previous)}) -> {local.tzname()} ({_offset(local)})"
        out.append(
            {
                "slot": slot,
                "time": slot_time(slot),
                "local": local.isoformat(timespec="milliseconds" if slot % 1000 else "seconds"),
                "zone": local.tzname(),
                "clockChange": change,
            }
        )
        previous = local
    return out


def rows(times: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The table of :func:`upcoming`: local time, zone abbreviation, UTC, and the clock change."""
    headers = ["LOCAL", "ZONE", "UTC", "CLOCK CHANGE"]
    return headers, [[t["local"], t["zone"], t["time"], t["clockChange"] or ""] for t in times]
