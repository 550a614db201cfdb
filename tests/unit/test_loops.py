"""The loops every process writes, written once (:mod:`runtime.loops`): a periodic loop at a
fixed rate that skips what an overrun missed, a retry with capped exponential backoff and full
jitter, and a process main that a signal stops cleanly; all to exact mock-clock times. And the
two ways to finish a computation written in slices."""

from __future__ import annotations

import itertools
import os
import random
import signal
from collections.abc import Generator

import pytest
import trio
import trio.testing

from runtime.backoff import FullJitterBackoff
from runtime.errors import DatabaseUnavailable, InvalidArgument
from runtime.loops import Periodic, finish, finish_in_slices, retry, run_until_signal


class Ceiling(random.Random):
    """Draws the top of every range: the waits are their ceilings."""

    def uniform(self, a: float, b: float) -> float:
        return b


class RecordingLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def info(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))


async def test_a_periodic_loop_ticks_at_once_then_every_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Ticks at 0, 0.25, 0.5, 0.75 when the work takes no time."""
    t0 = trio.current_time()
    ticks = Periodic(0.25)
    seen = [await ticks.tick() - t0 for _ in range(4)]
    assert seen == [0.0, 0.25, 0.5, 0.75]


async def test_a_periodic_loop_keeps_its_rate_whatever_each_tick_takes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Work of 0.1 s per tick does not shift the ticks: still 0, 1, 2, 3."""
    t0 = trio.current_time()
    ticks = Periodic(1.0)
    seen = []
    for _ in range(4):
        seen.append(await ticks.tick() - t0)
        await trio.sleep(0.1)
    assert seen == [0.0, 1.0, 2.0, 3.0]


async def test_a_tick_that_overran_is_followed_at_once_and_the_missed_ones_are_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Work of 2.5 s at the tick of 0 (interval 1 s): the next tick is at 2.5, not at 1 and 2,
    and the rate counts from there (3.5)."""
    t0 = trio.current_time()
    ticks = Periodic(1.0)
    seen = [await ticks.tick() - t0]
    await trio.sleep(2.5)
    seen += [await ticks.tick() - t0, await ticks.tick() - t0]
    assert seen == [0.0, 2.5, 3.5]


async def test_a_periodic_loop_can_count_from_an_earlier_tick_and_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """last_at=-0.25 with interval 1: the first tick at 0.75; after restart() at 3, one at once."""
    t0 = trio.current_time()
    ticks = Periodic(1.0, last_at=t0 - 0.25)
    seen = [await ticks.tick() - t0]
    await trio.sleep_until(t0 + 3.0)
    ticks.restart()
    seen += [await ticks.tick() - t0, await ticks.tick() - t0]
    assert seen == [0.75, 3.0, 4.0]


def test_a_periodic_loop_needs_a_positive_interval() -> None:
    """An interval of 0 is refused, naming the field."""
    with pytest.raises(InvalidArgument, match="interval_s"):
        Periodic(0.0)


async def test_retry_waits_the_capped_doubling_ceilings_between_failures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Five failures with base 0.2 s and cap 1 s (waits drawn at their ceilings): attempts at
    0, 0.2, 0.6, 1.4, 2.4, 3.4; the sixth succeeds, and each wait was announced first."""
    t0 = trio.current_time()
    attempts: list[float] = []
    announced: list[float] = []

    async def attempt() -> str:
        attempts.append(trio.current_time() - t0)
        if len(attempts) <= 5:
            raise DatabaseUnavailable("down")
        return "done"

    result = await retry(
        attempt,
        retry_on=DatabaseUnavailable,
        backoff=FullJitterBackoff(base_s=0.2, cap_s=1.0),
        rng=Ceiling(),
        on_retry=lambda exc, wait_s: announced.append(wait_s),
    )
    assert result == "done"
    assert attempts == pytest.approx([0.0, 0.2, 0.6, 1.4, 2.4, 3.4])
    assert announced == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])


async def test_retry_draws_each_wait_below_its_ceiling(autojump_clock: trio.testing.MockClock) -> None:
    """With a seeded generator, the waits are the generator's draws below 0.2, 0.4, 0.8 s."""
    expected_rng = random.Random(7)
    expected = [expected_rng.uniform(0.0, c) for c in (0.2, 0.4, 0.8)]
    t0 = trio.current_time()
    attempts: list[float] = []

    async def attempt() -> None:
        attempts.append(trio.current_time() - t0)
        if len(attempts) <= 3:
            raise DatabaseUnavailable("down")

    await retry(
        attempt,
        retry_on=DatabaseUnavailable,
        backoff=FullJitterBackoff(base_s=0.2, cap_s=5.0),
        rng=random.Random(7),
    )
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps == pytest.approx(expected)


async def test_retry_lets_other_errors_through_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """An error not in retry_on propagates from the first attempt, with no wait."""
    t0 = trio.current_time()

    async def attempt() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await retry(attempt, retry_on=DatabaseUnavailable, backoff=FullJitterBackoff())
    assert trio.current_time() == t0


async def test_a_signal_cancels_the_main_cleanly_and_is_logged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SIGTERM at 3 s: the main is cancelled at 3 s, its clean-up runs, the stop is logged with
    the signal's name, and the signal is returned."""
    t0 = trio.current_time()
    events: list[tuple[str, float]] = []
    logger = RecordingLog()

    async def main() -> None:
        try:
            await trio.sleep_forever()
        finally:
            events.append(("cleaned up", trio.current_time() - t0))

    async def send_later() -> None:
        await trio.sleep(3.0)
        os.kill(os.getpid(), signal.SIGTERM)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_later)
        stopped_by = await run_until_signal(main, logger=logger, message="stopping")
    assert stopped_by == signal.SIGTERM
    assert events == [("cleaned up", 3.0)]
    assert logger.lines == [("stopping", {"signal": "SIGTERM"})]


async def test_a_main_that_returns_ends_the_run_without_a_signal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A main that returns after 2 s ends the run at 2 s; nothing is logged, None returned."""
    t0 = trio.current_time()
    logger = RecordingLog()

    async def main() -> None:
        await trio.sleep(2.0)

    assert await run_until_signal(main, logger=logger) is None
    assert trio.current_time() - t0 == 2.0
    assert logger.lines == []


def sliced(slices: int, log: list[str]) -> Generator[None, None, str]:
    """A computation of ``slices`` slices that records each one and returns "done"."""
    for index in range(slices):
        log.append(f"slice {index}")
        if index < slices - 1:
            yield
    return "done"


def test_finish_runs_a_sliced_computation_to_its_result_at_once() -> None:
    """Every slice runs, in order, and the computation's result is returned."""
    log: list[str] = []
    assert finish(sliced(3, log)) == "done"
    assert log == ["slice 0", "slice 1", "slice 2"]


async def test_finish_in_slices_lets_other_tasks_run_between_slices(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A task started beside it runs after the first slice and before the last (at the first
    checkpoint, before or after the second slice as trio's scheduler picks); no time passes."""
    t0 = trio.current_time()
    log: list[str] = []

    async def other() -> None:
        log.append("other")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        assert await finish_in_slices(sliced(3, log)) == "done"
    assert [line for line in log if line != "other"] == ["slice 0", "slice 1", "slice 2"]
    assert log.index("other") in (1, 2)
    assert trio.current_time() == t0
