"""Plain option values without pydantic, a start-up saving for every ``stockade`` call:
:func:`install` gives Typer a coercion of its own for ``bool``, ``str``, ``int``, ``float`` and
``list[str]`` options, refusing in the project's one style. docs/design.md, "Plain option values".
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

from runtime.errors import InvalidArgument

__all__ = ["install", "installed", "param_field", "plain_converter", "plain_rule"]

_BOOL_MESSAGE = "Input should be a valid boolean, unable to interpret input"
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
"""The words pydantic reads as booleans (any case)."""
_INT_MESSAGE = "Input should be a valid integer, unable to parse string as an integer"
_FLOAT_MESSAGE = "Input should be a valid number, unable to parse string as a number"
_FINITE_MESSAGE = "Input should be a finite number"
_STR_LIST = list[str]


def _text(value: Any) -> str:
    """What Typer makes of a value for a ``str`` option (bytes decoded as the command line is)."""
    if isinstance(value, bytes):
        return value.decode(sys.getfilesystemencoding(), "surrogateescape")
    return str(value)


def _boolean(value: Any) -> bool:
    """A ``bool`` option's value: a flag's own, or a word such as ``yes`` or ``0`` from an
    environment variable (empty: false)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    word = _text(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE or not word:
        return False
    raise ValueError(_BOOL_MESSAGE)


def _integer(value: Any) -> int:
    """An ``int`` option's value: a whole number, also written with a ``.0`` (as pydantic
    takes it), in ASCII digits."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError("Input should be a valid integer, got a number with a fractional part")
    text = _text(value).strip()
    whole, point, zeros = text.partition(".")
    if point and zeros and not zeros.strip("0"):
        text = whole
    try:
        if not text.isascii():
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise ValueError(_INT_MESSAGE) from None


def _number(value: Any) -> float:
    """A ``float`` option's value, a finite one: ``inf``, ``nan`` and ``1e400`` are refused."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        text = _text(value).strip()
        try:
            if not text.isascii():
                raise ValueError(text)
            number = float(text)
        except ValueError:
            raise ValueError(_FLOAT_MESSAGE) from None
    if not math.isfinite(number):
        raise ValueError(_FINITE_MESSAGE)
    return number


def _bounded(convert: Callable[[Any], Any], low: Any, high: Any) -> Callable[[Any], Any]:
    """``convert``, then the bounds checked as pydantic checks them: the upper one first, and
    written as "not <=" so that NaN is refused."""

    def checked(value: Any) -> Any:
        number = convert(value)
        if high is not None and not number <= high:
            raise ValueError(f"Input should be less than or equal to {high}")
        if low is not None and not number >= low:
            raise ValueError(f"Input should be greater than or equal to {low}")
        return number

    return checked


def _unbounded(annotation: Any, parameter_info: Any) -> Callable[[Any], Any] | None:
    """The reading of a plain option before its bounds are checked, else None."""
    if getattr(parameter_info, "parser", None) is not None or getattr(parameter_info, "clamp", False):
        return None
    low, high = getattr(parameter_info, "min", None), getattr(parameter_info, "max", None)
    if annotation is int:
        return _integer
    if annotation is float:
        return _number
    if low is not None or high is not None:
        return None
    if annotation is str:
        return _text
    if annotation is bool:
        return _boolean
    if annotation == _STR_LIST:
        return lambda values: [_text(v) for v in values]
    return None


def plain_converter(annotation: Any, parameter_info: Any) -> Callable[[Any], Any] | None:
    """The conversion of an option of ``annotation`` with Typer's ``parameter_info`` when it is
    a plain one (see the module docstring), else None (Typer's own is used)."""
    read = _unbounded(annotation, parameter_info)
    if read is None or annotation not in (int, float):
        return read
    return _bounded(read, parameter_info.min, parameter_info.max)


def _bound(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def plain_rule(annotation: Any, parameter_info: Any, *, finite: bool = False) -> str:
    """What a plain option of ``annotation`` takes, as a refusal states it: ``must be an
    integer between 0 and 10000``, ``must be a (finite) number >= 0.01``."""
    kind = {int: "an integer", float: "a finite number" if finite else "a number"}.get(annotation)
    if kind is None:
        return "must be true or false (yes, no, on, off, 1, 0)" if annotation is bool else "must be text"
    low, high = getattr(parameter_info, "min", None), getattr(parameter_info, "max", None)
    if low is not None and high is not None:
        return f"must be {kind} between {_bound(low)} and {_bound(high)}"
    if low is not None:
        return f"must be {kind} >= {_bound(low)}"
    if high is not None:
        return f"must be {kind} <= {_bound(high)}"
    return f"must be {kind}"


def param_field(param: Any) -> str:
    """How a refusal names a command-line parameter: an option by its long name (``--limit``),
    an argument by its name (``job_id``)."""
    if getattr(param, "param_type_name", "") == "option" and param.opts:
        return str(max(param.opts, key=len))
    return str(getattr(param, "name", None) or "value")


_installed = False


def installed() -> bool:
    """Whether :func:`install` found Typer's internals and replaced the plain coercions."""
    return _installed


def install() -> None:
    """Have Typer convert plain options with :func:`plain_converter` (idempotent)."""
    global _installed
    if _installed:
        return
    try:
        import dataclasses

        from typer import core
        from typer._click.exceptions import BadParameter
        from typer._coercion import RuntimeParam
    except ImportError:
        return
    typer_build = getattr(core, "build_runtime_param", None)
    if typer_build is None or not dataclasses.is_dataclass(RuntimeParam):
        return

    @dataclasses.dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):  # type: ignore[misc, valid-type]
        """Typer's coercion contract, for one plain option."""

        convert: Callable[[Any], Any] = dataclasses.field(default=_text)
        read: Callable[[Any], Any] = dataclasses.field(default=_text)
        rule: str = ""
        finite_rule: str = ""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return self.convert(value)
            except ValueError as exc:
                try:
                    shown = self.read(value)  # a number out of range is shown as the number
                except ValueError:
                    shown = _text(value)  # as typed: 1e400, not the inf it overflows to
                rule = self.finite_rule if str(exc) == _FINITE_MESSAGE else self.rule
                refused = InvalidArgument(param_field(param), shown, rule)
                raise BadParameter(str(refused), ctx=ctx, param=param) from refused

    def build_runtime_param(descriptor: Any) -> Any:
        annotation, info = descriptor.annotation, descriptor.parameter_info
        convert, read = plain_converter(annotation, info), _unbounded(annotation, info)
        if convert is None or read is None or descriptor.file_annotation is not None:
            return typer_build(descriptor)
        return PlainRuntimeParam(
            parameter_info=info,
            annotation=annotation,
            convert=convert,
            read=read,
            rule=plain_rule(annotation, info),
            finite_rule=plain_rule(annotation, info, finite=True),
        )

    core.build_runtime_param = build_runtime_param
    _installed = True
