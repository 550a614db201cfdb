"""The bridge itself: the asyncio loop on top of trio, and the two crossings between them.

:func:`asyncio_bridge` opens the loop once per process. :func:`run_aio` (asyncio code from
trio) and :func:`run_trio` (trio code from asyncio) are the only callers of ``aio_as_trio`` and
``trio_as_aio``. In a trio guest run (:mod:`runtime.aio.guest`), :func:`run_aio` runs asyncio
code on the host loop instead. ``trio_asyncio`` is imported only when a trio-asyncio loop is
opened or crossed: importing it replaces asyncio's event loop policy for the whole process,
which an asyncio program using the client should not get.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from runtime.aio import guest

T = TypeVar("T")

CLEANUP_DEADLINE_S = 2.0
"""How long a shielded close, release, rollback or server shutdown may take, in seconds,
before the connection is dropped (or the server left to close on its own)."""


@asynccontextmanager
async def asyncio_bridge() -> AsyncIterator[None]:
    """Open the asyncio loop that asyncpg and grpclib run on (once per process, around
    everything else), for the body of the block.

    trio-asyncio raises every error reported to the loop's exception handler, which ends the
    process. One is routine and only logged: a connection error nobody retrieved, which asyncpg
    leaves behind when a cancelled call's connection is terminated.
    """
    import trio_asyncio

    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_on_asyncio_error)
        _BRIDGE_LOOPS.set(_BRIDGE_LOOPS.get() | {loop})
        try:
            yield
        finally:
            _BRIDGE_LOOPS.set(_BRIDGE_LOOPS.get() - {loop})


_BRIDGE_LOOPS: trio.lowlevel.RunVar[frozenset[asyncio.AbstractEventLoop]] = trio.lowlevel.RunVar(
    "stockade_bridge_loops", default=frozenset()
)
"""The loops :func:`asyncio_bridge` opened in this trio run and that are still open."""


def asyncio_bridge_open() -> bool:
    """Whether the calling trio task can cross to asyncio already: inside this trio run's
    :func:`asyncio_bridge`, or in a guest run (:mod:`runtime.aio.guest`). The loop must be this
    run's: a ``trio.run`` in a thread inherits its caller's ``current_loop``, which it must not
    use."""
    if guest.host_loop() is not None:
        return True
    trio_asyncio = sys.modules.get("trio_asyncio")
    if trio_asyncio is None:
        return False
    return trio_asyncio.current_loop.get() in _BRIDGE_LOOPS.get()


def _on_asyncio_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    exception = context.get("exception")
    if isinstance(exception, connection_errors()) and "never retrieved" in str(context.get("message", "")):
        from runtime import log  # structlog: loaded only by processes that log

        log.get("aio").info("a dropped connection's pending reply was discarded", error=repr(exception))
        return
    loop.default_exception_handler(context)


async def run_aio(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Await the asyncio coroutine function ``fn(*args, **kwargs)`` from trio (on the asyncio
    loop this trio run is a guest of, when it is one: :func:`runtime.aio.guest.run_on_host`)."""
    host = guest.host_loop()
    if host is not None:
        return await guest.run_on_host(host, fn, *args, **kwargs)
    import trio_asyncio

    return await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)  # type: ignore[no-any-return]


async def run_trio_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await the trio coroutine function ``fn(*args)`` from asyncio code running on ``loop``, a
    trio-asyncio loop not opened with ``open_loop`` (so no task's ``current_loop``). A cancel
    of the awaiting task cancels ``fn``."""
    return await loop.trio_as_future(fn, *args)  # type: ignore[attr-defined, no-any-return]


async def run_trio(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await the trio coroutine function ``fn(*args)`` from asyncio code (the task grpclib runs
    a request in). A cancel of that asyncio task reaches ``fn`` as a trio cancel."""
    import trio_asyncio

    return await trio_asyncio.trio_as_aio(fn)(*args)  # type: ignore[no-any-return]


@functools.cache
def connection_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean a connection is broken (the owner reconnects); asyncpg is imported
    only here, so a client does not load it."""
    import asyncpg

    return (
        OSError,
        asyncio.TimeoutError,
        asyncpg.exceptions.ConnectionDoesNotExistError,
        asyncpg.exceptions.InterfaceError,
        asyncpg.exceptions.PostgresConnectionError,
        asyncpg.exceptions.CannotConnectNowError,
        asyncpg.exceptions.AdminShutdownError,
        asyncpg.exceptions.IdleInTransactionSessionTimeoutError,
        # What asyncpg says when the server ended the session while the process was frozen:
        # the connection's protocol state is lost, so it counts as broken.
        asyncpg.exceptions.InternalClientError,
    )
