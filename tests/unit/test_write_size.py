"""A decider's fenced-write size: halved after a write the server cancelled, an eighth of the
ceiling added after each that went through, always between 1 and the ceiling."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.write_size import WriteSize
from runtime.errors import InvalidArgument


@given(st.integers(1, 10_000), st.lists(st.booleans(), max_size=60))
def test_the_size_stays_between_one_and_the_ceiling(most: int, outcomes: list[bool]) -> None:
    """Whatever the sequence of cancelled and successful writes, rows stays in [1, most]; a
    cancel halves it (rounding down, never below 1), a success adds max(1, most // 8) up to
    most."""
    size = WriteSize.full(most)
    for cancelled in outcomes:
        after = size.after_cancel() if cancelled else size.after_success()
        expected = max(1, size.rows // 2) if cancelled else min(most, size.rows + max(1, most // 8))
        assert after.rows == expected and 1 <= after.rows <= most
        size = after


def test_a_slow_database_gets_smaller_writes_and_a_fast_one_full_ones_again() -> None:
    """From 500 rows: two cancels give 125; then eight successes climb back by 62 rows each to
    the ceiling."""
    size = WriteSize.full(500).after_cancel().after_cancel()
    assert size.rows == 125
    climb = []
    for _ in range(8):
        size = size.after_success()
        climb.append(size.rows)
    assert climb == [187, 249, 311, 373, 435, 497, 500, 500]


def test_a_size_outside_its_bounds_is_refused() -> None:
    """0 rows, or more than the ceiling, is not a size."""
    with pytest.raises(InvalidArgument, match="rows must be between 1 and most = 5, got 6"):
        WriteSize(6, 5)
    with pytest.raises(InvalidArgument, match="most must be >= 1, got 0"):
        WriteSize.full(0)
