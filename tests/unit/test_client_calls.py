"""The Python client's calls against scripted replicas (no network, a mock clock): one
idempotency key per mutating call, kept across its retries; the caller's own key sent as it is;
bad input refused before anything is sent; the replicas' refusals as typed errors; replies as
typed results; ``wait``'s reads at exact times."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from ops.client import (
    Client,
    ClientSettings,
    ClusterBusy,
    IdempotencyConflict,
    InvalidArgument,
    Job,
    JobNotFound,
    JobSpec,
    NoControlPlaneReachable,
    SleepRuntime,
    WaitTimedOut,
    WorkerNotFound,
    job_spec,
)
from ops.client.admin_results import WorkerSchedule, schedule_from_pb
from ops.client.results import (
    Attempt,
    ClusterStatus,
    ControlPlane,
    JobGang,
    Worker,
    job_from_pb,
    status_from_pb,
)
from ops.client.streams import LOG_IDLE_S, LOG_OPEN_S
from protocol import pb
from runtime.aio import StreamLimits
from runtime.backoff import FullJitterBackoff
from runtime.errors import Busy, ConnectionRefused, NotFound, Unavailable

SPEC = job_spec(cpu_millis=100, memory_mb=16, sleep_s=1)


class _Stub:
    def __getattr__(self, rpc: str) -> str:
        return rpc


@attrs.define
class Replica:
    """Stands in for one replica's channel: records each (rpc, request), answers from
    ``answers[rpc]`` (a list taken in turn, its last item kept; an exception is raised)."""

    answers: dict[str, list[Any]] = attrs.field(factory=dict)
    requests: list[tuple[str, Any]] = attrs.field(factory=list)
    times: list[float] = attrs.field(factory=list)
    """When each request came (trio time)."""
    limits: list[StreamLimits] = attrs.field(factory=list)
    """The limits each stream was opened with."""
    closed: int = 0
    """How many of its streams were ended."""

    def stub(self, stub_cls: type) -> _Stub:
        return _Stub()

    def _next(self, rpc: str) -> Any:
        script = self.answers.get(rpc) or [Unavailable(f"{rpc} not scripted")]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def call(self, rpc: str, request: Any, *, timeout_s: float) -> Any:
        self.requests.append((rpc, request))
        self.times.append(trio.current_time())
        await trio.sleep(0.01)
        return self._next(rpc)

    @asynccontextmanager
    async def stream(self, service: type, rpc: str, request: Any, limits: StreamLimits) -> AsyncIterator[Any]:
        """A server stream whose messages are ``answers[rpc]`` taken in turn (None: its end)."""
        self.requests.append((rpc, request))
        self.limits.append(limits)
        self.times.append(trio.current_time())
        replica = self

        class Messages:
            def __aiter__(self) -> Any:
                return self

            async def __anext__(self) -> Any:
                await trio.lowlevel.checkpoint()
                message = replica._next(rpc)
                if message is None:
                    raise StopAsyncIteration
                return message

        try:
            yield Messages()
        finally:
            self.closed += 1

    def close(self) -> None:
        pass


def client_of(*replicas: Replica, busy_retry_s: float = 30.0) -> Client:
    """A client whose channels are ``replicas`` (127.0.0.1:7101, :7102, ...)."""
    addresses = [f"127.0.0.1:{7101 + i}" for i in range(len(replicas))]
    client = Client(ClientSettings(control_planes=addresses, tls=None, busy_retry_s=busy_retry_s))
    client._cp.busy_backoff = FullJitterBackoff(base_s=0.1, cap_s=1.0)
    client._cp._rng = random.Random(3)
    for address, replica in zip(addresses, replicas, strict=True):
        client._cp._channels[address] = replica  # type: ignore[assignment]
    return client


SCHEDULE = pb.WorkerScheduleReply(worker_id="w-1", cordoned=True, job_ids=[4])
MUTATING: dict[str, tuple[str, Any, Callable[..., Awaitable[Any]]]] = {
    "submit": ("submit_job", pb.SubmitJobReply(job_id=9), lambda c, **k: c.submit(SPEC, **k)),
    "submit_many": (
        "submit_jobs",
        pb.SubmitJobsReply(job_ids=[9, 10]),
        lambda c, **k: c.submit_many([SPEC] * 2, **k),
    ),
    "cancel": ("cancel_job", pb.CancelJobReply(state="cancelled"), lambda c, **k: c.cancel(9, **k)),
    "cordon": ("cordon_worker", SCHEDULE, lambda c, **k: c.cordon("w-1", **k)),
    "uncordon": ("uncordon_worker", SCHEDULE, lambda c, **k: c.uncordon("w-1", **k)),
    "drain": ("drain_worker", SCHEDULE, lambda c, **k: c.drain("w-1", deadline_s=60, **k)),
}
"""Every call that changes something: its RPC, a reply, and how to make it."""


@pytest.mark.parametrize("call", sorted(MUTATING))
async def test_one_key_per_call_kept_across_its_retries(call: str) -> None:
    """The first replica does not answer, the second does: both got the same key; the next call
    (to the second, which answered last) carries another one."""
    rpc, reply, make = MUTATING[call]
    silent = Replica({rpc: [Unavailable("127.0.0.1:7101 did not answer within 2 s")]})
    answering = Replica({rpc: [reply]})
    client = client_of(silent, answering)
    await make(client)
    await make(client)
    (first,) = [request.idempotency_key for _, request in silent.requests]
    again, second = [request.idempotency_key for _, request in answering.requests]
    assert first == again and len(first) == 36
    assert second != first


@pytest.mark.parametrize("call", sorted(MUTATING))
async def test_the_callers_own_key_is_sent_on_every_retry(call: str) -> None:
    """A key the caller passes is the one every replica gets."""
    rpc, reply, make = MUTATING[call]
    silent = Replica({rpc: [Unavailable("no answer")]})
    answering = Replica({rpc: [reply]})
    await make(client_of(silent, answering), idempotency_key="batch-2026-12-01")
    keys = [request.idempotency_key for replica in (silent, answering) for _, request in replica.requests]
    assert keys == ["batch-2026-12-01", "batch-2026-12-01"]


async def test_a_key_used_for_another_request_is_refused_as_itself() -> None:
    """ALREADY_EXISTS is an IdempotencyConflict with the replica's words, not retried elsewhere."""
    conflict = IdempotencyConflict("idempotency_key 'k' was first used for submit_job with another request")
    first, second = Replica({"submit_job": [conflict]}), Replica()
    with pytest.raises(IdempotencyConflict, match="first used for submit_job"):
        await client_of(first, second).submit(SPEC, idempotency_key="k")
    assert second.requests == []


