"""Bad input is refused with a message naming the field, the value and the limit; every size is
counted in UTF-8 bytes; docs/limits.md lists every limit as the constants state it; what the agent
reports fits the control plane's limits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from actors import validation
from actors.ingest_replies import outcome_fields
from actors.validation import check_registration
from agent.control_plane import outcome_to_pb
from agent.messages import MAX_OUTCOME_DETAIL_BYTES, MAX_OUTCOME_MS, JobState, Outcome
from protocol import pb
from runtime import validation as shared
from runtime.errors import InvalidArgument
from runtime.jobs import MAX_IMAGE_BYTES, CommandRuntime, ContainerRuntime, JobSpec, SleepRuntime
from runtime.validation import check_idempotency_key, check_job_id, check_list
from runtime.wire_jobs import job_spec_from_pb

GOOD = dict(name="j", cpu_millis=500, memory_mb=256, priority=0, sleep_ms=1000, argv=None)


def check_job(
    *, name: str, cpu_millis: int, memory_mb: int, priority: int, sleep_ms: int | None, argv: list[str] | None
) -> JobSpec:
    """A submission checked as the control plane checks it: its spec as sent (the sleep
    runtime when ``sleep_ms`` is given, the command runtime when ``argv`` is, or both), read
    off the wire, then :meth:`JobSpec.check`."""
    message = pb.JobSpec(name=name, cpu_millis=cpu_millis, memory_mb=memory_mb, priority=priority)
    if sleep_ms is not None:
        message.sleep = pb.SleepRuntime(duration_ms=sleep_ms)
    if argv is not None:
        message.command = pb.CommandRuntime(argv=argv)
    return job_spec_from_pb(message).check()


OUTCOME = dict(
    assignment_id=1,
    job_id=1,
    state="failed",
    run_ms=1000,
    ended_ago_ms=2000,
    stdout_path="",
    stderr_path="",
    detail="",
)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cpu_millis": 0}, "cpu_millis must be between 1 and 1000000, got 0"),
        ({"cpu_millis": -1}, "cpu_millis must be between 1 and 1000000, got -1"),
        ({"cpu_millis": 10**9}, "cpu_millis must be between 1 and 1000000, got 1000000000"),
        ({"memory_mb": 0}, "memory_mb must be between 1 and 16777216, got 0"),
        ({"name": ""}, "name must not be empty, got ''"),
        ({"name": "x" * 129}, "name must be at most 128 bytes in UTF-8 (has 129)"),
        ({"name": "é" * 65}, "name must be at most 128 bytes in UTF-8 (has 130)"),
        ({"name": "a\x00b"}, "name must not contain NUL bytes, got 'a\\x00b'"),
        ({"sleep_ms": None}, "runtime must be exactly one of sleep, command or container"),
        ({"argv": ["echo"]}, "runtime must be exactly one of sleep, command or container"),
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
    assert check_job(**GOOD).runtime == SleepRuntime(duration_ms=1000)  # type: ignore[arg-type]
    job = check_job(**{**GOOD, "sleep_ms": None, "argv": ["echo", ""]})  # type: ignore[arg-type]
    assert job.runtime == CommandRuntime(argv=("echo", ""))


def _container_job(image: str, argv: list[str] | None = None) -> JobSpec:
    """A container submission checked as the control plane checks it (off the wire)."""
    message = pb.JobSpec(name="c", cpu_millis=500, memory_mb=256)
    message.container = pb.ContainerRuntime(image=image, argv=argv or [])
    return job_spec_from_pb(message).check()


@pytest.mark.parametrize(
    ("image", "rule"),
    [
        ("", "must not be empty"),
        ("app;rm -rf /", "must not contain whitespace"),
        ("app;true", "must not contain shell metacharacters (;)"),
        ("app$(id)", "must not contain shell metacharacters ($()"),
        ("app`id`", "must not contain shell metacharacters (`)"),
        ("app|x", "must not contain shell metacharacters (|)"),
        ("app\tx", "must not contain whitespace"),
        ("app\x00", "must not contain NUL bytes"),
        ("/etc/passwd", "must be an image reference, not a path"),
        ("./app", "must be an image reference, not a path"),
        ("../app", "must be an image reference, not a path"),
        ("team/../app", "must be an image reference, not a path"),
        ("Ubuntu:22.04", "must be a Docker image reference"),
        ("team/App", "must be a Docker image reference"),
        ("app:", "must be a Docker image reference"),
        ("app@sha256:abc", "must be a Docker image reference"),
        ("-app", "must be a Docker image reference"),
        ("a" * (MAX_IMAGE_BYTES + 1), f"must be at most {MAX_IMAGE_BYTES} bytes in UTF-8"),
    ],
)
def test_bad_image_names_are_refused_naming_field_value_and_rule(image: str, rule: str) -> None:
    """An image that is no Docker reference, or could be read as more than one (a path, shell
    syntax), is refused as ``container.image`` with its value and the rule it broke."""
    with pytest.raises(InvalidArgument) as info:
        _container_job(image)
    message = str(info.value)
    assert message.startswith(f"container.image {rule}"), message
    assert message.endswith(f"got {image!r}"[:60]) or "..." in message


@pytest.mark.parametrize(
    "image",
    [
        "app",
        "app:1.2",
        "stockade-base-test:1",
        "team/app_x:latest",
        "registry.example:5000/team/app:1.2",
        "Registry.Example/app",
        "app@sha256:" + "a" * 64,
        "app:1@sha256:" + "0" * 64,
        "a" * MAX_IMAGE_BYTES,
    ],
)
def test_good_image_references_pass(image: str) -> None:
    """Docker's reference grammar: repository[:tag][@digest], a registry host (any case) first."""
    assert _container_job(image).runtime == ContainerRuntime(image=image)


