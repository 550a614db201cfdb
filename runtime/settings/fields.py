"""What every settings group is built from: the field validators, and a duration as a
PostgreSQL session setting (:func:`session_ms`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter
from typing import Any

import attrs

from runtime import identifiers
from runtime.checks import check_int_between
from runtime.errors import InvalidArgument

DEFAULT_READ_STATEMENT_TIMEOUT_S = 5.0
"""The default of the deciders' ``read_statement_timeout_s`` (placer, reconciler)."""


def str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    """The converter of an attrs field of text items, given any iterable of text. One per item
    type: mypy's attrs plugin cannot type a generic converter."""
    return tuple(values)


def an_id(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    identifiers.check_id(value, field=attribute.name)


def listen_host(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    identifiers.parse_host(value, field=attribute.name)


def advertise_address(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if value:
        identifiers.parse_address(value, field=attribute.name)


def positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(attribute.name, value, "must be a finite number > 0")


def non_negative(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise InvalidArgument(attribute.name, value, "must be a finite number >= 0")


def fraction(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0 < value < 1:
        raise InvalidArgument(attribute.name, value, "must be > 0 and < 1")


def between(low: int, high: int) -> Any:
    """A validator: an int from ``low`` to ``high`` (:func:`runtime.checks.check_int_between`)."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
        check_int_between(attribute.name, value, low, high)

    return check


def up_to_s(high_s: float) -> Any:
    """A validator: a finite number of seconds from 0 to ``high_s``, else "must be a finite
    number >= 0 and <= high_s"."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not (math.isfinite(value) and 0 <= value <= high_s):
            raise InvalidArgument(attribute.name, value, f"must be a finite number >= 0 and <= {high_s:g}")

    return check


def between_s(low_s: float, high_s: float) -> Any:
    """A validator: a finite number of seconds above ``low_s`` and at most ``high_s``, else
    "must be a finite number > low_s and <= high_s"."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not (math.isfinite(value) and low_s < value <= high_s):
            raise InvalidArgument(
                attribute.name, value, f"must be a finite number > {low_s:g} and <= {high_s:g}"
            )

    return check


def integer_between(low: int, high: int) -> Any:
    """A validator: an int (not a bool) from ``low`` to ``high``, else "must be an integer
    between ``low`` and ``high``"."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidArgument(attribute.name, value, f"must be an integer between {low} and {high}")

    return check


def check_not_below(settings: Any, field: str, other: str) -> None:
    """Raises InvalidArgument naming both unless ``settings``' ``field`` is at least its
    ``other`` (dotted paths, as ``attrgetter`` reads them)."""
    value, other_value = attrgetter(field, other)(settings)
    if value < other_value:
        raise InvalidArgument(field, value, f"must be >= {other} = {other_value:g}")


def check_not_above(settings: Any, field: str, other: str, why: str = "") -> None:
    """Raises InvalidArgument naming both unless ``settings``' integer ``field`` is at most its
    ``other``; ``why`` is said after the rule, in parentheses."""
    value, other_value = attrgetter(field, other)(settings)
    if value > other_value:
        rule = f"must be <= {other} = {other_value}"
        raise InvalidArgument(field, value, f"{rule} ({why})" if why else rule)


def session_ms(seconds: float) -> str:
    """A duration as a PostgreSQL session setting's value: whole milliseconds, as text
    (``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``)."""
    return str(int(seconds * 1000))
