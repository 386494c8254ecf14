"""Parsing of human durations such as ``10s`` or ``1h30m`` into integer milliseconds.

Every time in the engine is an integer number of milliseconds: slots are compared for
equality across machines, and floats would make two instances disagree on a slot.
"""

from __future__ import annotations

import re

from .errors import ScheduleError

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")


def parse_duration(value: str | int | float, *, what: str = "duration") -> int:
    """Return ``value`` in milliseconds.

    Accepts an int (already milliseconds) or a string made of ``<number><unit>`` parts
    with units ms, s, m, h, d (``"1h30m"``, ``"250ms"``). Anything else raises
    :class:`ScheduleError` naming ``what`` so the message points at the bad field.
    """
    if isinstance(value, bool):
        raise ScheduleError(f"{what}: expected a duration like '10s', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ScheduleError(f"{what}: must not be negative, got {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ScheduleError(f"{what}: must be a non-negative number, got {value}")
        return int(value)
    text = str(value).strip().lower()
    if not text:
        raise ScheduleError(f"{what}: empty duration")
    pos = 0
    total = 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += int(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ScheduleError(
            f"{what}: cannot parse {value!r}; use a number with a unit ms, s, m, h or d (e.g. '10s', '1h30m')"
        )
    return total


def format_duration(ms: int) -> str:
    """Render milliseconds back in the shortest unit form, for messages and status."""
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS_MS[unit]
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts)