def test_a_containers_argv_has_a_commands_limits_but_may_be_empty() -> None:
    """No argv is the image's own command; otherwise argv is checked as a command's, named
    ``container.argv``."""
    assert _container_job("app", []).runtime == ContainerRuntime(image="app", argv=())
    with pytest.raises(InvalidArgument, match=r"^container.argv\[0\] must not be empty"):
        _container_job("app", ["", "x"])
    with pytest.raises(InvalidArgument, match=r"^container.argv must have at most 256 items"):
        _container_job("app", ["x"] * 257)


@pytest.mark.parametrize("worker_id", ["", "-w", "w 1", "w/1", "x" * 65, "w\x00"])
def test_bad_worker_ids_are_refused(worker_id: str) -> None:
    """Worker ids are 1-64 safe characters."""
    with pytest.raises(InvalidArgument, match="worker_id"):
        check_registration(
            worker_id=worker_id,
            address="h:1",
            cpu_millis=1,
            memory_mb=1,
            labels={},
            agent_run_id="run",
            registration_seq=1,
        )


def test_registration_checks_address_and_capacity() -> None:
    """A registration without a port or with zero capacity is refused."""
    run = {"agent_run_id": "run-1", "registration_seq": 1}
    with pytest.raises(InvalidArgument, match="address must be host:port"):
        check_registration(worker_id="w-1", address="localhost", cpu_millis=1, memory_mb=1, labels={}, **run)
    with pytest.raises(InvalidArgument, match="memory_mb must be between 1 and"):
        check_registration(worker_id="w-1", address="h:1", cpu_millis=1, memory_mb=0, labels={}, **run)


@pytest.mark.parametrize(
    ("agent_run_id", "registration_seq", "message"),
    [
        ("", 1, "agent_run_id must not be empty, got ''"),
        ("run\n1", 1, "agent_run_id must not contain control characters"),
    ],
)
def test_a_registration_without_its_idempotency_key_is_refused(
    agent_run_id: str, registration_seq: int, message: str
) -> None:
    """The agent run id and the registration number are the registration's idempotency key:
    without them a retried registration could not be told from a new one."""
    with pytest.raises(InvalidArgument) as info:
        check_registration(
            worker_id="w-1",
            address="h:1",
            cpu_millis=1,
            memory_mb=1,
            labels={},
            agent_run_id=agent_run_id,
            registration_seq=registration_seq,
        )
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "idempotency_key must not be empty, got ''"),
        ("k" * 129, "idempotency_key must be at most 128 bytes in UTF-8 (has 129)"),
        ("a\x00b", "idempotency_key must not contain NUL bytes"),
        ("a\tb", "idempotency_key must not contain control characters"),
    ],
)
def test_bad_idempotency_keys_are_refused(key: str, message: str) -> None:
    """A mutating call's key is 1 to 128 bytes of text on one line."""
    with pytest.raises(InvalidArgument) as info:
        check_idempotency_key(key)
    assert message in str(info.value)
    uuid = "5f0c6c9e-52b0-4c1e-9d55-0b5a0f6f0a11"
    assert check_idempotency_key(uuid) == uuid


