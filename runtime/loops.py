"""The loops every Stockade process writes, once, on trio's clock (so ``MockClock`` drives
each to exact times): :class:`Periodic` (a fixed rate, trio-util's ``periodic`` shape),
:func:`retry` (capped exponential backoff, full jitter) and :func:`run_until_signal` (a
process's work until SIGTERM or SIGINT); and :func:`finish` and :func:`finish_in_slices` for a
computation written in slices (a generator that yields between slices and returns its result,
such as :func:`actors.placement.place_queue_steps`).
"""

from __future__ import annotations

import random
import signal
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, TypeVar

import attrs
import trio

from runtime.backoff import FullJitterBackoff
from runtime.errors import InvalidArgument

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop a Stockade process cleanly."""


@attrs.define
class Periodic:
    """Ticks every ``interval_s`` seconds of trio time, at a fixed rate.

    Each :meth:`tick` is due ``interval_s`` after the previous tick's due time (``last_at``;
    None: at once), or at once when that has passed already: the ticks that overrunning work
    missed are dropped, not made up in a burst.

    Raises:
        InvalidArgument: ``interval_s`` is not > 0.
    """

    interval_s: float = attrs.field()
    last_at: float | None = None
    """Due time of the previous tick (trio seconds); None: the next one is due at once."""

    @interval_s.validator
    def _positive(self, attribute: attrs.Attribute[float], value: float) -> None:
        if not value > 0:
            raise InvalidArgument("interval_s", value, "must be > 0")

    def next_at(self) -> float:
        """When the next tick is due (trio seconds), judged now."""
        now = trio.current_time()
        if self.last_at is None:
            return now
        return max(self.last_at + self.interval_s, now)

    async def tick(self) -> float:
        """Sleep until the next tick is due; returns its due time (trio seconds)."""
        due = self.next_at()
        await trio.sleep_until(due)
        self.last_at = due
        return due

    def restart(self) -> None:
        """Make the next tick due at once."""
        self.last_at = None


async def retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    backoff: FullJitterBackoff,
    rng: random.Random | None = None,
    on_retry: Callable[[Exception, float], None] | None = None,
) -> T:
    """Call ``attempt`` until it returns, waiting after the n-th failure (n = 0, 1, ...) a time
    drawn uniformly below ``min(backoff.cap_s, backoff.base_s * 2**n)`` (full jitter,
    :mod:`runtime.backoff`).

    Args:
        retry_on: the errors that are worth another try; any other propagates at once.
        rng: draws the waits; None: a fresh :class:`random.Random`.
        on_retry: called with the error and the wait (seconds) before each wait, e.g. to log.
    """
    rng = rng or random.Random()
    failures = 0
    while True:
        try:
            return await attempt()
        except retry_on as exc:
            wait_s = backoff.delay_s(failures, rng)
            failures += 1
            if on_retry is not None:
                on_retry(exc, wait_s)
        await trio.sleep(wait_s)


async def run_until_signal(
    main: Callable[[], Awaitable[object]],
    *,
    logger: Any,
    message: str = "stopping",
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
) -> signal.Signals | None:
    """Run ``main`` until it returns or one of ``signals`` arrives; on a signal, log
    ``message`` (with the signal's name) and cancel ``main``, which unwinds cleanly before this
    returns. Signals are watched from before ``main`` starts, so a process still starting (or
    waiting for its database) stops on one too. Must run in the main thread.

    Returns the signal that stopped ``main``, or None when it returned on its own; raises what
    ``main`` raised (inside an ExceptionGroup).
    """
    stopped_by: signal.Signals | None = None
    with trio.open_signal_receiver(*signals) as received:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                nonlocal stopped_by
                async for signum in received:
                    stopped_by = signal.Signals(signum)
                    logger.info(message, signal=stopped_by.name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await main()
            nursery.cancel_scope.cancel()
    return stopped_by


def finish(steps: Generator[None, None, T]) -> T:
    """Run the sliced computation ``steps`` to its end at once; returns its result."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def finish_in_slices(steps: Generator[None, None, T]) -> T:
    """Run the sliced computation ``steps`` to its end with a checkpoint between its slices,
    so that a long one does not hold the event loop; returns its result. Whatever it reads
    must not change meanwhile (the caller's snapshot)."""
    try:
        while True:
            next(steps)
            await trio.lowlevel.checkpoint()
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
