"""How a reply's message becomes a client result (:mod:`ops.client.results`): each field of the
result's attrs class is read from the message's field of the same name, with a value the wire
sends as zero or empty for "none" read as None where the field's type allows None."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs

R = TypeVar("R")


def ints(value: Iterable[int]) -> tuple[int, ...]:
    """A repeated integer field as a tuple."""
    return tuple(int(item) for item in value)


def _none_if_zero(value: float) -> float | None:
    return float(value) if value else None


_FROM_WIRE: dict[str, Callable[[Any], Any]] = {  # zero or empty is None where None may be
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "bytes": bytes,
    "int | None": lambda value: int(value) or None,
    "float | None": _none_if_zero,
    "str | None": lambda value: value or None,
    "tuple[int, ...]": ints,
}
"""How a field of each annotated type is read from the wire (the annotation as written)."""


def from_pb(cls: type[R], message: Any, **given: Any) -> R:
    """``cls`` (an attrs class) from ``message``'s fields of the same names, read as
    :data:`_FROM_WIRE` says for each field's annotation, but those in ``given``.

    Raises:
        KeyError: a field not ``given`` has an annotation :data:`_FROM_WIRE` does not read.
    """
    fields = attrs.fields(cls)  # type: ignore[arg-type]
    read = {f.name: _FROM_WIRE[f.type](getattr(message, f.name)) for f in fields if f.name not in given}
    return cls(**read, **given)


def exit_code(message: Any) -> int | None:
    """A message's exit code; None when it has none (``has_exit_code`` false)."""
    return int(message.exit_code) if message.has_exit_code else None


def units(held: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``ResourceUnits`` messages as (name, unit ids) pairs, sorted by name."""
    return tuple(sorted((u.name, tuple(u.units)) for u in held))