NOT_FOUND = NotFound("job_id 9 not found")
NO_WORKER = NotFound("worker_id 'w-9' not found: no worker ever registered with that id")


@pytest.mark.parametrize(
    ("make", "rpc", "error", "attribute"),
    [
        (lambda c: c.get(9), "get_job", JobNotFound, ("job_id", 9)),
        (lambda c: c.wait(9), "get_job", JobNotFound, ("job_id", 9)),
        (lambda c: c.cancel(9), "cancel_job", JobNotFound, ("job_id", 9)),
        (lambda c: c.logs(9).next(), "read_job_logs", JobNotFound, ("job_id", 9)),
        (lambda c: c.cordon("w-9"), "cordon_worker", WorkerNotFound, ("worker_id", "w-9")),
        (lambda c: c.drain("w-9"), "drain_worker", WorkerNotFound, ("worker_id", "w-9")),
    ],
)
async def test_not_found_is_a_typed_error_naming_the_id(
    make: Callable[[Client], Awaitable[Any]], rpc: str, error: type[NotFound], attribute: tuple[str, Any]
) -> None:
    """NOT_FOUND from a replica is JobNotFound or WorkerNotFound, a NotFound carrying the id
    asked for and the replica's words."""
    replica = Replica({rpc: [NO_WORKER if error is WorkerNotFound else NOT_FOUND]})
    with pytest.raises(error) as raised:
        await make(client_of(replica))
    assert isinstance(raised.value, NotFound)
    assert getattr(raised.value, attribute[0]) == attribute[1]
    assert str(raised.value) == str(NO_WORKER if error is WorkerNotFound else NOT_FOUND)


