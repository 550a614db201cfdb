"""The checker's gang verdicts (ops/invariants.py, gang_violations): an attempt committed whole in
one transaction passes; one split across transactions, short of its size, or counted succeeded
with a task that never started fails; a rerun of a succeeded task in a later attempt is no double
placement."""

from __future__ import annotations

from ops.checker_records import AssignmentRecord, GangAttemptRecord, History, Run
from ops.invariants import double_placements, gang_violations


def _attempt(**changes: object) -> GangAttemptRecord:
    fields: dict[str, object] = {
        "gang_id": 5,
        "attempt": 1,
        "size": 2,
        "assignment_ids": (10, 11),
        "transactions": 1,
        "epochs": 1,
        "succeeded": True,
    }
    fields.update(changes)
    return GangAttemptRecord(**fields)  # type: ignore[arg-type]


def _run(assignment_id: int) -> Run:
    return Run(
        worker_id="w-1",
        incarnation=1,
        job_id=assignment_id,
        assignment_id=assignment_id,
        started_at=1.0,
        ended_at=2.0,
    )


def test_an_attempt_committed_whole_whose_tasks_all_started_passes() -> None:
    """Two assignments in one transaction, both started on their workers: no finding."""
    history = History(assignments=(), gang_attempts=(_attempt(),))
    assert gang_violations(history, [_run(10), _run(11)]) == []


def test_an_attempt_committed_in_two_transactions_is_reported() -> None:
    """A gang attempt's assignments must come from one fenced commit."""
    history = History(assignments=(), gang_attempts=(_attempt(transactions=2),))
    assert gang_violations(history, []) == [
        "gang 5 attempt 1: 2 of 2 assignments committed in 2 transactions and 1 epochs"
    ]


def test_a_partial_attempt_is_reported() -> None:
    """An attempt short of its gang's size is a partial placement."""
    history = History(assignments=(), gang_attempts=(_attempt(assignment_ids=(10,)),))
    assert len(gang_violations(history, [])) == 1


def test_a_succeeded_attempt_with_a_task_that_never_started_is_reported() -> None:
    """Every task of an attempt that succeeded must have started on its worker."""
    history = History(assignments=(), gang_attempts=(_attempt(),))
    assert gang_violations(history, [_run(10)]) == [
        "gang 5 attempt 1: succeeded, but assignments [11] never started on their workers"
    ]


def test_partial_gangs_at_the_read_are_reported() -> None:
    """A partial gang holding resources when the history was read fails the check."""
    assert gang_violations(History(assignments=(), partial_gangs=1), []) != []


def test_a_succeeded_task_placed_again_in_a_later_gang_attempt_is_no_double_placement() -> None:
    """A gang whose attempt broke runs again whole, its succeeded tasks included."""
    first = AssignmentRecord(
        assignment_id=1,
        job_id=9,
        worker_id="w-1",
        incarnation=1,
        epoch=1,
        state="finished",
        created_at=1.0,
        ended_at=2.0,
        end_reason="succeeded",
        outcome="succeeded",
        gang_attempt=1,
    )
    again = AssignmentRecord(
        assignment_id=2,
        job_id=9,
        worker_id="w-2",
        incarnation=1,
        epoch=1,
        state="active",
        created_at=3.0,
        ended_at=None,
        gang_attempt=2,
    )
    assert double_placements([first, again]) == {}
