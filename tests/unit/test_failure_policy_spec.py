"""A job's failure policy as the spec, the wire, ``stockade submit`` and a job file hold it:
retry_on_exit, no_retry_on and an array's max_failed_tasks, their rules and their round trips.
What a policy does to a failed run is schema.sql's (tests/integration/test_failure_policies.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from ops.cli.job_view import lifecycle_rows
from ops.client.results import job_from_pb
from ops.jobfields import fields_of, spec_of_options, spec_of_table
from protocol import pb
from runtime.errors import InvalidArgument
from runtime.jobs import FAILURE_REASONS, ArrayRange, CommandRuntime, JobSpec
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb


def spec(**fields: Any) -> JobSpec:
    """A command job with 3 attempts (a policy chooses among retries) and ``fields``."""
    fields = {"max_attempts": 3, **fields}
    return JobSpec(name="j", cpu_millis=100, memory_mb=16, runtime=CommandRuntime(argv=("false",)), **fields)


def options(**given: Any) -> dict[str, Any]:
    return {
        "name": None,
        "cpu_millis": 100,
        "memory_mb": 16,
        "command": ("false",),
        "max_attempts": "3",
        **given,
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"retry_on_exit": (0,)}, r"^retry_on_exit\[0\] must be between 1 and 255, got 0$"),
        ({"retry_on_exit": (1, 256)}, r"^retry_on_exit\[1\] must be between 1 and 255, got 256$"),
        ({"retry_on_exit": (-1,)}, r"^retry_on_exit\[0\] must be between 1 and 255, got -1$"),
        ({"retry_on_exit": (75, 1, 75)}, r"^retry_on_exit must list each exit code once \(75 twice\), got"),
        (
            {"no_retry_on": ("oom",)},
            r"^no_retry_on\[0\] must be a failure reason: timeout, oom_killed, .*got 'oom'$",
        ),
        (
            {"no_retry_on": ("timeout", "timeout")},
            r"^no_retry_on must list each reason once \(timeout twice\)",
        ),
        (
            {"array": ArrayRange(first_index=1, last_index=4, max_failed_tasks=5)},
            r"^array\.max_failed_tasks must be between 1 and the array's 4 tasks .*got 5$",
        ),
    ],
)
def test_a_bad_failure_policy_is_refused_naming_the_field_the_value_and_the_limit(
    fields: dict[str, Any], message: str
) -> None:
    """Exit codes out of 1..255 or listed twice, unknown or repeated reasons, and a
    max_failed_tasks above the array's tasks are refused, each naming its field and value."""
    with pytest.raises(InvalidArgument, match=message):
        spec(**fields).check()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"retry_on_exit": (1, 75)},
            r"^retry_on_exit needs max_attempts above 1 \(max_attempts is 1: no retry could happen\), "
            r"got \[1, 75\]$",
        ),
        ({"no_retry_on": ("timeout",)}, r"^no_retry_on needs max_attempts above 1 .*got \['timeout'\]$"),
    ],
)
def test_a_policy_with_one_attempt_is_refused(fields: dict[str, Any], message: str) -> None:
    """retry_on_exit or no_retry_on with max_attempts 1 could never change what happens (a failed
    run ends the job whatever it is), so it is refused naming both fields and their values."""
    with pytest.raises(InvalidArgument, match=message):
        spec(max_attempts=1, **fields).check()
    spec(max_attempts=2, **fields).check()


def test_a_policy_with_one_attempt_is_refused_from_the_command_line_and_a_job_file() -> None:
    """``--retry-on-exit 3`` without ``--max-attempts`` (1) is refused naming the option; a job
    file's ``retry_on_exit`` likewise, naming its field."""
    with pytest.raises(InvalidArgument, match=r"^--retry-on-exit needs max_attempts above 1"):
        spec_of_options(options(retry_on_exit=["3"], max_attempts=None))
    base = {"cpu_millis": 1, "memory_mb": 1, "command": ["x"]}
    with pytest.raises(InvalidArgument, match=r"^retry_on_exit needs max_attempts above 1"):
        spec_of_table({**base, "retry_on_exit": [3]})
    assert spec_of_table({**base, "retry_on_exit": [3], "max_attempts": 2}).retry_on_exit == (3,)