async def test_replicas_that_all_refuse_are_one_error_naming_each() -> None:
    """Both replicas refuse the connection: one NoControlPlaneReachable with both addresses and
    how each failed."""
    replicas = [
        Replica({"status": [ConnectionRefused(f"127.0.0.1:{p} refused the connection")]})
        for p in (7101, 7102)
    ]
    with pytest.raises(NoControlPlaneReachable) as raised:
        await client_of(*replicas).status()
    assert raised.value.addresses == ("127.0.0.1:7101", "127.0.0.1:7102")
    assert [str(f) for f in raised.value.failures] == [
        "127.0.0.1:7101 refused the connection",
        "127.0.0.1:7102 refused the connection",
    ]


async def test_replicas_that_stay_busy_are_asked_again_until_busy_retry_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Busy everywhere: the client backs off and asks again, then gives up with ClusterBusy."""
    replicas = [Replica({"submit_job": [Busy("busy: overloaded")]}) for _ in range(2)]
    with pytest.raises(ClusterBusy, match="every control plane is busy"):
        await client_of(*replicas, busy_retry_s=3.0).submit(SPEC)
    assert 4 < len(replicas[0].requests) == len(replicas[1].requests) < 40
    assert trio.current_time() == pytest.approx(3.0, abs=0.1)


NOTHING_SENT: list[tuple[Callable[[Client], Awaitable[Any]], str]] = [
    (
        lambda c: c.submit(JobSpec(name="x", cpu_millis=0, memory_mb=1, runtime=SleepRuntime(duration_ms=1))),
        "cpu_millis must be between 1 and 1000000, got 0",
    ),
    (lambda c: c.submit(SPEC, idempotency_key=""), "idempotency_key must not be empty"),
    (lambda c: c.submit(SPEC, idempotency_key="k" * 129), "idempotency_key must be at most 128 bytes"),
    (lambda c: c.submit_many([]), "specs must hold at least one job"),
    (lambda c: c.submit_many([SPEC] * 10_001), "specs must hold at most 10000 jobs, got 10001"),
    (
        lambda c: c.submit_many(
            [SPEC, job_spec(name="a", cpu_millis=1, memory_mb=1, sleep_s=1, after=["a"])]
        ),
        "specs[1].after_names must not close a cycle (after: cycle a -> a)",
    ),
    (
        lambda c: c.submit_many([SPEC, job_spec(cpu_millis=1, memory_mb=1, sleep_s=1, array="1-10000")]),
        "specs must hold at most 10000 jobs, each array's and gang's tasks counted, "
        "got '10001 rows by specs[1]'",
    ),
    (lambda c: c.get(0), "job_id must be between 1 and 9223372036854775807, got 0"),
    (lambda c: c.get(True), "job_id must be an integer, got True"),
    (
        lambda c: c.wait(7, timeout_s=0),
        "timeout_s must be a number of seconds > 0, or None for no limit, got 0",
    ),
    (lambda c: c.wait(7, timeout_s=float("nan")), "timeout_s must be a number of seconds > 0"),
    (lambda c: c.cancel(-1), "job_id must be between 1 and"),
    (lambda c: c.list(state="done"), "state must be empty or one of waiting, pending, assigned"),
    (lambda c: c.list(limit=10_001), "limit must be between 0 and 10000, got 10001"),
    (lambda c: c.list(limit=-1), "limit must be an integer between 0 and 10000, got -1"),
    (lambda c: c.cordon("w 1"), "worker_id"),
    (
        lambda c: c.drain("w-1", deadline_s=-1),
        "deadline_s must be between 0 and 604800 seconds (one week), got -1",
    ),
    (lambda c: c.drain("w-1", deadline_s=float("nan")), "deadline_s must be between 0 and 604800 seconds"),
]


@pytest.mark.parametrize(("make", "message"), NOTHING_SENT)
async def test_bad_input_is_refused_before_anything_is_sent(
    make: Callable[[Client], Awaitable[Any]], message: str
) -> None:
    """InvalidArgument naming the field, the value and the limit; no replica is asked."""
    replica = Replica()
    with pytest.raises(InvalidArgument) as raised:
        await make(client_of(replica))
    assert message in str(raised.value)
    assert replica.requests == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stream": "both"}, "stream must be one of stdout, stderr, got 'both'"),
        ({"tail_lines": -1}, "tail_lines must be an integer between 0 and 100000, got -1"),
        ({"tail_lines": 100_001}, "tail_lines must be an integer between 0 and 100000"),
        ({"tail_lines": 5, "tail_max_bytes": 0}, "tail_max_bytes must be an integer between 1 and"),
        ({"tail_max_bytes": 65536}, "with tail_lines (it bounds a tail), got 65536"),
    ],
)
def test_bad_log_arguments_are_refused_at_the_call(kwargs: dict[str, Any], message: str) -> None:
    """logs() refuses a bad argument at once, before any chunk is asked for."""
    replica = Replica()
    with pytest.raises(InvalidArgument) as raised:
        client_of(replica).logs(7, **kwargs)
    assert message in str(raised.value)
    assert replica.requests == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sleep_s": 1, "max_attempts": 0}, "max_attempts must be between 1 and 100, got 0"),
        ({}, "runtime must be one of sleep_s, command, or image (with an optional command), got 'none'"),
        ({"command": "echo hi"}, 'command must be a list of text, e.g. ["python3", "-c", "print(1)"], got'),
        ({"sleep_s": 1, "constraints": ["gpu ~ a100"]}, "constraints[0] must be key=value, key!=value, key"),
        ({"sleep_s": 1, "env": {"STOCKADE_X": "1"}}, "env name must not start with STOCKADE_"),
        ({"sleep_s": 1, "array": "5-1"}, "array must end at or after its first index"),
        (
            {"sleep_s": 1, "timeout_s": 0},
            "timeout_s must be at least 0.001 and at most 604800 seconds, got 0.0",
        ),
    ],
)
def test_a_spec_from_job_file_fields_is_checked_as_a_files_job_is(
    fields: dict[str, Any], message: str
) -> None:
    """job_spec names the field as a job file does, with the value and the limit."""
    with pytest.raises(InvalidArgument) as raised:
        job_spec(cpu_millis=100, memory_mb=16, **fields)
    assert message in str(raised.value)


def test_a_spec_from_job_file_fields_is_the_files() -> None:
    """Every field reaches the spec, as `stockade run` reads the same fields from a file."""
    from ops.jobfields import spec_of_table

    fields = {
        "name": "train",
        "cpu_millis": 2000,
        "memory_mb": 4096,
        "command": ["python3", "train.py"],
        "max_attempts": 3,
        "retry_backoff_s": 2.0,
        "timeout_s": 3600,
        "constraints": ["gpu=a100"],
        "env": {"MODE": "fast"},
        "workdir": "/srv/models",
        "after": [12],
    }
    assert job_spec(**fields) == spec_of_table(fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- wait


def job_in(state: str) -> pb.JobInfo:
    return pb.JobInfo(job_id=9, state=state, has_exit_code=state == "failed", exit_code=3)


async def test_wait_reads_the_job_at_growing_intervals_until_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Reads at 0, then 0.1, 0.2, 0.4, 0.8, 1.6, 2, 2 s apart (plus each read's 0.01 s); returns
    the ended job, typed."""
    replica = Replica({"get_job": [*[job_in("running")] * 7, job_in("failed")]})
    job = await client_of(replica).wait(9)
    assert (job.state, job.exit_code, job.ended) == ("failed", 3, True)
    gaps = [round(b - a - 0.01, 2) for a, b in zip(replica.times, replica.times[1:], strict=False)]
    assert gaps == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


