"""The garbage-collection pause monitor: real collections, timed by the interpreter's hook."""

from __future__ import annotations

import gc
import weakref

import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

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


def test_survivors_of_a_full_collection_are_frozen_and_garbage_is_not() -> None:
    """With freeze_survivors, a full collection freezes what survived it: a cycle still
    referenced is frozen, one that became garbage before the collection is freed by it."""

    class Node:
        other: Node | None = None

    def cycle() -> Node:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    kept = cycle()
    garbage = weakref.ref(cycle())
    pauses = GcPauses(freeze_survivors=True)
    try:
        with pauses:
            gc.collect()
            assert garbage() is None
            assert gc.get_freeze_count() > 0
            assert kept.other is not None
            frozen = gc.get_freeze_count()
            gc.collect(0)  # a young collection freezes nothing more (frozen objects the
            # process drops meanwhile leave the count: refcounting frees them all the same)
            assert gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


async def test_the_frozen_objects_are_given_back_every_thaw_every_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every thaw_every_s the task unfreezes, so the next full collection frees what became
    garbage after it was frozen."""

    class Node:
        other: Node | None = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    pauses = GcPauses(freeze_survivors=True, interval_s=1.0, thaw_every_s=10.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(pauses.run)
            gc.collect()  # freezes the cycle
            gone = weakref.ref(a)
            del a, b
            gc.collect()
            assert gone() is not None  # frozen: not collected
            await trio.sleep(1.5)  # the task records the full collections
            frozen = REGISTRY.get_sample_value("stockade_gc_frozen_objects")
            assert (
                frozen is not None and frozen > 0
            )  # read after the collection; freed objects leave it since
            await trio.sleep(9.0)  # the task thaws
            assert gc.get_freeze_count() == 0
            assert REGISTRY.get_sample_value("stockade_gc_frozen_objects") == 0
            pauses.uninstall()  # the next collection must not freeze it again
            gc.collect()
            assert gone() is None
            nursery.cancel_scope.cancel()
    finally:
        gc.unfreeze()
