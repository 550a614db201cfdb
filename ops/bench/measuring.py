"""What the database measure scripts (``python -m ops.bench.measure_fence``, ``measure_heartbeat``,
``measure_heartbeat_groups``) share: their parser and a run on a database."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from ops.launcher.pg import database_or_temporary
from runtime.aio import asyncio_bridge

T = TypeVar("T")


def measure_parser(doc: str, *, database_help: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with ``--database-url``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--database-url", help=database_help)
    return parser


def run_on_database(database_url: str | None, body: Callable[[str], Awaitable[T]]) -> T:
    """``await body(url)`` under trio with the asyncio bridge open, on ``database_url`` or, when
    None, on a temporary embedded PostgreSQL removed afterwards."""

    async def run(url: str) -> T:
        async with asyncio_bridge():
            return await body(url)

    with database_or_temporary(database_url, prefix="stockade-measure-") as url:
        return trio.run(run, url)