async def test_wait_gives_up_at_its_timeout_with_the_job_as_last_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A job that keeps running: WaitTimedOut (a TimeoutError) at exactly timeout_s, naming the
    job and its last state."""
    replica = Replica({"get_job": [job_in("running")]})
    with pytest.raises(WaitTimedOut, match=r"job 9 did not end within 5 s \(still running\)") as raised:
        await client_of(replica).wait(9, timeout_s=5)
    assert isinstance(raised.value, TimeoutError)
    assert raised.value.last is not None and raised.value.last.state == "running"
    assert trio.current_time() == pytest.approx(5.0)


async def test_wait_rides_out_a_cluster_that_answers_no_one_for_a_while(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A few reads that no replica answers (the cluster restarting) are read again; the job's end
    is then returned."""
    refused = ConnectionRefused("127.0.0.1:7101 refused the connection")
    replica = Replica({"get_job": [job_in("running"), refused, refused, refused, job_in("succeeded")]})
    assert (await client_of(replica).wait(9)).state == "succeeded"


async def test_wait_raises_once_no_one_answered_for_wait_unreachable_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cluster that stays down: the last NoControlPlaneReachable, 30 s after the first failed
    read."""
    replica = Replica({"get_job": [ConnectionRefused("127.0.0.1:7101 refused the connection")]})
    with pytest.raises(NoControlPlaneReachable, match=r"127\.0\.0\.1:7101 refused the connection"):
        await client_of(replica).wait(9)
    assert 30.0 <= trio.current_time() < 33.0


# ---------------------------------------------------------------------------- typed results


def test_a_job_reply_is_a_typed_job_with_none_where_the_wire_says_none() -> None:
    """Zero and empty wire values that mean "none" are None; the spec is a JobSpec; attempts
    and array counts are typed and in order."""
    info = pb.JobInfo(
        job_id=5,
        spec=pb.JobSpec(name="nap", cpu_millis=250, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=1500)),
        state="pending",
        reason="retrying",
        attempts=1,
        failures=1,
        not_before_unix_s=1_700_000_010.0,
        array_id=4,
        array_index=2,
        array_counts=[pb.JobCount(state="running", count=3), pb.JobCount(state="pending", count=1)],
        attempt_history=[
            pb.Attempt(assignment_id=8, worker_id="w-2", epoch=3, state="finished", end_reason="failed",
                       has_exit_code=True, exit_code=1, created_unix_s=1.5, ended_unix_s=2.5, counted=True)
        ],
    )  # fmt: skip
    job = job_from_pb(info)
    assert isinstance(job, Job)
    assert job.spec is not None and (job.spec.name, job.spec.describe()) == ("nap", "sleep 1.5 s")
    assert (job.worker_id, job.assignment_id, job.epoch, job.exit_code) == (None, None, None, None)
    assert (job.submitted_unix_s, job.started_unix_s, job.not_before_unix_s) == (None, None, 1_700_000_010.0)
    assert (job.array_id, job.array_index, job.array_count("running"), job.array_count("failed")) == (
        4,
        2,
        3,
        0,
    )
    assert job.attempt_history == (
        Attempt(assignment_id=8, worker_id="w-2", epoch=3, state="finished", end_reason="failed", exit_code=1,
                created_unix_s=1.5, ended_unix_s=2.5, detail=None, counted=True),
    )  # fmt: skip
    assert not job.ended


def test_a_gang_tasks_reply_carries_its_gang_and_a_lone_jobs_none() -> None:
    """A JobInfo's gang is a JobGang with every field of it; a job without one has None."""
    gang = pb.JobGang(gang_id=7, rank=1, size=3, spread=True, state="live", attempts=2, failures=1,
                      detail="task 9 lost")  # fmt: skip
    assert job_from_pb(pb.JobInfo(job_id=9, state="running", gang=gang)).gang == JobGang(
        gang_id=7, rank=1, size=3, spread=True, state="live", attempts=2, failures=1, detail="task 9 lost"
    )
    assert job_from_pb(pb.JobInfo(job_id=10, state="running")).gang is None


