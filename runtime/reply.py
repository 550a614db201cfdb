"""Request/reply between actors: a request message carries a :class:`Reply` slot.

The asker creates ``Reply()``, puts it in its request, sends the request and awaits
``reply.wait()``. The answering actor calls ``reply.set(value)`` or ``reply.fail(exc)``
exactly once. A test standing in for an actor holds the other end of the channel and
scripts the answer: late (sleep first), lost (never answer) or failed.
"""

from __future__ import annotations

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

    @property
    def answered(self) -> bool:
        """True once ``set`` or ``fail`` was called."""
        return self._event.is_set()

    def set(self, value: T) -> None:
        """Answer with ``value``. Raises ReplyAlreadySent on a second answer."""
        if self._event.is_set():
            raise ReplyAlreadySent("reply already answered")
        self._value = value
        self._event.set()

    def fail(self, error: BaseException) -> None:
        """Answer with an exception that ``wait`` re-raises in the asker."""
        if self._event.is_set():
            raise ReplyAlreadySent("reply already answered")
        self._error = error
        self._event.set()

    async def wait(self) -> T:
        """Wait for the answer; re-raise the answering actor's error if it failed."""
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
