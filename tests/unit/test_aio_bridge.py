"""The asyncio bridge survives the connection errors asyncpg leaves behind, and no others; it is
the one place where trio and asyncio code call each other."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
import trio

from runtime.aio import asyncio_bridge

ROOT = Path(__file__).parents[2]


def _drop_failed_future(error: BaseException) -> None:
    """Leave behind a future that failed with ``error`` and that nobody awaits (as asyncpg does
    when a cancelled call's connection is terminated), then collect it."""
    future = asyncio.get_event_loop().create_future()
    future.set_exception(error)
    del future
    gc.collect()


async def test_an_unretrieved_connection_error_does_not_end_the_loop() -> None:
    """A dropped future that failed with ConnectionError is logged, and the bridge keeps running."""
    async with asyncio_bridge():
        _drop_failed_future(ConnectionError("unexpected connection_lost() call"))
        await trio.sleep(0.05)


async def test_any_other_unretrieved_error_still_ends_the_loop() -> None:
    """A dropped future that failed with anything else is raised, as before: fail loud."""
    with pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        async with asyncio_bridge():
            _drop_failed_future(RuntimeError("a real bug"))
            await trio.sleep(0.05)


@pytest.mark.parametrize("crossing", ["aio_as_trio(", "trio_as_aio("])
def test_only_the_bridge_crosses_between_trio_and_asyncio(crossing: str) -> None:
    """``runtime/aio/bridge.py`` is the one module that calls ``trio_asyncio``'s crossings; every
    other module goes through its ``run_aio`` and ``run_trio``."""
    callers = [
        str(path.relative_to(ROOT))
        for package in ("actors", "agent", "ops", "protocol", "runtime")
        for path in sorted((ROOT / package).rglob("*.py"))
        if crossing in path.read_text()
    ]
    assert callers == ["runtime/aio/bridge.py"]
