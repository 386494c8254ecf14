"""The fencing token's order and range (docs/workload.md promises both)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from anarchon.engine.limits import MAX_SLOT_MS, MIN_SLOT_MS
from anarchon.kube.run.workload import ATTEMPT_SPAN, fencing_token

slots = st.integers(MIN_SLOT_MS, MAX_SLOT_MS)
attempts = st.integers(1, ATTEMPT_SPAN - 1)


@given(slots, attempts, attempts)
def test_a_later_attempt_of_a_run_has_a_greater_token(slot: int, a: int, b: int) -> None:
    assert (fencing_token(slot, a) < fencing_token(slot, b)) == (a < b)


@given(slots, slots, attempts, attempts)
def test_a_later_slot_has_a_greater_token_whatever_the_attempts(s: int, t: int, a: int, b: int) -> None:
    if s < t:
        assert fencing_token(s, a) < fencing_token(t, b)


def test_every_token_fits_a_signed_64_bit_integer() -> None:
    assert fencing_token(MAX_SLOT_MS, ATTEMPT_SPAN - 1) < 2**63
    assert fencing_token(MIN_SLOT_MS, 1) > 0