def test_an_exit_code_of_zero_stays_zero() -> None:
    """has_exit_code with 0 is exit code 0, not None."""
    assert job_from_pb(pb.JobInfo(job_id=1, state="succeeded", has_exit_code=True)).exit_code == 0


def test_a_status_reply_is_a_typed_cluster_status() -> None:
    """Control planes, workers (labels sorted, deadline None when 0), counts in order, and the
    unschedulable jobs as Jobs."""
    reply = pb.StatusReply(
        leader="cp-2",
        epoch=7,
        answered_by="cp-1",
        control_planes=[
            pb.ControlPlaneInfo(id="cp-2", address="127.0.0.1:7102", role="leader", seen_unix_s=3.0)
        ],
        workers=[pb.WorkerInfo(id="w-1", address="127.0.0.1:7201", state="alive", cpu_millis=4000,
                               memory_mb=8192, cpu_allocated_millis=500, job_ids=[3, 4],
                               labels={"zone": "a", "gpu": "a100"}, cordoned=True)],
        jobs=[pb.JobCount(state="pending", count=2), pb.JobCount(state="running", count=1)],
        unschedulable=[pb.JobInfo(job_id=9, state="pending", reason="unschedulable: needs 64000 cpu_millis")],
    )  # fmt: skip
    status = status_from_pb(reply)
    assert isinstance(status, ClusterStatus)
    assert (status.leader, status.epoch, status.answered_by) == ("cp-2", 7, "cp-1")
    assert status.control_planes == (
        ControlPlane(id="cp-2", address="127.0.0.1:7102", role="leader", seen_unix_s=3.0),
    )
    (worker,) = status.workers
    assert isinstance(worker, Worker)
    assert (worker.job_ids, worker.labels) == ((3, 4), (("gpu", "a100"), ("zone", "a")))
    assert (worker.cordoned, worker.drain_deadline_unix_s, worker.memory_allocated_mb) == (True, None, 0)
    assert (status.job_count("pending"), status.job_count("failed")) == (2, 0)
    assert [job.reason for job in status.unschedulable] == ["unschedulable: needs 64000 cpu_millis"]
    assert status_from_pb(pb.StatusReply()).leader is None


