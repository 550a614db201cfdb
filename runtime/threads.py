"""Actors on a trio loop of their own: a thread with its own ``trio.run`` and asyncio bridge.

:func:`run_on_own_loop` hosts one actor that way (the ``nursery.start`` protocol, so the
supervisor restarts it like any other), with its own asyncio bridge and
:class:`runtime.lag.LoopLag`. Messages cross loops only through :meth:`OwnLoop.post` and
:class:`CrossLoopSender` (``TrioToken.run_sync_soon``: never blocking, in order). Why:
docs/design.md, "Actors on loops of their own".
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import trio

from runtime import log
from runtime.aio import asyncio_bridge
from runtime.lag import LoopLag

T = TypeVar("T")


class CrossLoopSender(Generic[T]):
    """``send_nowait`` into a memory channel of the loop ``token`` names, from any thread, in
    order; a full channel drops the message with a warning naming ``name`` (role changes and
    rare requests, whose receivers resync when they restart)."""

    def __init__(self, channel: trio.MemorySendChannel[T], token: trio.lowlevel.TrioToken, name: str) -> None:
        self._channel = channel
        self._token = token
        self._name = name

    def send_nowait(self, message: T) -> None:
        """Post ``message``; returns at once. A loop that has ended drops it."""
        try:
            self._token.run_sync_soon(self._deliver, message)
        except trio.RunFinishedError:
            pass

    def _deliver(self, message: T) -> None:
        try:
            self._channel.send_nowait(message)
        except trio.WouldBlock:
            log.get("threads").warning("cross-loop message dropped: inbox full", inbox=self._name)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass


@attrs.define(eq=False)
class OwnLoop:
    """The handle of one hosted loop: post calls to it; those posted while no loop runs are run
    first thing on the next."""

    name: str
    monitor_lag: bool = True
    """Run a :class:`LoopLag` named ``name`` on the hosted loop (False: the actor runs its own)."""
    lag: LoopLag | None = None
    """The hosted loop's lag monitor, while it runs (with ``monitor_lag``)."""
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _token: trio.lowlevel.TrioToken | None = None
    _waiting: list[tuple[Callable[..., Any], tuple[Any, ...]]] = attrs.field(factory=list)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the hosted loop soon (synchronously, between its tasks)."""
        with self._lock:
            if self._token is None:
                self._waiting.append((fn, args))
                return
            try:
                self._token.run_sync_soon(fn, *args)
            except trio.RunFinishedError:
                self._waiting.append((fn, args))

    def _attach(self, token: trio.lowlevel.TrioToken) -> None:
        with self._lock:
            self._token = token
            waiting, self._waiting = self._waiting, []
        for fn, args in waiting:
            fn(*args)

    def _detach(self) -> None:
        with self._lock:
            self._token = None


async def run_on_own_loop(
    loop: OwnLoop,
    actor: Callable[..., Awaitable[Any]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``actor`` (the ``nursery.start`` protocol) on a new thread with a trio loop of its own.

    The thread's loop opens an asyncio bridge, starts a :class:`LoopLag` (with
    ``loop.monitor_lag``), then ``await nursery.start(actor)``; ``task_status.started()``
    follows the actor's, and the ``contextvars`` are copied into the thread. Cancelling this
    task cancels the hosted loop and waits (shielded) until its actor has cleaned up.

    Raises:
        Exception: whatever the actor raised (out of the hosted loop's single-error groups).
    """
    parent = trio.lowlevel.current_trio_token()
    started = trio.Event()
    finished = trio.Event()
    outcome: list[BaseException | None] = []
    child: dict[str, Any] = {}

    async def hosted() -> None:
        async with asyncio_bridge(), trio.open_nursery() as nursery:
            child["scope"] = nursery.cancel_scope
            loop._attach(trio.lowlevel.current_trio_token())
            if loop.monitor_lag:
                loop.lag = LoopLag(loop=loop.name)
                nursery.start_soon(loop.lag.run)

            async def actor_then_stop(*, task_status: trio.TaskStatus[None]) -> None:
                try:
                    await actor(task_status=task_status)
                finally:
                    nursery.cancel_scope.cancel()

            await nursery.start(actor_then_stop)
            parent.run_sync_soon(started.set)

    def thread_main() -> None:
        error: BaseException | None = None
        try:
            trio.run(hosted)
        except BaseException as exc:
            error = exc
        finally:
            loop._detach()
        outcome.append(error)
        try:
            parent.run_sync_soon(finished.set)
        except trio.RunFinishedError:
            pass

    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(thread_main,), name=f"stockade-{loop.name}", daemon=True
    )
    thread.start()
    try:
        async with trio.open_nursery() as waiter:

            async def announce() -> None:
                await started.wait()
                task_status.started()

            waiter.start_soon(announce)
            await finished.wait()
            waiter.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not finished.is_set():
                loop.post(lambda: child["scope"].cancel())
                await finished.wait()
            await trio.to_thread.run_sync(thread.join)  # it is ending: finished is its last step
    error = outcome[0] if outcome else None
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]  # the hosted loop's nurseries wrap it
    if error is not None and not isinstance(error, trio.Cancelled):
        raise error
