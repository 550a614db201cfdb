"""Options declared once: the Typer options several commands share, as ``Annotated`` aliases,
and a command's own options as a table of :class:`Option` that :func:`with_options` gives it.
Only the Typer commands import this module: :mod:`ops.cli.common` and the hot commands' own
argument layer (:mod:`ops.cli.fast`) stay without Typer."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ops.config import CONTROL_PLANES_ENV

__all__ = [
    "ControlPlanesOption",
    "IdempotencyKeyOption",
    "JsonOption",
    "Option",
    "Options",
    "quiet_option",
    "settings_fields",
    "settings_rows",
    "with_options",
]


def quiet_option(
    *param_decls: str,
    help: str,
    metavar: str | None = None,
    min: float | None = None,
    max: float | None = None,
) -> Any:
    """A Typer option whose ``--help`` line shows no ``[default: ...]``: it has none (None) or
    its ``help`` says it. The names (``param_decls``), ``help``, ``metavar`` and the bounds
    ``min`` and ``max`` are :func:`typer.Option`'s."""
    return typer.Option(*param_decls, help=help, metavar=metavar, min=min, max=max, show_default=False)


class Option:
    """One option declared once: its default, its Typer option (``info``, or one made of
    ``declared``), its type (``kind``; default: the default's), and, for a field of a settings
    group, the group's name and the field's name there (``setting``; default: the option's)."""

    __slots__ = ("default", "group", "info", "kind", "setting")

    def __init__(
        self,
        default: Any,
        info: Any = None,
        *,
        kind: Any = None,
        group: str = "",
        setting: str = "",
        **declared: Any,
    ) -> None:
        self.default, self.kind, self.group, self.setting = default, kind or type(default), group, setting
        self.info = info or typer.Option(**declared)


def settings_rows(group: str, default: Callable[[str], Any]) -> Callable[..., dict[str, Option]]:
    """The row constructor of the options that set fields of settings group ``group``: given a
    field's name, its option's name (``option``; default: the field's) and its Typer option
    (``info``, or one made of the Typer parameters given), the one-row table of that option,
    whose default is ``default(field)``."""

    def row(field: str, info: Any = None, *, option: str = "", **declared: Any) -> dict[str, Option]:
        setting = field if option else ""
        return {option or field: Option(default(field), info, group=group, setting=setting, **declared)}

    return row


Options = dict[str, Any]
"""The values of a command's declared options, by name."""


def settings_fields(declared: dict[str, Option], options: Options, group: str) -> dict[str, Any]:
    """The fields of settings group ``group`` that ``options`` set, named as the group's
    settings class names them."""
    return {o.setting or name: options[name] for name, o in declared.items() if o.group == group}


def with_options(declared: dict[str, Option]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator that gives a command an option per entry of ``declared`` in place of its
    ``options`` parameter, which it is then given whole (:data:`Options`); ``--help`` lists them
    in ``declared``'s order, where that parameter stands."""
    shared = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=o.default,
            annotation=Annotated[o.kind, o.info],  # type: ignore[name-defined]
        )
        for name, o in declared.items()
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command, eval_str=True).parameters.values()
        ]
        at = [p.name for p in own].index("options")
        parameters = [*own[:at], *shared, *own[at + 1 :]]

        @functools.wraps(command)
        def with_options(**arguments: Any) -> None:
            options = {name: arguments.pop(name) for name in declared}
            command(**arguments, options=options)

        with_options.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_options

    return decorate


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON with stable keys instead.")]

ControlPlanesOption = Annotated[
    str | None,
    quiet_option(
        "--control-planes",
        help=f"Control-plane addresses, host:port,... (default: ${CONTROL_PLANES_ENV}, else "
        "the local cluster's cluster.json in ./.stockade or $STOCKADE_STATE_DIR, else the user "
        "config ~/.config/stockade/config.toml or $STOCKADE_CONFIG).",
    ),
]

IdempotencyKeyOption = Annotated[
    str | None,
    quiet_option(
        help="The call's idempotency key (1-128 bytes; default: a fresh random UUID). The "
        "same command run again with the same key is answered with the first run's answer and "
        "changes nothing, for 24 h; the same key with another request is refused."
    ),
]
