"""Placement constraints: which workers a job may run on, judged by the workers' labels.

A job carries constraints (``--constraint`` on the CLI, ``constraints`` in a job file); a
worker carries labels (``stockade agent --label key=value``; the agent adds
``container=docker`` or ``container=none`` itself). A worker is eligible for a job when its
labels satisfy every constraint of the job. Four operators, as Kubernetes' set-based label
selectors ("Labels and Selectors") and Nomad's ``constraint`` blocks spell them:

==================  =================================================
``key=value``       the worker has label ``key`` with that value
``key!=value``      the worker has no label ``key``, or another value
``key``             the worker has label ``key`` (any value)
``key in (a,b)``    the worker has label ``key`` with one of the values
==================  =================================================

Keys and values follow the label syntax of :mod:`runtime.identifiers`, so the text form above
parses without quoting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from runtime.checks import check_text
from runtime.errors import InvalidArgument
from runtime.identifiers import check_label_key, check_label_value
from runtime.settings.fields import str_tuple

OPERATORS = ("=", "!=", "exists", "in")
"""The operators a constraint may use (its ``op``)."""
MAX_CONSTRAINTS = 32
"""Most constraints of one job."""
MAX_IN_VALUES = 64
"""Most values of one ``in`` constraint."""
MAX_CONSTRAINT_BYTES = 4096
"""Longest constraint in its text form, in bytes of UTF-8."""
SYNTAX = "must be key=value, key!=value, key (the label exists) or key in (a,b)"
"""The rule a constraint's text form breaks when it parses as none of the operators."""


_IN = re.compile(r"(?P<key>[^\s=!(),]+)\s+in\s*\((?P<values>[^()]*)\)")


@attrs.frozen(kw_only=True)
class Constraint:
    """One rule a worker's labels must satisfy for a job to be placed on it."""

    key: str
    """The label's key (``[prefix/]name``)."""
    op: str
    """One of :data:`OPERATORS`."""
    values: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    """The value compared (one for ``=`` and ``!=``; one or more for ``in``; none for
    ``exists``)."""

    def check(self, field: str) -> Constraint:
        """This constraint, once its key, operator and values are found well formed.

        Raises (naming ``field``, e.g. ``constraints[2]``):
            InvalidArgument: an unknown operator (``field.op``), a bad key (``field.key``), a
                bad value or a wrong number of them (``field.values``).
        """
        if self.op not in OPERATORS:
            raise InvalidArgument(f"{field}.op", self.op, f"must be one of {', '.join(OPERATORS)}")
        check_text(f"{field}.key", self.key, max_bytes=MAX_CONSTRAINT_BYTES)
        check_label_key(self.key, field=f"{field}.key")
        wanted = {"=": (1, 1), "!=": (1, 1), "exists": (0, 0), "in": (1, MAX_IN_VALUES)}[self.op]
        if not wanted[0] <= len(self.values) <= wanted[1]:
            count = {0: "no values", 1: "exactly one value"}.get(wanted[1], f"1 to {MAX_IN_VALUES} values")
            raise InvalidArgument(
                f"{field}.values", list(self.values), f"must hold {count} for operator {self.op!r}"
            )
        for index, value in enumerate(self.values):
            check_text(f"{field}.values[{index}]", value, max_bytes=MAX_CONSTRAINT_BYTES, allow_empty=True)
            check_label_value(value, field=f"{field}.values[{index}]")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a worker with these labels satisfies this constraint."""
        value = labels.get(self.key)
        match self.op:
            case "=":
                return value == self.values[0]
            case "!=":
                return value != self.values[0]
            case "exists":
                return value is not None
            case "in":
                return value in self.values
        return False

    def describe(self) -> str:
        """The text form: ``gpu=a100``, ``zone!=b``, ``ssd``, ``zone in (a,b)``."""
        match self.op:
            case "exists":
                return self.key
            case "in":
                return f"{self.key} in ({','.join(self.values)})"
            case op:
                return f"{self.key}{op}{self.values[0] if self.values else ''}"


def parse_constraint(text: str, *, field: str = "constraint") -> Constraint:
    """A constraint from its text form (see the module docstring; spaces around the operator
    and inside ``in ( , )`` are allowed), checked.

    Raises:
        InvalidArgument: ``text`` holds a NUL, is empty or too long, parses as no operator, or
            its key or a value breaks the label syntax; the message names ``field`` and the text.
    """
    check_text(field, text, max_bytes=MAX_CONSTRAINT_BYTES)
    stripped = text.strip()
    found = _IN.fullmatch(stripped)
    if found is not None:
        inside = found["values"].strip()
        values = tuple(v.strip() for v in inside.split(",")) if inside else ()
        constraint = Constraint(key=found["key"], op="in", values=values)
    elif "!=" in stripped:
        key, _, value = stripped.partition("!=")
        constraint = Constraint(key=key.strip(), op="!=", values=(value.strip(),))
    elif "=" in stripped:
        key, _, value = stripped.partition("=")
        if value.startswith("="):  # key==value: accepted as =, as Nomad's "==" is
            value = value[1:]
        constraint = Constraint(key=key.strip(), op="=", values=(value.strip(),))
    elif stripped and not any(c.isspace() or c in "!(),<>~" for c in stripped):
        constraint = Constraint(key=stripped, op="exists")
    else:
        raise InvalidArgument(field, text, SYNTAX)
    try:
        return constraint.check(field)
    except InvalidArgument as exc:
        raise InvalidArgument(field, text, f"{SYNTAX}; {exc.field}: {exc.rule}") from None


def check_constraints(
    constraints: Iterable[Constraint], *, field: str = "constraints"
) -> tuple[Constraint, ...]:
    """``constraints`` as a tuple, each checked, at most :data:`MAX_CONSTRAINTS` of them.

    Raises:
        InvalidArgument: too many, or the first bad one (``constraints[i]...``).
    """
    held = tuple(constraints)
    if len(held) > MAX_CONSTRAINTS:
        raise InvalidArgument(field, len(held), f"must have at most {MAX_CONSTRAINTS} constraints")
    for index, constraint in enumerate(held):
        constraint.check(f"{field}[{index}]")
    return held


def satisfied(constraints: Iterable[Constraint], labels: Mapping[str, str]) -> bool:
    """Whether a worker with ``labels`` satisfies every constraint."""
    return all(c.matches(labels) for c in constraints)