def test_a_schedule_reply_is_a_typed_worker_schedule() -> None:
    """The worker's schedule after a drain: its flags, deadline and jobs."""
    reply = pb.WorkerScheduleReply(
        worker_id="w-2", cordoned=True, draining=True, drain_deadline_unix_s=9.5, job_ids=[1]
    )
    assert schedule_from_pb(reply) == WorkerSchedule(
        worker_id="w-2", cordoned=True, draining=True, drained=False, drain_deadline_unix_s=9.5, job_ids=(1,)
    )


async def test_calls_return_typed_results() -> None:
    """submit_many's ids in order, cancel's outcome, list's jobs, drain's schedule (its deadline
    sent in milliseconds)."""
    replica = Replica(
        {
            "submit_jobs": [pb.SubmitJobsReply(job_ids=[11, 12])],
            "cancel_job": [pb.CancelJobReply(state="cancelling", tasks=3)],
            "list_jobs": [pb.ListJobsReply(jobs=[job_in("running"), job_in("failed")])],
            "drain_worker": [SCHEDULE],
        }
    )
    client = client_of(replica)
    assert await client.submit_many([SPEC, SPEC]) == (11, 12)
    outcome = await client.cancel(4)
    assert (outcome.job_id, outcome.state, outcome.tasks) == (4, "cancelling", 3)
    assert [job.state for job in await client.list(state="running", limit=2)] == ["running", "failed"]
    assert (await client.drain("w-1", deadline_s=1.5)).job_ids == (4,)
    drain = replica.requests[-1][1]
    assert (drain.has_deadline, drain.deadline_ms) == (True, 1500)
    assert replica.requests[2][1] == pb.ListJobsRequest(state="running", limit=2)


