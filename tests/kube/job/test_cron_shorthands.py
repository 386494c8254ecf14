"""CronJob's shorthands (``@daily``...) in the engine's schedule and the operator's spec parser, offline.

A job moved over from a CronJob keeps its ``schedule: "@daily"``: the replicas must give it the
slots of the five fields it stands for, on the zone's wall clock, and refuse what CronJob refuses.
"""

from __future__ import annotations

from typing import Any

import pytest

from anarchon.engine.errors import ScheduleError
from anarchon.engine.schedule import MACROS, cron
from anarchon.kube.job.spec import SpecError, parse_job, schedule_column, slot_time

#: 2027-03-26T12:00:00Z, a Friday, two days before Paris springs forward.
AFTER = 1_806_062_400_000


def job(**spec: Any) -> dict[str, Any]:
    template = {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    meta = {"name": "j", "namespace": "default", "uid": "u"}
    return {
        "apiVersion": "anarchon.io/v1alpha1",
        "kind": "AnarchonJob",
        "metadata": meta,
        "spec": {**spec, "template": template},
    }


def slots(schedule: Any, count: int) -> list[str]:
    out, t = [], AFTER
    for _ in range(count):
        t = schedule.next_after(t)
        out.append(slot_time(t))
    return out


@pytest.mark.parametrize(
    ("shorthand", "expected"),
    [
        ("@hourly", ["2027-03-26T13:00:00Z", "2027-03-26T14:00:00Z"]),
        ("@daily", ["2027-03-26T23:00:00Z", "2027-03-27T23:00:00Z", "2027-03-28T22:00:00Z"]),  # Paris midnight
        ("@midnight", ["2027-03-26T23:00:00Z", "2027-03-27T23:00:00Z"]),
        ("@weekly", ["2027-03-27T23:00:00Z", "2027-04-03T22:00:00Z"]),  # Sundays 00:00 in Paris
        ("@monthly", ["2027-03-31T22:00:00Z", "2027-04-30T22:00:00Z"]),
        ("@yearly", ["2027-12-31T23:00:00Z", "2028-12-31T23:00:00Z"]),
        ("@annually", ["2027-12-31T23:00:00Z"]),
    ],
)
def test_a_shorthand_runs_the_slots_of_its_fields(shorthand: str, expected: list[str]) -> None:
    parsed = parse_job(job(cron=shorthand, timeZone="Europe/Paris"))
    assert slots(parsed.schedule, len(expected)) == expected
    assert slots(parsed.schedule, 3) == slots(cron(MACROS[shorthand], "Europe/Paris"), 3)
    assert schedule_column(parsed.schedule) == f"{shorthand} Europe/Paris"  # shown as written


def test_a_shorthand_is_the_same_schedule_as_its_fields() -> None:
    """Rewriting ``0 0 * * *`` as ``@daily`` changes no slot, so it is not a schedule change."""
    assert cron("@daily").fingerprint == cron("0 0 * * *").fingerprint
    assert cron("@daily").fingerprint != cron("@hourly").fingerprint


@pytest.mark.parametrize("value", ["@every 5m", "@fortnightly", "@Daily", "@daily 8"])
def test_other_shorthands_are_refused_in_words(value: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_job(job(cron=value))
    (message,) = refused.value.messages
    assert message.startswith("spec.cron: ") and "or one of @yearly, @annually, @monthly" in message, message
    with pytest.raises(ScheduleError, match="is not"):
        cron(value)
