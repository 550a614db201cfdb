"""Request/reply between actors: a request message carries a :class:`Reply` slot.

The asker creates ``Reply()``, puts it in its request, sends the request and awaits
``reply.wait()``; the answering actor calls ``reply.set(value)`` or ``reply.fail(exc)`` exactly
once, possibly from another loop's thread (:mod:`runtime.threads`): the answer is then handed to
the asker's loop.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

import attrs
import trio

T = TypeVar("T")


class ReplyAlreadySent(RuntimeError):
    """``set`` or ``fail`` was called on a reply that was already answered."""


@attrs.define(eq=False)
class Reply(Generic[T]):
    """A one-shot answer slot. Identity-compared, so it can sit in a frozen message."""

    _event: trio.Event = attrs.field(factory=trio.Event, init=False)
    _value: T | None = attrs.field(default=None, init=False)
    _error: BaseException | None = attrs.field(default=None, init=False)
    _sent: bool = attrs.field(default=False, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _thread: int = attrs.field(factory=threading.get_ident, init=False)
    _token: trio.lowlevel.TrioToken | None = attrs.field(factory=lambda: _current_token(), init=False)

    @property
    def answered(self) -> bool:
        """True once ``set`` or ``fail`` was called."""
        return self._sent

    def set(self, value: T) -> None:
        """Answer with ``value``. Raises ReplyAlreadySent on a second answer."""
        self._answer(value, None)

    def fail(self, error: BaseException) -> None:
        """Answer with an exception that ``wait`` re-raises in the asker."""
        self._answer(None, error)

    def _answer(self, value: T | None, error: BaseException | None) -> None:
        with self._lock:
            if self._sent:
                raise ReplyAlreadySent("reply already answered")
            self._sent = True
            self._value, self._error = value, error
        if threading.get_ident() == self._thread or self._token is None:
            self._event.set()
        else:
            try:
                self._token.run_sync_soon(self._event.set)
            except trio.RunFinishedError:
                pass  # the asker's loop has ended: nobody waits

    async def wait(self) -> T:
        """Wait for the answer; re-raise the answering actor's error if it failed."""
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def _current_token() -> trio.lowlevel.TrioToken | None:
    """The running loop's token, or None outside a trio run."""
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
