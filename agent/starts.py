"""How command jobs start without holding up the agent: :class:`StartLimiter` (at most
``max_concurrent_starts`` command jobs of the process starting at once, shared by every agent
of a fleet) and :class:`Spawner` (the forks and execs on one long-lived thread of the process).
Why both, and why not ``trio.to_thread``: docs/design.md, "Starting command jobs"."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

import attrs
import trio

from agent.sleep_jobs import either
from runtime import metrics
from runtime.errors import InvalidArgument

T = TypeVar("T")


@attrs.define(eq=False)
class StartTicket:
    """One job's place in the queue for a start slot, then its slot (see :class:`StartLimiter`)."""

    _limiter: StartLimiter
    _granted: trio.Event = attrs.field(factory=trio.Event)
    _done: bool = False

    @property
    def granted(self) -> bool:
        """True once the job holds a slot (until :meth:`release`)."""
        return self._granted.is_set() and not self._done

    async def wait(self, stop: trio.Event) -> bool:
        """Wait until the slot is granted (True) or ``stop`` is set first (False: the place in
        the queue is given up). A slot granted in the same instant as ``stop`` counts as
        granted: the caller checks ``stop`` before it starts anything, and releases it.
        """
        if not self._granted.is_set() and not stop.is_set():
            await either(self._granted, stop)
        if self._granted.is_set():
            return True
        self.release()
        return False

    def release(self) -> None:
        """Give the slot back, or the place in the queue; idempotent."""
        if not self._done:
            self._done = True
            self._limiter._leave(self, granted=self._granted.is_set())


@attrs.define(eq=False)
class StartLimiter:
    """Bounds how many command jobs of this process are starting at once.

    A job takes a :meth:`ticket` when it is accepted (synchronously, so slots are granted in
    the order jobs were accepted, across every agent sharing the limiter), waits on it, and
    releases it when its start is over. One per process (inside its ``trio.run``).

    Raises:
        InvalidArgument: ``max_concurrent_starts`` is below 1.
    """

    max_concurrent_starts: int
    waiting: int = attrs.field(default=0, init=False)
    """Tickets waiting for a slot now."""
    starting: int = attrs.field(default=0, init=False)
    """Slots held now."""
    _queue: deque[StartTicket] = attrs.field(factory=deque, init=False)

    def __attrs_post_init__(self) -> None:
        if isinstance(self.max_concurrent_starts, bool) or self.max_concurrent_starts < 1:
            raise InvalidArgument("max_concurrent_starts", self.max_concurrent_starts, "must be >= 1")

    def ticket(self) -> StartTicket:
        """A place at the end of the queue, taken now (no checkpoint); granted at once if a
        slot is free."""
        ticket = StartTicket(self)
        self._queue.append(ticket)
        self.waiting += 1
        metrics.AGENT_JOBS_WAITING_FOR_START_SLOT.inc()
        self._grant()
        return ticket

    def _grant(self) -> None:
        while self.starting < self.max_concurrent_starts and self._queue:
            ticket = self._queue.popleft()
            self.waiting -= 1
            metrics.AGENT_JOBS_WAITING_FOR_START_SLOT.dec()
            self.starting += 1
            ticket._granted.set()

    def _leave(self, ticket: StartTicket, *, granted: bool) -> None:
        if granted:
            self.starting -= 1
            self._grant()
        else:
            self._queue.remove(ticket)
            self.waiting -= 1
            metrics.AGENT_JOBS_WAITING_FOR_START_SLOT.dec()


@attrs.frozen
class _Done(Generic[T]):
    value: T | None = None
    error: BaseException | None = None


class Spawner:
    """The one thread of a process that forks job reapers, as a context manager around everything
    that starts command jobs. Leave the block only once every supervisor it forked has ended,
    since a container supervisor whose forking thread ends kills its container."""

    def __init__(self, *, name: str = "stockade-spawner") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], object], Callable[[_Done[object]], None]] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Spawner:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def thread_id(self) -> int | None:
        """The spawner thread's ``threading.get_ident()``; None while it is not running."""
        return None if self._thread is None else self._thread.ident

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            # A daemon: a process that exits without closing it must not hang on it (its
            # reapers then run on under the fence deadline, for a restarted agent to take over).
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Let the thread finish what it was given, end it and join it (idempotent)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, deliver = item
            try:
                done: _Done[object] = _Done(value=fn())
            except BaseException as exc:  # handed to the caller, who re-raises it
                done = _Done(error=exc)
            deliver(done)

    async def run(self, fn: Callable[[], T]) -> T:
        """Call ``fn()`` on the spawner thread (one call at a time, in order) and return its
        result or raise its error (RuntimeError: the thread is not running). Shielded: the
        process a fork made must reach the caller."""
        if self._thread is None:
            raise RuntimeError(f"{self._name} thread is not running")
        token = trio.lowlevel.current_trio_token()
        finished = trio.Event()
        result: list[_Done[object]] = []

        def deliver(done: _Done[object]) -> None:  # on the spawner thread
            def on_trio_thread() -> None:
                result.append(done)
                finished.set()

            try:
                token.run_sync_soon(on_trio_thread)
            except trio.RunFinishedError:
                pass  # the caller's trio run is over: nobody to hand the result to

        self._queue.put((fn, deliver))
        with trio.CancelScope(shield=True):
            await finished.wait()
        (done,) = result
        if done.error is not None:
            raise done.error
        return done.value  # type: ignore[return-value]