def test_list_checks_state_and_limit() -> None:
    """ListJobs refuses unknown states and huge limits, and defaults the limit to 100."""
    assert check_list("", 0) == ("", 100)
    with pytest.raises(InvalidArgument, match="state must be empty or one of"):
        check_list("sleeping", 10)
    with pytest.raises(InvalidArgument, match="limit must be between 0 and 10000, got 1000000"):
        check_list("", 10**6)
    with pytest.raises(InvalidArgument, match="limit must be between 0 and 10000, got -1"):
        check_list("", -1)


def test_ids_beyond_a_bigint_and_control_characters_are_refused() -> None:
    """Ids past 2**63 - 1 cannot exist (they would wrap or overflow); names are one line of text."""
    from actors.validation import check_incarnation

    with pytest.raises(InvalidArgument, match="job_id must be between 1 and 9223372036854775807"):
        check_job_id(2**64 + 1)
    with pytest.raises(InvalidArgument, match="incarnation must be between 0 and"):
        check_incarnation(2**63)
    with pytest.raises(InvalidArgument, match="name must not contain control characters"):
        check_job(**{**GOOD, "name": "two\nlines"})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="name must not contain control characters"):
        check_job(**{**GOOD, "name": "\x1b[31mred"})  # type: ignore[arg-type]
    assert check_job(**{**GOOD, "name": "[bold red]boom"}).name == "[bold red]boom"  # text, not markup  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="name must not contain bidirectional controls"):
        check_job(**{**GOOD, "name": "report\u202egnp.sh"})  # type: ignore[arg-type]
    joined = "\U0001f469\u200d\U0001f4bb build"  # a zero-width joiner inside an emoji is text
    assert check_job(**{**GOOD, "name": joined}).name == joined  # type: ignore[arg-type]


def test_settings_refuse_infinite_durations() -> None:
    """A duration of inf (say, a requeue backoff that would fail every requeue in SQL) is refused,
    naming the field, the rule and the value."""
    from runtime.settings.control_plane import IngestSettings
    from runtime.settings.leader import ReconcilerSettings

    with pytest.raises(InvalidArgument, match="requeue_backoff_max_s must be a finite number > 0, got inf"):
        ReconcilerSettings(requeue_backoff_max_s=float("inf"))
    with pytest.raises(InvalidArgument, match="shed_lag_s must be a finite number > 0, got nan"):
        IngestSettings(shed_lag_s=float("nan"))


def test_an_argv_element_is_limited_in_utf8_bytes_as_the_total_is() -> None:
    """The issue's input: an element of 40,000 two-byte characters (80,000 bytes, within the
    per-element limit when it counted characters) is refused as that element, in bytes; the
    total of 64 KiB is counted in the same unit, and an element that fits exactly passes."""
    with pytest.raises(InvalidArgument) as info:
        check_job(**{**GOOD, "sleep_ms": None, "argv": ["echo", "é" * 40_000]})  # type: ignore[arg-type]
    assert str(info.value).startswith("command.argv[1] must be at most 65536 bytes in UTF-8 (has 80000)")
    with pytest.raises(InvalidArgument, match=r"command\.argv must total at most 65536 bytes in UTF-8"):
        check_job(**{**GOOD, "sleep_ms": None, "argv": ["echo", "é" * 32_767]})  # type: ignore[arg-type]
    job = check_job(**{**GOOD, "sleep_ms": None, "argv": ["ee", "é" * 32_767]})  # type: ignore[arg-type]
    assert isinstance(job.runtime, CommandRuntime)
    assert sum(len(a.encode()) for a in job.runtime.argv) == validation.MAX_ARGV_BYTES


