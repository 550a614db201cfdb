"""One job spec (runtime.jobs) crosses every boundary unchanged: the wire (runtime.wire_jobs),
the database's columns (actors.queries), the request digest (actors.idempotency), and reads
the same to people whichever way it came."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import queries
from agent.runtimes import cannot_run, forks, timed_by_agent_s
from protocol import pb
from protocol.wire import parse
from runtime.errors import InvalidArgument
from runtime.jobs import MAX_SLEEP_MS, CommandRuntime, ContainerRuntime, JobRuntime, JobSpec, SleepRuntime
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb

texts = st.text(max_size=20)
runtimes: st.SearchStrategy[JobRuntime] = st.one_of(
    st.builds(SleepRuntime, duration_ms=st.integers(0, MAX_SLEEP_MS)),
    st.builds(CommandRuntime, argv=st.lists(texts, max_size=5).map(tuple)),
    st.builds(ContainerRuntime, image=texts, argv=st.lists(texts, max_size=5).map(tuple)),
)
specs = st.builds(
    JobSpec,
    name=texts,
    cpu_millis=st.integers(0, 2**32 - 1),
    memory_mb=st.integers(0, 2**32 - 1),
    priority=st.integers(-(2**31), 2**31 - 1),
    runtime=runtimes,
)


@given(spec=specs)
def test_a_spec_comes_back_from_the_wire_as_it_was_sent(spec: JobSpec) -> None:
    """JobSpec -> pb.JobSpec -> bytes -> pb.JobSpec -> JobSpec gives the spec it started from."""
    data = bytes(job_spec_to_pb(spec))
    assert job_spec_from_pb(parse(pb.JobSpec, data)) == spec


@given(spec=specs)
def test_a_message_with_one_runtime_comes_back_as_it_was_read(spec: JobSpec) -> None:
    """pb.JobSpec -> JobSpec -> pb.JobSpec gives the same message, in the same bytes."""
    message = job_spec_to_pb(spec)
    again = job_spec_to_pb(job_spec_from_pb(message))
    assert again == message and bytes(again) == bytes(message)


def test_the_wire_form_is_the_oneof_as_before() -> None:
    """A sleep is the oneof's ``sleep``, a command its ``command``."""
    sleep = JobSpec(name="s", cpu_millis=500, memory_mb=256, priority=-3, runtime=SleepRuntime(duration_ms=0))
    defaults = {"max_attempts": 1, "retry_backoff_ms": 1000}
    assert bytes(job_spec_to_pb(sleep)) == bytes(
        pb.JobSpec(
            name="s",
            cpu_millis=500,
            memory_mb=256,
            priority=-3,
            sleep=pb.SleepRuntime(duration_ms=0),
            **defaults,
        )
    )
    command = JobSpec(name="c", cpu_millis=1, memory_mb=1, runtime=CommandRuntime(argv=["echo", ""]))
    assert job_spec_to_pb(command) == pb.JobSpec(
        name="c", cpu_millis=1, memory_mb=1, command=pb.CommandRuntime(argv=["echo", ""]), **defaults
    )


def test_a_message_without_a_runtime_gives_a_spec_without_one_which_check_refuses() -> None:
    """No runtime set (or no spec at all) reads as runtime None; the check names the field."""
    assert job_spec_from_pb(None) == JobSpec(name="", cpu_millis=0, memory_mb=0, runtime=None)
    spec = job_spec_from_pb(pb.JobSpec(name="j", cpu_millis=1, memory_mb=1))
    assert spec.runtime is None
    with pytest.raises(
        InvalidArgument, match=r"^runtime must be exactly one of sleep, command or container, got None$"
    ):
        spec.check()


def test_a_message_with_both_runtimes_is_refused_or_read_as_none() -> None:
    """betterproto2 decodes a message setting both members of the oneof: the control plane
    refuses it naming the field; an agent (strict=False) reads it as naming no runtime."""
    both = pb.JobSpec(name="j", cpu_millis=1, memory_mb=1, sleep=pb.SleepRuntime(duration_ms=1))
    both.command = pb.CommandRuntime(argv=["true"])
    decoded = parse(pb.JobSpec, bytes(both))
    with pytest.raises(
        InvalidArgument, match=r"^runtime must be exactly one of sleep, command or container, got 'both'$"
    ):
        job_spec_from_pb(decoded)
    assert job_spec_from_pb(decoded, strict=False).runtime is None


