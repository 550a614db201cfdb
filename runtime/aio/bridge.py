"""The bridge itself: the asyncio loop on top of trio, and the two crossings between them.

:func:`asyncio_bridge` opens the loop once per process. :func:`run_aio` awaits asyncio code
from trio and is the only caller of ``trio_asyncio.aio_as_trio``; :func:`run_trio` awaits trio
code from asyncio (a served RPC's handler) and is the only caller of ``trio_as_aio``. The rest
of :mod:`runtime.aio` crosses through these two. :func:`connection_errors` says which errors
mean a broken database connection, for the loop's exception handler here and for
:mod:`runtime.aio.pg`.

The other way round, trio as a guest of an asyncio program's own loop (:mod:`runtime.aio.guest`,
for the asyncio face of the client), :func:`run_aio` runs asyncio code on that loop instead:
there is no trio-asyncio loop then. ``trio_asyncio`` is imported only when a trio-asyncio loop
is opened or crossed: importing it replaces asyncio's event loop policy for the whole process
(a later ``asyncio.run`` gets trio-asyncio's loop), which an asyncio program using the client
should not get.
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
    """Open the asyncio loop that asyncpg and grpclib run on, for the body of the block.

    Open it once per process, around everything else (``trio_asyncio.open_loop``).

    trio-asyncio's loop raises every error reported to its exception handler into its
    nursery, which ends the process. One report is routine, not a failure: a future that
    ended with a connection error nobody retrieved. asyncpg leaves one behind when a call is
    cancelled (a gRPC handler past its deadline) and its connection is then terminated (see
    :class:`runtime.aio.pg.PgConnection`): the pending reply's future gets
    ``ConnectionError('unexpected connection_lost() call')`` after its awaiter has gone. Those
    are logged; every other report still ends the process.
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
    """Whether the calling trio task can cross to asyncio already: inside
    :func:`asyncio_bridge` of this trio run (its loop in this task's context), or in a trio run
    that is a guest of an asyncio loop (:mod:`runtime.aio.guest`). Code that may be called
    either way (the client) opens the bridge itself only when this is False.

    The loop must be this run's: a thread started with ``trio.to_thread`` inherits its caller's
    context variables, trio-asyncio's ``current_loop`` included, and a ``trio.run`` in that
    thread must not use the other run's loop (trio fails with an internal error)."""
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
    trio-asyncio loop (``trio_asyncio.BaseTrioEventLoop``: one ``asyncio.run`` makes once
    trio_asyncio is imported), named rather than looked up, since a loop not opened with
    ``open_loop`` is no task's ``current_loop``. A cancel of the awaiting task cancels ``fn``."""
    return await loop.trio_as_future(fn, *args)  # type: ignore[attr-defined, no-any-return]


async def run_trio(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Await the trio coroutine function ``fn(*args)`` from asyncio code (the task grpclib runs
    a request in). A cancel of that asyncio task reaches ``fn`` as a trio cancel."""
    import trio_asyncio

    return await trio_asyncio.trio_as_aio(fn)(*args)  # type: ignore[no-any-return]


# asyncpg is imported when first needed, not with this module: a client (``stockade status``)
# uses the bridge and gRPC only, and should not pay for loading the database driver.


@functools.cache
def connection_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean a connection is broken (the owner reconnects)."""
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
