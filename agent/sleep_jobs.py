"""Sleep jobs: no process, the agent decides when they stopped. One ends once it has *run* its
full duration, the worker's pauses not counted, also when the agent notices later; stopped while
paused, it ended when the pause began."""

from __future__ import annotations

import math
from typing import Protocol

import trio

from agent.fence import MAX_PAUSES
from agent.job_results import JobResult
from agent.messages import JobState
from runtime.jobs import SleepRuntime


class PauseView(Protocol):
    """What a sleep job needs to know of its worker's pauses (:class:`agent.fence.FenceClock`):
    paused time does not count against its duration."""

    @property
    def changed(self) -> trio.Event:
        """Set when the jobs pause, resume or are fenced (a fresh one is armed after)."""

    def paused_since(self) -> float | None:
        """trio time the jobs count as paused from, while they are; None while they run."""

    def paused_s_between(self, start: float, end: float) -> float:
        """Seconds of pause between trio times ``start`` and ``end``."""


async def either(first: trio.Event, second: trio.Event) -> None:
    """Return once ``first`` or ``second`` is set."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


def sleep_end(began: float, duration_s: float, pause: PauseView, now: float) -> float:
    """The trio time a sleep job begun at ``began`` has run ``duration_s`` seconds by, as known
    at ``now``: its pauses do not count. Not run that long yet: ``now`` plus what is left, or
    ``inf`` while it is paused (it ends only after it resumes). Run that long: the time it was
    reached, found by adding the pauses that fell before it until none is left to add.
    """
    ran_s = (now - began) - pause.paused_s_between(began, now)
    if ran_s < duration_s:
        return math.inf if pause.paused_since() is not None else now + (duration_s - ran_s)
    end = began + duration_s
    for _ in range(2 * MAX_PAUSES):
        later = began + duration_s + pause.paused_s_between(began, end)
        if later <= end:
            break
        end = later
    return min(end, now)


async def run_sleep(spec: SleepRuntime, *, stop: trio.Event, pause: PauseView | None = None) -> JobResult:
    """Hold the job's resources for its duration, its pauses not counted (see the module
    docstring), or until ``stop`` is set."""
    began = trio.current_time()
    duration_s = spec.duration_ms / 1000.0
    end = began + duration_s
    while True:
        now = trio.current_time()
        if pause is not None:
            end = sleep_end(began, duration_s, pause, now)
        if end <= now:
            # Ended when it ran out, even if noticed later.
            return JobResult(
                state=JobState.SUCCEEDED, stopped=False, exit_code=0, began_at=began, ended_at=end
            )
        held_from = None if pause is None else pause.paused_since()
        if stop.is_set():
            return JobResult(
                state=JobState.CANCELLED,
                stopped=True,
                exit_code=None,
                began_at=began,
                ended_at=now if held_from is None else max(began, held_from),
                detail="stopped before its duration ran out",
            )
        if pause is not None and held_from is not None:
            await either(stop, pause.changed)  # resumed, fenced, or stopped
            continue
        # A pause that begins meanwhile only makes it end later: the next turn finds it out.
        with trio.move_on_at(end):
            await stop.wait()
