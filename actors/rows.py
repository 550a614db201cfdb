"""Rows of the control plane's queries as the fields of what is built from them: the columns a
value or a reply takes under the same names, each kind of column converted in one place."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any


def columns(row: Any, *names: str) -> dict[str, Any]:
    """``row``'s columns ``names`` as the fields of the same names, as they are."""
    return {name: row[name] for name in names}


def or_unset(row: Any, unset: object, *names: str) -> dict[str, Any]:
    """``row``'s columns ``names`` as the fields of the same names, NULL as ``unset`` (the
    field's zero: protobuf has no null)."""
    return {name: row[name] or unset for name in names}


def ints(row: Any, *names: str) -> dict[str, Any]:
    """``row``'s columns ``names`` as ints (a sum or a count may come back as a Decimal)."""
    return {name: int(row[name]) for name in names}


def flags(row: Any, *names: str) -> dict[str, Any]:
    """``row``'s columns ``names`` as bools."""
    return {name: bool(row[name]) for name in names}


def parallel(row: Any, names: Sequence[str], *, prefix: str = "") -> Iterator[tuple[Any, ...]]:
    """The records of ``row``'s parallel arrays ``<prefix><name>`` (one array a column, NULL
    for none), one tuple a record in ``names`` order.

    Raises:
        ValueError: the arrays are not all of one length.
    """
    return zip(*(row[prefix + name] or () for name in names), strict=True)


def records(row: Any, names: Sequence[str], *, prefix: str = "") -> list[dict[str, Any]]:
    """:func:`parallel`'s records as dicts keyed by ``names``."""
    return [dict(zip(names, values, strict=True)) for values in parallel(row, names, prefix=prefix)]
