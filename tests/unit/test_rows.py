"""Query rows become fields in one place (actors/rows.py): same-named columns, NULL as the
field's zero, ints and flags, records of parallel arrays; and a batch's log keys are its counts
and ids (runtime/log.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from actors.rows import columns, flags, ints, or_unset, parallel, records
from runtime import log


def test_columns_keep_values_and_names() -> None:
    """The columns asked for come back under their own names, as they are; the others are left out."""
    row = {"id": "w-1", "state": "alive", "other": 1}
    assert columns(row, "id", "state") == {"id": "w-1", "state": "alive"}


def test_null_becomes_the_fields_zero() -> None:
    """A NULL column becomes the zero given; a value passes unchanged."""
    assert or_unset({"a": None, "b": 2.5}, 0.0, "a", "b") == {"a": 0.0, "b": 2.5}


def test_ints_and_flags_convert() -> None:
    """A sum that comes back as a Decimal is an int; a flag is a bool."""
    row = {"used": Decimal(7), "cordoned": 1}
    assert ints(row, "used") == {"used": 7} and type(ints(row, "used")["used"]) is int
    assert flags(row, "cordoned") == {"cordoned": True}


def test_parallel_arrays_become_records() -> None:
    """Parallel arrays under a prefix become one record a position; a NULL array is no records."""
    row = {"v_id": [1, 2], "v_name": ["a", "b"], "w_id": None, "w_name": None}
    assert list(parallel(row, ("id", "name"), prefix="v_")) == [(1, "a"), (2, "b")]
    assert records(row, ("id", "name"), prefix="v_") == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert records(row, ("id", "name"), prefix="w_") == []


def test_parallel_arrays_of_different_lengths_are_refused() -> None:
    """Arrays of different lengths are an error, not a silently shortened list."""
    with pytest.raises(ValueError):
        list(parallel({"id": [1, 2], "name": ["a"]}, ("id", "name")))


def test_counted_gives_each_batch_its_count_and_ids() -> None:
    """Each batch is logged as its count under its name and its ids under name_<ids key>."""
    assert log.counted("job_ids", released=(3, 4), cancelled=[]) == {
        "released": 2,
        "released_job_ids": [3, 4],
        "cancelled": 0,
        "cancelled_job_ids": [],
    }
