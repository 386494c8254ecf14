"""Missed slots, kept on the job: ``status.missed``, the windows of slots that no run was made for.

A Missed Event fades (an hour, by default); ``anarchon why`` must still be able to say why the
08:00 run did not happen. So each replica that reports missed slots also merges them into the
job's status: one window per stretch of consecutive missed slots with the same reason, the
newest :data:`~.constants.MISSED_WINDOWS_KEPT` only. Replicas that report the same miss (all of
them, for a starting deadline) write the same window, so their writes agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ...engine import Schedule
from ...engine.schedule import slots_between
from ..constants import MISSED_WINDOWS_KEPT
from .spec import ms_of, slot_time

#: The engine's words for a miss, and the reason kept on the job for each (first match wins).
_REASONS = (
    ("past the starting deadline", "StartingDeadline"),
    ("store unreachable", "StoreUnreachable"),
    ("while suspended", "Suspended"),
    ("while no instance ran", "NoReplica"),
    ("slept through", "SleptThrough"),
)


#: Slots counted at most when two windows overlap (a count, not a bound on what is kept).
_COUNT_AT_MOST = 100_000


def reason_of(message: str) -> str:
    """The short reason for an engine's miss report (``Missed`` if it is none of the known ones)."""
    return next((reason for words, reason in _REASONS if words in message), "Missed")


@dataclass(frozen=True)
class Window:
    """Consecutive missed slots ``first_ms`` to ``last_ms`` (``count`` of them), for one reason."""

    first_ms: int
    last_ms: int
    count: int
    reason: str
    message: str

    def record(self) -> dict[str, Any]:
        return {
            "from": slot_time(self.first_ms),
            "to": slot_time(self.last_ms),
            "count": self.count,
            "reason": self.reason,
            "message": self.message[:500],
        }


def window(slots: Sequence[int], message: str) -> Window:
    """The window of ``slots`` (ascending) that the engine reported missed with ``message``."""
    return Window(slots[0], slots[-1], len(slots), reason_of(message), message)


def _required_ms(text: object) -> int:
    ms = ms_of(str(text))
    if ms is None:
        raise ValueError("no time")
    return ms


def from_status(status: Mapping[str, Any]) -> list[Window]:
    """The windows a job's status holds (entries it cannot read are dropped)."""
    windows = []
    for entry in status.get("missed") or []:
        try:
            windows.append(
                Window(
                    _required_ms(entry["from"]),
                    _required_ms(entry["to"]),
                    int(entry.get("count") or 1),
                    str(entry.get("reason") or "Missed"),
                    str(entry.get("message") or ""),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return windows


def merged(windows: Sequence[Window], new: Sequence[Window], schedule: Schedule) -> list[Window]:
    """``windows`` with ``new`` added, oldest first: a window overlapping another of the same
    reason, or following it with no slot between, joins it; the newest MISSED_WINDOWS_KEPT stay.

    Each window is a stretch of consecutive slots (the engine reports no other), so the slots a
    joining window adds are those of the schedule after the stretch it joins.
    """
    out: list[Window] = []
    for w in sorted({*windows, *new}, key=lambda w: (w.reason, w.first_ms, w.last_ms)):
        last = out[-1] if out and out[-1].reason == w.reason else None
        if last is not None and (w.first_ms <= last.last_ms or schedule.next_after(last.last_ms) >= w.first_ms):
            if w.last_ms > last.last_ms:
                beyond = slots_between(schedule, last.last_ms, w.last_ms)
                extra = w.count if w.first_ms > last.last_ms else sum(1 for _ in islice(beyond, _COUNT_AT_MOST))
                out[-1] = Window(last.first_ms, w.last_ms, last.count + extra, w.reason, w.message)
            continue
        out.append(w)
    out.sort(key=lambda w: (w.last_ms, w.first_ms))
    return out[-MISSED_WINDOWS_KEPT:]


def covers(windows: Sequence[Window], new: Sequence[Window]) -> bool:
    """Whether every window of ``new`` lies inside one of ``windows`` with its reason."""
    return all(
        any(w.reason == n.reason and w.first_ms <= n.first_ms and n.last_ms <= w.last_ms for w in windows) for n in new
    )
