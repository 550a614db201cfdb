"""The checker's count of device units held twice (docs/devices.md): from the database (two
active assignments of one unit) and from the workers' logs (two running jobs holding one unit,
across an agent's restart); units handed on after an end are not counted."""

from __future__ import annotations

from ops.checker import runs_from_records
from ops.checker_records import AssignmentRecord, History
from ops.invariants import check, shared_units


def assignment(aid: int, job: int, start: float, end: float | None, *units: str) -> AssignmentRecord:
    return AssignmentRecord(
        assignment_id=aid,
        job_id=job,
        worker_id="w-1",
        incarnation=1,
        epoch=1,
        state="active" if end is None else "finished",
        created_at=start,
        ended_at=end,
        units=tuple(("gpu", u) for u in units),
    )


def line(event: str, aid: int, at: float, incarnation: int = 1, **extra: object) -> dict[str, object]:
    return {
        "event": event,
        "worker_id": "w-1",
        "incarnation": incarnation,
        "job_id": aid * 10,
        "assignment_id": aid,
        "epoch": 1,
        "time": at,
        **extra,
    }


def test_units_handed_on_after_an_end_are_not_shared() -> None:
    """gpu 0 held by job 1 until 10, then by job 2 from 11: no finding, in the database or the logs."""
    assignments = [assignment(1, 10, 0.0, 10.0, "0"), assignment(2, 20, 11.0, None, "0", "1")]
    runs = runs_from_records(
        [
            line("start", 1, 1.0, units={"gpu": ["0"]}),
            line("stop", 1, 9.5),
            line("start", 2, 11.5, units={"gpu": ["0", "1"]}),
        ]
    )
    assert shared_units(assignments, runs) == {}


def test_two_active_holders_of_a_unit_are_found_in_the_database() -> None:
    """Two assignments of different jobs holding gpu 3 at overlapping times are one finding."""
    found = shared_units([assignment(1, 10, 0.0, None, "3"), assignment(2, 20, 5.0, 8.0, "3")], [])
    assert list(found) == ["w-1 gpu 3"]
    assert "job 10 (assignment 1) and job 20 (assignment 2), both active" in found["w-1 gpu 3"]


def test_two_running_holders_of_a_unit_are_found_across_an_agents_restart() -> None:
    """A job started by an agent's previous life still running (no stop line) while a job of its
    next incarnation holds the same unit: the check fails and names the unit."""
    runs = runs_from_records(
        [
            line("start", 1, 1.0, units={"gpu": ["2"]}),
            line("start", 2, 5.0, incarnation=2, units={"gpu": ["2"]}),
            line("stop", 2, 6.0, incarnation=2),
        ]
    )
    report = check(
        History(assignments=(), job_states={10: "running", 20: "succeeded"}), runs, finish_required=False
    )
    assert report.shared_units == 1 and not report.ok
    assert any(d.startswith("w-1 gpu 2: held by job 10") for d in report.details)
