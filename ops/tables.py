"""Terminal tables shared by the renderers of results (chaos, check, the benchmarks), so the
terminal shows every result the same way."""

from __future__ import annotations

from collections.abc import Sequence

import rich.box
from rich.table import Table

VerdictRow = tuple[str, str, bool | str | None]
"""(name, value, good): good None when the row is a figure, not a verdict; a string when the
verdict is neither ``ok`` nor ``FAIL`` (``running``: not done yet, nothing wrong)."""


def seconds_text(value: float | None) -> str:
    """``value`` seconds as ``1.23 s``, or ``-`` when there is none."""
    return "-" if value is None else f"{value:.2f} s"


def _verdict(good: bool | str | None) -> str:
    if isinstance(good, str):
        return good
    return "" if good is None else ("ok" if good else "FAIL")


def verdict_table(rows: Sequence[VerdictRow]) -> Table:
    """A result / value / verdict table; the verdict reads ``ok`` or ``FAIL`` where one applies
    (or the row's own word)."""
    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False)
    table.add_column("result")
    table.add_column("value", justify="right")
    table.add_column("")
    for name, value, good in rows:
        table.add_row(name, value, _verdict(good))
    return table
