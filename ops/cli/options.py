"""The Typer options several commands share, declared once as ``Annotated`` aliases. Only the
Typer commands import this module: :mod:`ops.cli.common` and the hot commands' own argument
layer (:mod:`ops.cli.fast`) stay without Typer."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ops.config import CONTROL_PLANES_ENV

__all__ = ["ControlPlanesOption", "IdempotencyKeyOption", "JsonOption", "quiet_option"]


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