@pytest.mark.parametrize(
    ("check", "field"),
    [
        (check_idempotency_key, "idempotency_key"),
        (lambda v: validation.check_outcome("finished[0]", **{**OUTCOME, "detail": v}), "finished[0].detail"),
        (
            lambda v: validation.check_outcome("finished[0]", **{**OUTCOME, "stdout_path": v}),
            "finished[0].stdout_path",
        ),
    ],
)
def test_every_size_limit_counts_utf8_bytes(check: Callable[[str], object], field: str) -> None:
    """Each text limit counts UTF-8 bytes (identity fields are ASCII only, see
    tests/unit/test_identifiers.py): a value of two-byte characters one byte over its
    limit is refused as that field, in bytes, and one that fits exactly passes."""
    limit = {
        "idempotency_key": validation.MAX_IDEMPOTENCY_KEY_BYTES,
        "finished[0].detail": validation.MAX_DETAIL_BYTES,
        "finished[0].stdout_path": validation.MAX_PATH_BYTES,
    }[field]
    check("é" * (limit // 2))
    with pytest.raises(InvalidArgument) as info:
        check("é" * (limit // 2) + "x")
    assert str(info.value).startswith(f"{field} must be at most {limit} bytes in UTF-8 (has {limit + 1})")


def test_text_without_a_utf8_form_is_refused_naming_the_field() -> None:
    """A name holding a lone surrogate (a file name in another encoding, as Python reads it) is
    refused as the name, not with an encoding error."""
    with pytest.raises(InvalidArgument, match="name must be valid Unicode text"):
        check_job(**{**GOOD, "name": "caf\udce9"})  # type: ignore[arg-type]


def test_the_limits_page_lists_every_limit_as_the_constants_say() -> None:
    """The table of input limits in docs/limits.md is :func:`limits_table` verbatim, and every limit
    constant of actors.validation and of runtime.validation (the rules the client applies
    too) is stated by a row of it; regenerate the table with
    ``python -c 'from actors.validation import limits_table; print(limits_table())'``."""
    page = (Path(__file__).parents[2] / "docs" / "limits.md").read_text(encoding="utf-8")
    assert validation.limits_table() in page
    constants = {name for module in (validation, shared) for name in vars(module) if name.startswith("MAX_")}
    stated = {name for limit in validation.LIMITS for name in limit.constants}
    assert stated == constants


def test_the_agent_cuts_an_outcomes_detail_to_what_the_control_plane_accepts() -> None:
    """A command whose argv[0] is 64 KiB cannot start, and its reaper's detail quotes it twice:
    the outcome the agent sends still passes the control plane's checks (before, every
    heartbeat and registration carrying it was refused, and the worker fenced itself for good),
    and keeps the detail's start and end."""
    program = "x" * validation.MAX_ARGV_BYTES
    detail = f"cannot start {program!r}: [Errno 36] File name too long: {program!r}"
    outcome = Outcome(
        assignment_id=1,
        job_id=1,
        state=JobState.FAILED,
        exit_code=None,
        run_s=1.0,
        ended_at=2.0,
        detail=detail,
    )
    validation.check_outcome("finished[0]", **outcome_fields(outcome_to_pb(outcome, now=3.0)))  # type: ignore[arg-type]
    assert outcome.detail.startswith("cannot start 'xxx") and outcome.detail.endswith("xxx'")
    assert MAX_OUTCOME_DETAIL_BYTES == validation.MAX_DETAIL_BYTES


def test_the_agent_caps_an_outcomes_measures_to_what_the_control_plane_accepts() -> None:
    """An outcome whose run lasted longer than any the control plane accepts, or that ended
    before a clock's reading it cannot express, still passes its checks: the agent rounds its
    measures down and caps them (MAX_OUTCOME_MS is the control plane's limit)."""
    outcome = Outcome(
        assignment_id=1, job_id=1, state=JobState.SUCCEEDED, exit_code=0, run_s=1e15, ended_at=-1e15
    )
    message = outcome_to_pb(outcome, now=0.0)
    assert message.run_ms == message.ended_ago_ms == validation.MAX_OUTCOME_MS == MAX_OUTCOME_MS
    validation.check_outcome("finished[0]", **outcome_fields(message))  # type: ignore[arg-type]
    late = outcome_to_pb(attrs.evolve(outcome, run_s=1.2345, ended_at=10.0), now=9.0)
    assert (late.run_ms, late.ended_ago_ms) == (1234, 0)  # rounded down; an end "after" the send is 0
