"""A gang's submission rules and what its tasks are told (docs/gangs.md): bad input refused with
the field, the value and the limit; a task's seat becomes its STOCKADE_GANG_* environment."""

from __future__ import annotations

import attrs
import pytest

from agent.job_env import job_environment
from agent.messages import JobOrder
from ops.jobfields import spec_of_options, spec_of_table
from runtime.errors import InvalidArgument
from runtime.gangs import GangSeat, gang_seat_from_pb, gang_seat_to_pb
from runtime.jobs import ArrayRange, JobSpec, SleepRuntime
from runtime.validation import check_jobs
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb

SPEC = JobSpec(name="g", cpu_millis=100, memory_mb=64, runtime=SleepRuntime(duration_ms=10))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tasks": 0}, "tasks must be between 1 and 256, got 0"),
        ({"tasks": 257}, "tasks must be between 1 and 256, got 257"),
        ({"spread": True}, "spread"),
        ({"tasks": 2, "array": ArrayRange(first_index=1, last_index=2)}, "cannot be combined with array"),
    ],
)
def test_bad_gangs_are_refused_naming_field_value_and_limit(changes: dict[str, object], message: str) -> None:
    """A gang of no task, of more than MAX_GANG_TASKS, spread without tasks or an array gang is
    refused."""
    with pytest.raises(InvalidArgument, match=message):
        attrs.evolve(SPEC, **changes).check()


def test_tasks_zero_on_the_command_line_names_the_option() -> None:
    """``stockade submit --tasks 0`` is refused naming --tasks, its value and the limit."""
    options = {"cpu_millis": 100, "memory_mb": 64, "sleep_s": 1.0, "tasks": "0"}
    with pytest.raises(InvalidArgument, match="--tasks must be between 1 and 256, got 0"):
        spec_of_options(options)


def test_a_job_files_tasks_and_spread_make_a_gang() -> None:
    """A job file's ``tasks`` and ``spread`` are read as the spec's."""
    spec = spec_of_table({"cpu_millis": 100, "memory_mb": 64, "sleep_s": 1, "tasks": 4, "spread": True})
    assert (spec.tasks, spec.spread) == (4, True)


def test_a_gang_travels_the_wire_unchanged() -> None:
    """tasks and spread survive the wire; an unset tasks reads as no gang."""
    gang = attrs.evolve(SPEC, tasks=3, spread=True)
    assert job_spec_from_pb(job_spec_to_pb(gang)) == gang
    assert job_spec_from_pb(job_spec_to_pb(SPEC)).tasks is None


def test_a_gang_may_ask_devices_for_each_task() -> None:
    """A gang asking gpu passes the checks, and its per-task ask survives the wire."""
    gang = attrs.evolve(SPEC, tasks=2, resources={"gpu": 2})
    gang.check()
    assert job_spec_from_pb(job_spec_to_pb(gang)).resources == (("gpu", 2),)


def test_a_batch_holds_gangs_each_task_counted() -> None:
    """A batch may hold gangs beside other jobs; their tasks count against the batch's rows, and
    a bad gang is refused naming its index (``specs[1].tasks``)."""
    assert check_jobs([SPEC, attrs.evolve(SPEC, tasks=2)])[1].tasks == 2
    with pytest.raises(InvalidArgument, match=r"^specs\[1\]\.tasks must be between 1 and 256, got 0"):
        check_jobs([SPEC, attrs.evolve(SPEC, tasks=0)])
    with pytest.raises(InvalidArgument, match=r"^specs\[0\]\.spread"):
        check_jobs([attrs.evolve(SPEC, spread=True)])
    gangs = [attrs.evolve(SPEC, name=f"g{n}", tasks=256) for n in range(39)]
    assert len(check_jobs([*gangs, attrs.evolve(SPEC, tasks=16)])) == 40  # 10,000 rows
    with pytest.raises(
        InvalidArgument, match=r"^specs .*gang's tasks counted, got '10001 rows by specs\[40\]'"
    ):
        check_jobs([*gangs, attrs.evolve(SPEC, tasks=16), SPEC, SPEC])


def test_a_gang_tasks_environment_names_its_rank_size_port_and_peers() -> None:
    """The agent sets STOCKADE_GANG_RANK, _SIZE, _PORT and _PEERS (host:port by rank) from the seat."""
    seat = GangSeat(gang_id=7, rank=1, size=2, port=42001, peers=("10.0.0.1:42000", "10.0.0.2:42001"))
    assert gang_seat_from_pb(gang_seat_to_pb(seat)) == seat
    env = job_environment(JobOrder(assignment_id=3, job_id=8, spec=SPEC, gang=seat))
    assert env["STOCKADE_GANG_RANK"] == "1"
    assert env["STOCKADE_GANG_SIZE"] == "2"
    assert env["STOCKADE_GANG_PORT"] == "42001"
    assert env["STOCKADE_GANG_PEERS"] == "10.0.0.1:42000,10.0.0.2:42001"
    assert env["STOCKADE_GANG_ID"] == "7"
