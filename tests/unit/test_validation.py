"""Bad input is refused with a message naming the field, the value and the limit."""

from __future__ import annotations

import pytest

from actors.validation import check_job, check_list, check_registration
from runtime.errors import InvalidArgument

GOOD = dict(name="j", cpu_millis=500, memory_mb=256, priority=0, sleep_ms=1000, argv=None)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cpu_millis": 0}, "cpu_millis must be between 1 and 1000000, got 0"),
        ({"cpu_millis": -1}, "cpu_millis must be between 1 and 1000000, got -1"),
        ({"cpu_millis": 10**9}, "cpu_millis must be between 1 and 1000000, got 1000000000"),
        ({"memory_mb": 0}, "memory_mb must be between 1 and 16777216, got 0"),
        ({"name": ""}, "name must not be empty, got ''"),
        ({"name": "x" * 129}, "name must be at most 128 characters (has 129)"),
        ({"name": "a\x00b"}, "name must not contain NUL bytes, got 'a\\x00b'"),
        ({"sleep_ms": None}, "runtime must be exactly one of sleep or command"),
        ({"argv": ["echo"]}, "runtime must be exactly one of sleep or command"),
        ({"sleep_ms": None, "argv": []}, "command.argv must name a program"),
        ({"sleep_ms": None, "argv": ["ec\x00ho"]}, "command.argv[0] must not contain NUL bytes"),
        ({"sleep_ms": 10**12}, "sleep.duration_ms must be between 0 and 604800000"),
    ],
)
def test_bad_jobs_are_refused_with_field_value_and_limit(changes: dict[str, object], message: str) -> None:
    """Each bad field is named with its value and the rule it broke."""
    with pytest.raises(InvalidArgument) as info:
        check_job(**{**GOOD, **changes})  # type: ignore[arg-type]
    assert message in str(info.value)


def test_a_good_job_passes() -> None:
    """A valid sleep job and a valid command job are accepted as given."""
    assert check_job(**GOOD).runtime == "sleep"  # type: ignore[arg-type]
    job = check_job(**{**GOOD, "sleep_ms": None, "argv": ["echo", ""]})  # type: ignore[arg-type]
    assert job.argv == ("echo", "") and job.runtime == "command"


@pytest.mark.parametrize("worker_id", ["", "-w", "w 1", "w/1", "x" * 65, "w\x00"])
def test_bad_worker_ids_are_refused(worker_id: str) -> None:
    """Worker ids are 1-64 safe characters."""
    with pytest.raises(InvalidArgument, match="worker_id"):
        check_registration(worker_id=worker_id, address="h:1", cpu_millis=1, memory_mb=1, labels={})


def test_registration_checks_address_and_capacity() -> None:
    """A registration without a port or with zero capacity is refused."""
    with pytest.raises(InvalidArgument, match="address must be host:port"):
        check_registration(worker_id="w-1", address="localhost", cpu_millis=1, memory_mb=1, labels={})
    with pytest.raises(InvalidArgument, match="memory_mb must be between 1 and"):
        check_registration(worker_id="w-1", address="h:1", cpu_millis=1, memory_mb=0, labels={})


def test_list_checks_state_and_limit() -> None:
    """ListJobs refuses unknown states and huge limits, and defaults the limit to 100."""
    assert check_list("", 0) == ("", 100)
    with pytest.raises(InvalidArgument, match="state must be empty or one of"):
        check_list("sleeping", 10)
    with pytest.raises(InvalidArgument, match="limit must be at most 10000"):
        check_list("", 10**6)


def test_ids_beyond_a_bigint_and_control_characters_are_refused() -> None:
    """Ids past 2**63 - 1 cannot exist (they would wrap or overflow); names are one line of text."""
    from actors.validation import check_incarnation, check_job_id

    with pytest.raises(InvalidArgument, match="job_id must be between 1 and 9223372036854775807"):
        check_job_id(2**64 + 1)
    with pytest.raises(InvalidArgument, match="incarnation must be between 0 and"):
        check_incarnation(2**63)
    with pytest.raises(InvalidArgument, match="name must not contain control characters"):
        check_job(**{**GOOD, "name": "two\nlines"})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="name must not contain control characters"):
        check_job(**{**GOOD, "name": "\x1b[31mred"})  # type: ignore[arg-type]
    assert check_job(**{**GOOD, "name": "[bold red]boom"}).name == "[bold red]boom"  # text, not markup  # type: ignore[arg-type]


def test_settings_refuse_infinite_durations() -> None:
    """A duration of inf (say, a requeue backoff that would fail every requeue in SQL) is refused,
    naming the field, the rule and the value."""
    from runtime.settings import IngestSettings, ReconcilerSettings

    with pytest.raises(InvalidArgument, match="requeue_backoff_max_s must be a finite number > 0, got inf"):
        ReconcilerSettings(requeue_backoff_max_s=float("inf"))
    with pytest.raises(InvalidArgument, match="shed_lag_s must be a finite number > 0, got nan"):
        IngestSettings(shed_lag_s=float("nan"))
