"""A chaos run that cannot go on records why and ends its injection, whether the abort is
raised in the run's own body, inside its nursery, or by a task of it (ops.chaos)."""

from __future__ import annotations

import pytest
import trio

from ops.chaos import recording_aborts
from ops.faults import FaultError


async def test_an_abort_inside_a_nursery_is_recorded_not_raised() -> None:
    errors: list[str] = []
    with recording_aborts(errors):
        async with trio.open_nursery():
            raise FaultError("no new leader within 20 s after cp-3 failed")
    assert errors == ["no new leader within 20 s after cp-3 failed"]


async def test_aborts_of_several_tasks_are_all_recorded() -> None:
    async def fail(message: str) -> None:
        raise FaultError(message)

    errors: list[str] = []
    with recording_aborts(errors):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail, "w-2 is not running")
            nursery.start_soon(fail, "the jobs of w-3 did not run elsewhere in time")
    assert sorted(errors) == ["the jobs of w-3 did not run elsewhere in time", "w-2 is not running"]


async def test_a_bare_abort_is_recorded() -> None:
    errors: list[str] = []
    with recording_aborts(errors):
        raise FaultError("no worker has jobs")
    assert errors == ["no worker has jobs"]


async def test_other_errors_propagate() -> None:
    errors: list[str] = []
    with pytest.raises(ExceptionGroup) as raised, recording_aborts(errors):
        async with trio.open_nursery():
            raise ValueError("a bug, not an abort")
    assert raised.group_contains(ValueError)
    assert errors == []
