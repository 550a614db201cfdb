"""Trio as a guest of an asyncio program's own event loop, for code written for trio (the
client) that an asyncio program calls.

:func:`open_portal` starts the guest run (or joins the one running on this loop) and gives a
:class:`TrioPortal`, whose :meth:`TrioPortal.run` awaits a trio function from asyncio;
:func:`run_on_host` awaits asyncio code from a trio task of the guest run. How the crossings
work: docs/design.md, "Trio as a guest of an asyncio program".
"""

from __future__ import annotations

import asyncio
import functools
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

T = TypeVar("T")

_HOST_LOOP = trio.lowlevel.RunVar[asyncio.AbstractEventLoop | None]("stockade_host_loop", default=None)


def host_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop the current trio run is a guest of, or None (call it from trio)."""
    return _HOST_LOOP.get()


async def run_on_host(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any
) -> T:
    """Await ``fn(*args, **kwargs)`` as an asyncio task of ``loop`` from a trio task of the guest
    run on ``loop``, and return what it returned (or raise what it raised).

    A trio cancel cancels the task and waits, shielded, until it has finished (its clean-up
    included), then propagates.
    """

    async def call() -> T:
        return await fn(*args, **kwargs)

    token = trio.lowlevel.current_trio_token()
    finished = trio.Event()
    task = loop.create_task(call())
    # The task's end is told to trio through its token: the callback runs on the loop, outside
    # trio's own steps, where only run_sync_soon may touch trio.
    task.add_done_callback(lambda _: token.run_sync_soon(finished.set))
    try:
        await finished.wait()
    except BaseException:
        task.cancel()
        with trio.CancelScope(shield=True):
            await finished.wait()
        raise
    return task.result()


def _declare_running(loop: asyncio.AbstractEventLoop) -> None:
    """Make ``loop`` the running loop of asyncio code called from this trio task (and the tasks
    it starts): once imported, trio-asyncio answers ``asyncio.get_running_loop()`` inside a
    trio task from its ``current_loop``, None here (grpclib's ``Channel()`` would find no loop)."""
    trio_asyncio = sys.modules.get("trio_asyncio")
    if trio_asyncio is not None:
        trio_asyncio.current_loop.set(loop)


class TrioPortal:
    """Where asyncio code awaits trio functions (:meth:`run`): a trio guest run on its loop,
    or the trio run its trio-asyncio loop runs in. Made by :func:`open_portal`."""

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await the trio function ``fn(*args)`` from asyncio (the loop's own thread), and
        return what it returned.

        Raises:
            asyncio.CancelledError: the awaiting task was cancelled (the trio call is
                cancelled too), or the portal closed first.
            Exception: whatever ``fn`` raised, as itself.
        """
        raise NotImplementedError


@attrs.define(eq=False)
class _TrioAsyncioLoop(TrioPortal):
    """The portal of a trio-asyncio loop: its own crossing
    (:func:`runtime.aio.bridge.run_trio_on`)."""

    loop: asyncio.AbstractEventLoop

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        from runtime.aio.bridge import run_trio_on

        async def call() -> T:
            # The trio task the loop runs it in has no current_loop (the loop was not opened
            # with open_loop): name it, for the asyncio code fn calls (run_aio).
            _declare_running(self.loop)
            return await fn(*args)

        return await run_trio_on(self.loop, call)


@attrs.define(eq=False)
class _GuestRun(TrioPortal):
    """A trio guest run on an asyncio loop (see the module docstring)."""

    loop: asyncio.AbstractEventLoop
    _token: trio.lowlevel.TrioToken
    _nursery: trio.Nursery
    _finished: asyncio.Future[Any]
    users: int = 0
    """How many :func:`open_portal` blocks use it now."""

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        result: asyncio.Future[T] = self.loop.create_future()
        scope = trio.CancelScope()

        def settle(set_outcome: Callable[[], object]) -> None:
            if not result.done():
                set_outcome()

        async def call() -> None:
            _declare_running(self.loop)
            try:
                with scope:
                    value = await fn(*args)
                    self.loop.call_soon_threadsafe(settle, functools.partial(result.set_result, value))
                    return
                self.loop.call_soon_threadsafe(settle, result.cancel)
            except Exception as exc:
                # Bound now: the name ``exc`` is gone once the handler ends.
                self.loop.call_soon_threadsafe(settle, functools.partial(result.set_exception, exc))
            except BaseException:
                # The guest run is ending (its nursery was cancelled): the caller gets a cancel.
                self.loop.call_soon_threadsafe(settle, result.cancel)
                raise

        self._token.run_sync_soon(self._nursery.start_soon, call)
        try:
            return await result
        except asyncio.CancelledError:
            self._token.run_sync_soon(scope.cancel)
            raise

    async def _close(self) -> None:
        """End the guest run (every trio call still in it is cancelled) and wait for its end.

        Raises:
            BaseException: what the guest run's main task raised, if anything.
        """
        self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
        ended = await asyncio.shield(self._finished)
        ended.unwrap()


@attrs.define(eq=False)
class _Slot:
    """A loop's guest run: starting or started, and, once its last user leaves, ending."""

    started: asyncio.Future[_GuestRun]
    """Done once the run has started (or failed to)."""
    ended: asyncio.Future[None] | None = None
    """Set once its last user is ending it; done once it has ended."""


_GUESTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slot] = weakref.WeakKeyDictionary()
"""The guest run of each loop (trio allows one run per thread), while one is in use."""


@asynccontextmanager
async def open_portal() -> AsyncIterator[TrioPortal]:
    """The portal of the running asyncio loop: a trio guest run on it, started on entering the
    first block and ended on leaving the last one (every trio call still in it is then
    cancelled; a block entered meanwhile waits for that end and starts another); on a
    trio-asyncio loop, that loop's own crossing.

    Raises:
        RuntimeError: the thread already runs trio otherwise (a trio program should use the
            trio face instead).
    """
    loop = asyncio.get_running_loop()
    trio_asyncio = sys.modules.get("trio_asyncio")
    if trio_asyncio is not None and isinstance(loop, trio_asyncio.BaseTrioEventLoop):
        yield _TrioAsyncioLoop(loop)
        return
    while True:
        slot = _GUESTS.get(loop)
        if slot is None:
            slot = _GUESTS[loop] = _Slot(started=loop.create_future())
            try:
                slot.started.set_result(await _start(loop))
            except BaseException as exc:
                del _GUESTS[loop]
                if isinstance(exc, Exception):
                    slot.started.set_exception(exc)
                else:
                    slot.started.cancel()
                raise
        if slot.ended is None:
            break
        await asyncio.shield(slot.ended)  # a run that is ending: wait, then start another
    guest = await asyncio.shield(slot.started)
    guest.users += 1
    try:
        yield guest
    finally:
        guest.users -= 1
        if guest.users == 0:
            ended = slot.ended = loop.create_future()
            try:
                await guest._close()
            finally:
                del _GUESTS[loop]
                ended.set_result(None)


def _end_once_started(ready: asyncio.Future[tuple[trio.lowlevel.TrioToken, trio.Nursery]]) -> None:
    """End a guest run whose starter was cancelled, as soon as it has started."""
    if not ready.cancelled() and ready.exception() is None:
        token, nursery = ready.result()
        token.run_sync_soon(nursery.cancel_scope.cancel)


async def _start(loop: asyncio.AbstractEventLoop) -> _GuestRun:
    """Start a trio guest run on ``loop`` and return it once its nursery is open."""
    ready: asyncio.Future[tuple[trio.lowlevel.TrioToken, trio.Nursery]] = loop.create_future()
    finished: asyncio.Future[Any] = loop.create_future()

    async def main() -> None:
        _HOST_LOOP.set(loop)
        _declare_running(loop)
        async with trio.open_nursery() as nursery:
            token = trio.lowlevel.current_trio_token()
            loop.call_soon_threadsafe(ready.set_result, (token, nursery))
            await trio.sleep_forever()

    def done(outcome: Any) -> None:
        def settle() -> None:
            finished.set_result(outcome)
            if not ready.done():
                ready.set_exception(RuntimeError(f"the trio guest run ended before it started: {outcome!r}"))

        loop.call_soon_threadsafe(settle)

    trio.lowlevel.start_guest_run(
        main,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        done_callback=done,
        # asyncio's own signal handling uses signal.set_wakeup_fd (asyncio.run installs it).
        host_uses_signal_set_wakeup_fd=True,
    )
    try:
        token, nursery = await asyncio.shield(ready)
    except asyncio.CancelledError:
        ready.add_done_callback(_end_once_started)
        raise
    return _GuestRun(loop=loop, token=token, nursery=nursery, finished=finished)
