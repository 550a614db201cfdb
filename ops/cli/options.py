"""The Typer options several commands share, declared once as ``Annotated`` aliases. Only the
Typer commands import this module: :mod:`ops.cli.common` and the hot commands' own argument
layer (:mod:`ops.cli.fast`) stay without Typer."""

from __future__ import annotations

from typing import Annotated

import typer

from ops.config import CONTROL_PLANES_ENV

__all__ = ["ControlPlanesOption", "IdempotencyKeyOption", "JsonOption"]

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON with stable keys instead.")]

ControlPlanesOption = Annotated[
    str | None,
    typer.Option(
        "--control-planes",
        help=f"Control-plane addresses, host:port,... (default: ${CONTROL_PLANES_ENV}, else "
        "the local cluster's cluster.json in ./.stockade or $STOCKADE_STATE_DIR, else the user "
        "config ~/.config/stockade/config.toml or $STOCKADE_CONFIG).",
        show_default=False,
    ),
]

IdempotencyKeyOption = Annotated[
    str | None,
    typer.Option(
        help="The call's idempotency key (1-128 bytes; default: a fresh random UUID). The "
        "same command run again with the same key is answered with the first run's answer and "
        "changes nothing, for 24 h; the same key with another request is refused.",
        show_default=False,
    ),
]