@given(spec=specs)
def test_a_spec_comes_back_from_its_columns_as_it_was_stored(spec: JobSpec) -> None:
    """The columns a spec is stored in, read back as a row, give the spec."""
    columns = queries.job_columns(spec)
    row = {
        "name": columns.name,
        "cpu_millis": columns.cpu_millis,
        "memory_mb": columns.memory_mb,
        "priority": columns.priority,
        "runtime": columns.runtime,
        "sleep_ms": columns.sleep_ms,
        "argv": columns.argv,
        "image": columns.image,
    }
    assert queries.job_spec_of(row) == spec


def test_the_columns_of_each_runtime() -> None:
    """A sleep fills ``sleep_ms`` only, a command ``argv`` only, a container ``argv`` and
    ``image``; the batch form sends argv as JSON text; a spec without a runtime cannot be stored."""
    sleep = JobSpec(name="s", cpu_millis=1, memory_mb=2, priority=3, runtime=SleepRuntime(duration_ms=4))
    command = JobSpec(name="c", cpu_millis=5, memory_mb=6, runtime=CommandRuntime(argv=("a", "b c")))
    container = JobSpec(name="k", cpu_millis=7, memory_mb=8, runtime=ContainerRuntime(image="app:1", argv=()))
    assert queries.job_columns(sleep) == queries.JobColumns("s", 1, 2, 3, "sleep", 4, None)
    assert queries.job_columns(command) == queries.JobColumns("c", 5, 6, 0, "command", None, ["a", "b c"])
    assert queries.job_columns(container) == queries.JobColumns("k", 7, 8, 0, "container", None, [], "app:1")
    assert queries.job_column_arrays([sleep, command, container]) == (
        ["s", "c", "k"],
        [1, 5, 7],
        [2, 6, 8],
        [3, 0, 0],
        ["sleep", "command", "container"],
        [4, None, None],
        [None, '["a", "b c"]', "[]"],
        [None, None, "app:1"],
        [1, 1, 1],
        [1000, 1000, 1000],
        [False, False, False],
        [None, None, None],
        ["[]", "[]", "[]"],
        ["{}", "{}", "{}"],
        ["", "", ""],
        ["[]", "[]", "[]"],
        ["[]", "[]", "[]"],
        ["[]", "[]", "[]"],
        [None, None, None],
        [None, None, None],
        [None, None, None],
        [None, None, None],
        ["[]", "[]", "[]"],
        [1, 2, 3],
    )
    with pytest.raises(ValueError, match="has no runtime"):
        queries.job_columns(JobSpec(name="n", cpu_millis=1, memory_mb=1, runtime=None))


def test_a_spec_reads_the_same_to_people() -> None:
    """describe(): the duration in seconds for a sleep, the command as a shell reads it, - for none."""
    assert SleepRuntime(duration_ms=2500).describe() == "sleep 2.5 s"
    assert CommandRuntime(argv=("echo", "a b")).describe() == "command: echo 'a b'"
    assert ContainerRuntime(image="app:1", argv=("echo", "a b")).describe() == "container app:1 -- echo 'a b'"
    assert ContainerRuntime(image="app:1").describe() == "container app:1"
    assert JobSpec(name="n", cpu_millis=1, memory_mb=1, runtime=None).describe() == "-"


def test_the_agent_knows_each_runtime() -> None:
    """A command without a program cannot run and forks a reaper when it does; a sleep is timed
    by the agent itself."""
    assert cannot_run(CommandRuntime(argv=())) == "command argv must not be empty"
    assert cannot_run(CommandRuntime(argv=("true",))) is None
    assert cannot_run(SleepRuntime(duration_ms=0)) is None
    assert forks(CommandRuntime(argv=("true",))) and not forks(SleepRuntime(duration_ms=1))
    assert timed_by_agent_s(SleepRuntime(duration_ms=1500)) == 1.5
    assert timed_by_agent_s(CommandRuntime(argv=("true",))) is None


@pytest.mark.parametrize(("cpu_millis", "memory_mb", "field"), [(9, 64, "cpu_millis"), (100, 5, "memory_mb")])
def test_a_container_job_below_the_engines_floor_is_refused_naming_the_field(
    cpu_millis: int, memory_mb: int, field: str
) -> None:
    """The engine refuses a CPU quota under 10 millicores and a memory limit under 6 MiB, so a
    container job asking less is refused at submit, naming the field and the floor (a sleep
    or command job may ask 1)."""
    from runtime.jobs import ContainerRuntime

    spec = JobSpec(
        name="x", cpu_millis=cpu_millis, memory_mb=memory_mb, runtime=ContainerRuntime(image="a:1")
    )
    with pytest.raises(InvalidArgument, match=rf"^{field} must be at least \d+ for a container job"):
        spec.check()
