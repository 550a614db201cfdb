"""Named fault points: places in the code where a test can park, delay or break an actor.

Production code calls ``await faults.hit("ledger.after_epoch_check")`` at a named point; with
nothing installed it returns at once. A unit test installs an async hook for a name with
:func:`installed`; the hook runs at the point (sleep on a mock clock to freeze, raise to crash,
wait on an event to park).

For real processes (chaos tests) the environment variable ``STOCKADE_FAULTS`` names points to
arm, as ``name=action`` pairs separated by commas. The one action is ``park:DIR``, one-shot
and armed from outside: a harness creates ``DIR/arm``; the first process to reach the point
renames it to ``DIR/parked.<pid>`` (atomically, so exactly one process parks) and waits,
checking every 10 ms, until that file is removed. The harness sees which process parked,
SIGSTOPs it, later removes the file and SIGCONTs it. Without ``DIR/arm`` the point costs one
failed rename. ``STOCKADE_FAULTS`` is read only when ``STOCKADE_ENABLE_FAULTS=1`` is also set,
so no operator setting arms a fault by accident.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

Hook = Callable[[], Awaitable[None]]

_hooks: dict[str, Hook] = {}


def _park_hook(directory: Path) -> Hook:
    async def park() -> None:
        parked = directory / f"parked.{os.getpid()}"
        try:
            os.rename(directory / "arm", parked)
        except FileNotFoundError:
            return
        # Polling a file on purpose: the harness SIGSTOPs this process while it is parked and
        # signals from outside, where no trio.Event can reach.
        while parked.exists():  # noqa: ASYNC110
            await trio.sleep(0.01)

    return park


def _load_env() -> None:
    if os.environ.get("STOCKADE_ENABLE_FAULTS") != "1":
        return
    for item in filter(None, os.environ.get("STOCKADE_FAULTS", "").split(",")):
        name, _, action = item.partition("=")
        kind, _, arg = action.partition(":")
        if kind == "park" and arg:
            _hooks[name.strip()] = _park_hook(Path(arg))
        else:
            raise ValueError(f"STOCKADE_FAULTS item must be name=park:DIR, got {item!r}")


_load_env()


async def hit(name: str) -> None:
    """Run the hook installed for ``name``, if any. Costs one dict lookup otherwise."""
    hook = _hooks.get(name)
    if hook is not None:
        await hook()


@asynccontextmanager
async def installed(name: str, hook: Hook) -> AsyncIterator[None]:
    """Install ``hook`` at fault point ``name`` for the body of the ``async with``."""
    previous = _hooks.get(name)
    _hooks[name] = hook
    try:
        yield
    finally:
        if previous is None:
            _hooks.pop(name, None)
        else:
            _hooks[name] = previous
