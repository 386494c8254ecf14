"""Trigger annotation values: which name a slot, and which are refused (no cluster needed)."""

from __future__ import annotations

import pytest

from anarchon.engine.limits import MAX_SLOT_MS
from anarchon.kube.job.triggers import parse_trigger


@pytest.mark.parametrize(
    ("value", "slot"),
    [
        ("1800000000000", 1_800_000_000_000),
        (" 1800000000000 ", 1_800_000_000_000),
        ("0", 0),
        (str(MAX_SLOT_MS), MAX_SLOT_MS),
        ("2027-01-15T08:00:00Z", 1_800_000_000_000),
        ("2027-01-15T09:00:00+01:00", 1_800_000_000_000),
        ("2027-01-15T08:00:00.250Z", 1_800_000_000_250),
        ("2027-01-15T08:00:00", 1_800_000_000_000),  # no offset: UTC
        ("9999-12-31T23:59:59.999Z", MAX_SLOT_MS),
    ],
)
def test_values_that_name_a_slot(value: str, slot: int) -> None:
    assert parse_trigger(value) == slot


@pytest.mark.parametrize(
    "value",
    [
        "99999999999999999999",  # bigint out of range on PostgreSQL, OverflowError on SQLite
        str(MAX_SLOT_MS + 1),
        str(2**63),
        "9" * 5000,  # int() of it would raise (more than 4300 digits)
        "²",  # passes str.isdigit(), int() raises
        "١٢٣",  # Arabic-Indic digits: int() would accept them
        "-1",
        "1969-12-31T23:59:59Z",
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "soon",  # ("now" is no slot either: a replica writes its time there first)
        "",
        "1e12",
        "12:00",
    ],
)
def test_values_that_are_refused(value: str) -> None:
    assert parse_trigger(value) is None
