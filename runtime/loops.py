"""The three loops every Stockade process writes: a periodic one, a retry with backoff, and a
process main that stops on a signal. Written once here, on trio's clock, so
``trio.testing.MockClock`` drives each to exact times.

- :class:`Periodic`: ticks at a fixed rate (``trio.current_time`` and ``sleep_until``, the
  shape trio-util's ``periodic`` has): a tick whose work took longer than the interval is
  followed at once, not by a burst of the ticks it missed, and later ticks count from it.
- :func:`retry`: call until the call succeeds, waiting between failures with capped
  exponential backoff and full jitter (:class:`runtime.backoff.FullJitterBackoff`).
- :func:`run_until_signal`: run a process's work until SIGTERM or SIGINT, then cancel it
  cleanly (its ``finally`` blocks and shielded clean-up run before it returns).

And the two ways to finish a computation written in slices (a generator that yields between
slices and returns its result, such as :func:`actors.placement.place_queue_steps`):
:func:`finish` at once, :func:`finish_in_slices` letting other tasks run between slices.
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

    The first :meth:`tick` is due at once, or ``interval_s`` after ``last_at`` when given; each
    later one is due ``interval_s`` after the previous tick's due time, or at once when that has
    passed already (work that overran the interval is followed at once, and the ticks it missed
    are dropped, not made up in a burst). :meth:`restart` makes the next tick due at once (after
    a pause, such as waiting to be elected).

    Args:
        interval_s: seconds between ticks (> 0).
        last_at: trio time of a tick before the first (the first tick is then due
            ``interval_s`` after it); None: the first tick is due at once.

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
    drawn uniformly below ``min(backoff.cap_s, backoff.base_s * 2**n)``: capped exponential
    backoff with full jitter ("Exponential Backoff And Jitter", Marc Brooker, AWS Architecture
    Blog, 2015), so processes that failed at the same moment do not come back at the same one.

    Args:
        attempt: the call to make (no arguments).
        retry_on: the errors that are worth another try; any other propagates at once, as
            does cancellation.
        backoff: the waits' bounds.
        rng: draws the waits; None: a fresh :class:`random.Random`.
        on_retry: called with the error and the wait (seconds) before each wait, e.g. to log.

    Returns:
        What the first successful call returned.
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

    Args:
        main: the process's work (no arguments).
        logger: a :mod:`runtime.log` logger.
        message: the log line written when a signal arrives.
        signals: the signals that stop ``main``.

    Returns:
        The signal that stopped ``main``, or None when it returned on its own.

    Raises:
        Whatever ``main`` raised (inside an ExceptionGroup, as trio's nurseries raise them).
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
