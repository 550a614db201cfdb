"""The event-loop lag monitor, on a mock clock."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from runtime.lag import LoopLag


def test_lag_is_how_late_a_wake_came() -> None:
    """A wake 0.3 s after its due time is a lag of 0.3 s; an early one counts as 0."""
    lag = LoopLag(loop="test")
    assert lag.observe(due=1.0, woke=1.3) == pytest.approx(0.3)
    assert lag.observe(due=2.0, woke=2.0) == 0.0
    assert lag.observe(due=3.0, woke=2.9) == 0.0


def test_recent_max_covers_only_the_window() -> None:
    """recent_max_s is the worst lag of the wakes within window_s of the newest one."""
    lag = LoopLag(loop="test", window_s=1.0)
    lag.observe(due=0.0, woke=0.5)
    lag.observe(due=1.0, woke=1.1)
    assert lag.recent_max_s == pytest.approx(0.5)
    lag.observe(due=1.6, woke=1.6)
    assert lag.recent_max_s == pytest.approx(0.1)


def test_late_wakes_are_logged_at_most_once_per_log_every_s(capsys: pytest.CaptureFixture[str]) -> None:
    """Three late wakes within log_every_s give one line; the next line carries the count since."""
    lag = LoopLag(loop="test", warn_after_s=0.25, log_every_s=5.0)
    lag.observe(due=0.0, woke=0.3)
    lag.observe(due=1.0, woke=1.4)
    lag.observe(due=2.0, woke=2.9)
    lag.observe(due=6.0, woke=6.5)
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "event loop lagging" in line]
    assert len(lines) == 2
    assert "late_wakes=1" in lines[0]
    assert "late_wakes=3" in lines[1] and "worst_lag_s=0.9" in lines[1]


async def test_the_monitor_sees_a_task_that_holds_the_loop(autojump_clock: trio.testing.MockClock) -> None:
    """A task that keeps the loop for 0.7 s without a checkpoint shows as a 0.7 s lag, and the
    monitor then wakes interval_s after it caught up."""
    lag = LoopLag(loop="test", interval_s=0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(lag.run)
        await trio.sleep(0.05)
        autojump_clock.jump(0.7)  # time passes while this task holds the loop (no checkpoint)
        await trio.sleep(0.01)  # the monitor, overdue since 0.1, runs first
        assert lag.recent_max_s == pytest.approx(0.65)
        before = time.monotonic()
        await trio.sleep(0.15)
        assert lag.recent_max_s == pytest.approx(0.65), (trio.current_time(), lag._recent)
        assert lag.last_wake_monotonic >= before
        nursery.cancel_scope.cancel()
