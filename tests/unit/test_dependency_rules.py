"""The rules of waiting jobs (:mod:`actors.dependencies`): when a job waiting for its
dependencies or for room in its array becomes pending, and when it is cancelled; and how the
agent names an array task's variables (:mod:`agent.job_env`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.dependencies import WaitingJob, missing_detail, plan_waiting
from agent.job_env import job_environment
from agent.messages import JobOrder
from agent.service import job_order_from_pb
from protocol import pb
from runtime.jobs import JobSpec, SleepRuntime


def test_a_job_whose_dependencies_all_succeeded_is_released() -> None:
    """Every dependency succeeded (or there is none): pending now."""
    plan = plan_waiting(
        [WaitingJob(job_id=5, after=((1, "succeeded"), (2, "succeeded"))), WaitingJob(job_id=6)], most=10
    )
    assert plan.release == (5, 6) and plan.cancel == ()


def test_a_job_with_an_unfinished_dependency_stays_waiting() -> None:
    """One dependency still running: nothing to do."""
    plan = plan_waiting([WaitingJob(job_id=5, after=((1, "succeeded"), (2, "running")))], most=10)
    assert not plan


def test_a_failed_or_cancelled_dependency_cancels_naming_the_lowest() -> None:
    """A dependency failed, another was cancelled: cancelled, naming the lowest of them, even
    while a third has not ended."""
    job = WaitingJob(job_id=9, after=((1, "running"), (3, "failed"), (2, "cancelled")))
    assert plan_waiting([job], most=10).cancel == ((9, 2),)


def test_an_arrays_tasks_are_released_only_within_its_limit_lowest_index_first() -> None:
    """Limit 3 with 1 active: the two lowest indices of the ready tasks are released."""
    tasks = [
        WaitingJob(job_id=100 + i, array_id=100, array_index=i, array_max_running=3, array_active=1)
        for i in (7, 4, 9, 5)
    ]
    assert plan_waiting(tasks, most=10).release == (104, 105)


def test_a_full_array_releases_nothing() -> None:
    """Its limit reached by active tasks: nothing is released."""
    task = WaitingJob(job_id=3, array_id=1, array_index=3, array_max_running=2, array_active=2)
    assert not plan_waiting([task], most=10)


def test_a_plan_names_at_most_most_jobs_cancellations_first() -> None:
    """The bound of one fenced write: cancellations come first."""
    jobs = [WaitingJob(job_id=i) for i in range(1, 6)] + [WaitingJob(job_id=9, after=((1, "failed"),))]
    plan = plan_waiting(jobs, most=3)
    assert plan.cancel == ((9, 1),) and plan.release == (1, 2) and plan.rows == 3


@given(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=6),
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=30, unique=True),
)
def test_an_arrays_active_tasks_never_exceed_its_limit(limit: int, active: int, indices: list[int]) -> None:
    """Whatever is waiting, released tasks plus the active ones stay within the limit (or none
    is released when it was already reached)."""
    tasks = [
        WaitingJob(job_id=1000 + i, array_id=1, array_index=i, array_max_running=limit, array_active=active)
        for i in indices
    ]
    released = plan_waiting(tasks, most=100).release
    assert len(released) == max(0, min(len(indices), limit - active))
    assert sorted(released) == sorted(1000 + i for i in sorted(indices)[: len(released)])


def test_a_refusal_names_the_missing_jobs() -> None:
    """The detail of a submission refused for dependencies that do not exist."""
    assert missing_detail([99, 100]) == "no job 99, 100; nothing was stored"


SPEC = JobSpec(name="j", cpu_millis=1, memory_mb=1, runtime=SleepRuntime(duration_ms=1))


def test_a_task_gets_its_array_index_and_id_and_a_job_gets_neither() -> None:
    """STOCKADE_ARRAY_INDEX and STOCKADE_ARRAY_ID only for a task of an array."""
    task = JobOrder(assignment_id=7, job_id=12, spec=SPEC, array_index=0, array_id=10)
    assert job_environment(task) == {
        "STOCKADE_JOB_ID": "12",
        "STOCKADE_ASSIGNMENT_ID": "7",
        "STOCKADE_ARRAY_INDEX": "0",
        "STOCKADE_ARRAY_ID": "10",
    }
    job = JobOrder(assignment_id=7, job_id=12, spec=SPEC)
    assert job_environment(job) == {"STOCKADE_JOB_ID": "12", "STOCKADE_ASSIGNMENT_ID": "7"}


def test_an_assignment_carries_the_array_index_only_when_it_has_one() -> None:
    """has_array_index tells index 0 from no index."""
    spec = pb.JobSpec(name="j", cpu_millis=1, memory_mb=1, sleep=pb.SleepRuntime(duration_ms=1))
    task = job_order_from_pb(
        pb.Assignment(assignment_id=1, job_id=3, spec=spec, has_array_index=True, array_index=0, array_id=2)
    )
    assert (task.array_index, task.array_id) == (0, 2)
    job = job_order_from_pb(pb.Assignment(assignment_id=1, job_id=3, spec=spec, array_index=0))
    assert (job.array_index, job.array_id) == (None, None)


def test_a_batch_may_hold_arrays_up_to_its_rows() -> None:
    """SubmitJobs takes arrays beside jobs; it refuses a batch whose rows (each array's tasks
    counted) pass the batch's limit, naming the spec that passes it."""
    import pytest

    from runtime.errors import InvalidArgument
    from runtime.jobs import ArrayRange
    from runtime.validation import check_jobs

    def array(last: int) -> JobSpec:
        return JobSpec(
            name="a",
            cpu_millis=1,
            memory_mb=1,
            runtime=SleepRuntime(duration_ms=1),
            array=ArrayRange(first_index=1, last_index=last),
        )

    assert len(check_jobs([SPEC, array(9999)])) == 2
    with pytest.raises(
        InvalidArgument, match=r"^specs must hold at most 10000 jobs, each array's and gang's tasks counted"
    ):
        check_jobs([SPEC, array(3), array(9997)])