def test_a_policy_within_the_limits_is_accepted() -> None:
    """Every exit code 1..255 once, every reason once, and max_failed_tasks up to the array's
    tasks (0: no limit) pass."""
    spec(retry_on_exit=tuple(range(1, 256)), no_retry_on=FAILURE_REASONS).check()
    for limit in (0, 1, 4):
        spec(array=ArrayRange(first_index=1, last_index=4, max_failed_tasks=limit)).check()


policies = st.fixed_dictionaries(
    {
        "retry_on_exit": st.lists(st.integers(1, 255), unique=True, max_size=20).map(tuple),
        "no_retry_on": st.lists(st.sampled_from(FAILURE_REASONS), unique=True).map(tuple),
    }
)


@settings(max_examples=examples(100))
@given(policy=policies, tasks=st.integers(1, 50), data=st.data())
def test_a_policy_survives_the_wire_and_a_job_file(
    policy: dict[str, Any], tasks: int, data: st.DataObject
) -> None:
    """Any valid policy, with any valid max_failed_tasks, reads back the same from its
    protobuf message and from its job file's fields."""
    limit = data.draw(st.integers(0, tasks))
    job = spec(
        array=ArrayRange(first_index=0, last_index=tasks - 1, max_failed_tasks=limit), **policy
    ).check()
    assert job_spec_from_pb(job_spec_to_pb(job)) == job
    assert spec_of_table(fields_of(job)) == job


def test_submit_options_give_the_policy() -> None:
    """``--retry-on-exit 1,75 --retry-on-exit 3 --no-retry-on oom_killed,timeout --array 1-10
    --max-failed-tasks 2`` give the spec's fields in order."""
    job = spec_of_options(
        options(
            retry_on_exit=["1,75", "3"],
            no_retry_on=["oom_killed,timeout"],
            array="1-10",
            max_failed_tasks="2",
        )
    )
    assert job.retry_on_exit == (1, 75, 3)
    assert job.no_retry_on == ("oom_killed", "timeout")
    assert job.array == ArrayRange(first_index=1, last_index=10, max_failed_tasks=2)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"retry_on_exit": ["1,x"]}, r"^--retry-on-exit must be exit codes separated by commas"),
        ({"retry_on_exit": ["300"]}, r"^--retry-on-exit\[0\] must be between 1 and 255, got 300$"),
        ({"no_retry_on": ["oom_kill"]}, r"^--no-retry-on\[0\] must be a failure reason"),
        ({"max_failed_tasks": "2"}, r"^--max-failed-tasks must come with an array"),
        (
            {"max_failed_tasks": "0", "array": "1-4"},
            r"^--max-failed-tasks must be between 1 and the array's 4",
        ),
        (
            {"max_failed_tasks": "5", "array": "1-4"},
            r"^--max-failed-tasks must be between 1 and the array's 4",
        ),
    ],
)
def test_submit_refuses_a_bad_policy_naming_its_option(given: dict[str, Any], message: str) -> None:
    """Each option's error names the option as typed and the value given."""
    with pytest.raises(InvalidArgument, match=message):
        spec_of_options(options(**given))


def test_a_job_file_refuses_a_policy_of_the_wrong_type() -> None:
    """retry_on_exit must be a list of whole numbers and no_retry_on a list of text."""
    base = {"cpu_millis": 1, "memory_mb": 1, "command": ["x"]}
    base["max_attempts"] = 2
    with pytest.raises(InvalidArgument, match=r"^retry_on_exit must be a list of exit codes"):
        spec_of_table({**base, "retry_on_exit": 1})
    with pytest.raises(InvalidArgument, match=r"^retry_on_exit\[1\] must be a whole number"):
        spec_of_table({**base, "retry_on_exit": [1, "2"]})
    with pytest.raises(InvalidArgument, match=r"^no_retry_on must be a list of reasons"):
        spec_of_table({**base, "no_retry_on": "timeout"})


def test_stockade_job_shows_the_policy_and_the_arrays_limit() -> None:
    """``stockade job`` has a row for the retry policy and says when the array fails."""
    job = spec(
        retry_on_exit=(1, 75),
        no_retry_on=("oom_killed",),
        array=ArrayRange(first_index=1, last_index=4, max_failed_tasks=2),
    )
    info = job_from_pb(pb.JobInfo(job_id=1, spec=job_spec_to_pb(job), state="pending"))
    rows = dict(lifecycle_rows(info))
    assert rows["retry policy"] == "retried only on exit codes 1, 75; failed at once on oom_killed"
    assert rows["array"] == "1-4 (4 tasks, failed once 2 tasks have failed (max_failed_tasks))"