async def test_a_stream_every_replica_is_too_busy_to_start_is_asked_again_after_a_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Both replicas answer busy to the first walk: after a backoff the stream is asked again
    and read from the first replica that starts it."""
    chunk = pb.LogChunk(data=b"out")
    first = Replica({"read_job_logs": [Busy("busy: cp-1"), chunk, None]})
    second = Replica({"read_job_logs": [Busy("busy: cp-2")]})
    client = client_of(first, second)
    got = [c.data async for c in client.logs(9)]
    assert got == [b"out"]
    assert [rpc for rpc, _ in first.requests] == ["read_job_logs", "read_job_logs"]
    assert len(second.requests) == 1
    assert 0 < trio.current_time() <= 0.1  # the first backoff's ceiling


async def test_a_stream_every_replica_stays_too_busy_to_start_is_cluster_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Replicas that answer busy to every walk for busy_retry_s: ClusterBusy, after that long,
    each replica asked once per walk."""
    first = Replica({"read_job_logs": [Busy("busy: cp-1")]})
    second = Replica({"read_job_logs": [Busy("busy: cp-2")]})
    with pytest.raises(ClusterBusy, match="every control plane is busy"):
        await client_of(first, second, busy_retry_s=2.0).logs(9).next()
    assert trio.current_time() == pytest.approx(2.0)
    assert len(first.requests) == len(second.requests) > 1


async def test_a_stream_that_breaks_after_a_chunk_is_opened_again_from_where_it_broke() -> None:
    """A failure after the first chunk ends that replica's stream; the stream is opened again
    (the first replica, still failing, is passed over) for the same run from the byte after
    the last received, and the output goes on from there."""
    first = Replica(
        {
            "read_job_logs": [
                pb.LogChunk(data=b"one", assignment_id=5),
                Unavailable("127.0.0.1:7101 went away"),
            ]
        }
    )
    second = Replica({"read_job_logs": [pb.LogChunk(data=b"two", assignment_id=5, offset=3), None]})
    chunks = client_of(first, second).logs(9, tail_lines=20)
    assert [chunk.data async for chunk in chunks] == [b"one", b"two"]
    resumed = pb.ReadJobLogsRequest(job_id=9, stream="stdout", assignment_id=5, has_offset=True, offset=3)
    assert second.requests == [("read_job_logs", resumed)]
    assert first.closed == 2  # the broken stream, and the one that failed at once


@pytest.mark.parametrize("follow", [False, True])
async def test_logs_give_each_replica_the_same_limits_following_or_not(follow: bool) -> None:
    """A replica has LOG_OPEN_S for its first chunk (a worker sends one at once, following or
    not) and LOG_IDLE_S between chunks (keep-alives come every 5 s while following)."""
    replica = Replica(
        {"read_job_logs": [pb.LogChunk(data=b"x"), None], "get_job": [pb.JobInfo(job_id=9, state="running")]}
    )
    assert [c.data async for c in client_of(replica).logs(9, follow=follow)] == [b"x"]
    (limits,) = replica.limits
    assert limits == StreamLimits(first_message_s=LOG_OPEN_S, idle_s=LOG_IDLE_S, timeout_s=None)
