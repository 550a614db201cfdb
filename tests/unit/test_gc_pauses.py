"""The garbage-collection pause monitor: real collections, timed by the interpreter's hook."""

from __future__ import annotations

import gc

import pytest
import trio
import trio.testing

from runtime.gcpause import GcPauses


def test_a_full_collection_is_timed_as_generation_2() -> None:
    """gc.collect() runs a generation-2 collection; the hook times it and drain returns it once."""
    with GcPauses() as pauses:
        gc.collect()
        done = pauses.drain(now=0.0)
        assert 2 in [generation for generation, _ in done]
        assert all(seconds >= 0.0 for _, seconds in done)
        assert pauses.drain(now=1.0) == []
    gc.collect()
    assert pauses.drain(now=2.0) == []  # uninstalled: nothing timed


def test_long_collections_are_logged_at_most_once_per_log_every_s(capsys: pytest.CaptureFixture[str]) -> None:
    """Every collection counts as long with warn_after_s 0: two drains within log_every_s give
    one line, and the next line carries the count since."""
    with GcPauses(warn_after_s=0.0, log_every_s=5.0) as pauses:
        gc.collect()
        pauses.drain(now=0.0)
        gc.collect()
        pauses.drain(now=1.0)
        gc.collect()
        pauses.drain(now=6.0)
    captured = capsys.readouterr()
    lines = [
        line for line in (captured.out + captured.err).splitlines() if "garbage collection paused" in line
    ]
    assert len(lines) == 2
    assert "long_collections=1" in lines[0]
    assert "long_collections=2" in lines[1]


async def test_the_task_installs_the_hook_while_it_runs(autojump_clock: trio.testing.MockClock) -> None:
    """run() hooks the collector while it runs and unhooks it when cancelled."""
    pauses = GcPauses(interval_s=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(pauses.run)
        assert pauses._callback in gc.callbacks
        nursery.cancel_scope.cancel()
    assert pauses._callback not in gc.callbacks
