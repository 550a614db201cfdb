"""``stockade cancel`` of a gang's task speaks of the gang (docs/gangs.md): the cancel reaches every
task, and the verdict names the gang and its tasks, as an array's names the array."""

from __future__ import annotations

from typing import Any

import attrs
import trio
from trio.testing import MockClock

from ops.cli.jobs import _cancel, gang_cancel_verdict
from ops.client.results import CancelOutcome, JobGang

GANG = JobGang(gang_id=118, rank=2, size=4, spread=True, state="cancelled", attempts=1, failures=0, detail="")


@attrs.frozen
class Read:
    """The parts of a job that ``_cancel`` reads."""

    state: str
    gang: JobGang | None = None
    array_counts: tuple[tuple[str, int], ...] = ()

    @property
    def ended(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


@attrs.define
class Scripted:
    """A client whose cancel answers ``outcome`` and whose reads answer ``reads`` in turn."""

    outcome: CancelOutcome
    reads: list[Read]

    async def cancel(self, job_id: int, **_: Any) -> CancelOutcome:
        return self.outcome

    async def get(self, job_id: int) -> Read:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


def test_a_cancel_of_a_gang_task_names_the_gang_and_its_tasks() -> None:
    """A cancel of task 120 of gang 118 (4 tasks, all pending) is ``gang 118: 4 tasks
    cancelled``, not an array's words."""
    client = Scripted(CancelOutcome(job_id=120, state="cancelled", tasks=4), [Read("cancelled", GANG)])
    job, tasks, gang_id = trio.run(lambda: _cancel(client, 120, task_only=False, wait_s=1, key="k"))  # type: ignore[arg-type]
    assert (tasks, gang_id) == (4, 118)
    assert gang_cancel_verdict(118, tasks, job) == "gang 118: 4 tasks cancelled"  # type: ignore[arg-type]


def test_a_placed_gang_is_cancelling_until_its_task_ended() -> None:
    """Placed tasks are stopped through their workers: the command reads the task until it
    ended; when the wait runs out first it says the gang is cancelling."""
    outcome = CancelOutcome(job_id=118, state="cancelling", tasks=4)
    running, done = Read("running", GANG), Read("cancelled", GANG)
    client = Scripted(outcome, [running, running, done])
    job, tasks, gang_id = trio.run(
        lambda: _cancel(client, 118, task_only=False, wait_s=60, key="k"),  # type: ignore[arg-type]
        clock=MockClock(autojump_threshold=0),
    )
    assert job == done and gang_id == 118
    assert gang_cancel_verdict(118, tasks, job) == "gang 118: 4 tasks cancelled"  # type: ignore[arg-type]
    assert gang_cancel_verdict(118, 4, None) == "gang 118: cancelling 4 tasks"


def test_an_arrays_cancel_is_no_gangs() -> None:
    """An array's id cancels its tasks and names no gang."""
    client = Scripted(CancelOutcome(job_id=5, state="cancelled", tasks=3), [Read("cancelled")])
    _, tasks, gang_id = trio.run(lambda: _cancel(client, 5, task_only=False, wait_s=1, key="k"))  # type: ignore[arg-type]
    assert (tasks, gang_id) == (3, None)
