"""`stockade logs`: the bytes as they come on stdout, notices on stderr, waiting for a job that
has not started when following, and what each refusal exits with; the limits it states. The
command goes through the Python client; the tests script its replicas' streams
(``ControlPlaneClient._stream_attempt``) and reads (``_attempt``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from typer.testing import CliRunner

from ops.cli import app
from ops.cli import logs as cli_logs
from ops.config import INSECURE_ENV
from protocol import pb
from runtime.aio import StreamLimits
from runtime.client import ControlPlaneClient
from runtime.errors import (
    ConnectionRefused,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PeerUnavailable,
    StockadeError,
)


class ScriptedReplicas:
    """Answers ReadJobLogs with scripted streams (a list of chunks, an error in it breaking the
    stream there, or an error raised before any chunk), one per replica asked, and GetJob with
    a job in ``state`` (:meth:`call`)."""

    def __init__(
        self,
        *streams: list[pb.LogChunk | StockadeError] | StockadeError,
        state: str = "pending",
        jobs: tuple[pb.JobInfo, ...] = (),
    ) -> None:
        self.streams = list(streams)
        self.state = state
        self.jobs = list(jobs)
        """GetJob's answers, in turn, before those of ``state``."""
        self.requests: list[pb.ReadJobLogsRequest] = []

    @asynccontextmanager
    async def stream(
        self, index: int, rpc_name: str, request: Any, limits: StreamLimits
    ) -> AsyncIterator[AsyncIterator[Any]]:
        assert rpc_name == "read_job_logs"
        self.requests.append(request)
        scripted = self.streams.pop(0)
        if isinstance(scripted, StockadeError):
            raise scripted

        async def chunks() -> AsyncIterator[pb.LogChunk]:
            for chunk in scripted:
                await trio.lowlevel.checkpoint()
                if isinstance(chunk, StockadeError):
                    raise chunk  # the stream breaks after the chunks before it
                yield chunk

        yield chunks()

    async def call(self, index: int, rpc_name: str, request: Any, **options: Any) -> Any:
        """The job in ``state`` while streams are left to read, then ``succeeded`` (following
        ends once the job has)."""
        assert rpc_name == "get_job"
        if self.jobs:
            return self.jobs.pop(0)
        return pb.JobInfo(job_id=request.job_id, state=self.state if self.streams else "succeeded")


def scripted(monkeypatch: pytest.MonkeyPatch, replicas: ScriptedReplicas) -> None:
    monkeypatch.setattr(ControlPlaneClient, "_stream_attempt", replicas.stream)
    monkeypatch.setattr(ControlPlaneClient, "_attempt", replicas.call)
    monkeypatch.setenv(INSECURE_ENV, "1")  # the scripted replicas need no certificate
    monkeypatch.setattr(cli_logs, "START_POLL_S", 0.0)


def invoke(*args: str, control_planes: str = "127.0.0.1:1") -> Any:
    return CliRunner().invoke(app, ["logs", *args, "--control-planes", control_planes])


def test_the_output_is_written_as_it_came_and_a_drop_is_told_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks are written to stdout byte for byte (not split at lines); a chunk after dropped
    bytes comes with a notice on stderr saying how much and by which worker."""
    replicas = ScriptedReplicas(
        [
            pb.LogChunk(data=b"", worker_id="w-2"),
            pb.LogChunk(data=b"abc", dropped_bytes=2 * 2**20, worker_id="w-2"),
            pb.LogChunk(data=b"\xffdef\n", job_ended=True, worker_id="w-2"),
        ]
    )
    scripted(monkeypatch, replicas)
    result = invoke("7", "--tail", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"abc\xffdef\n"
    assert "2.0 MiB (2,097,152 bytes) of job 7's stdout not kept by worker w-2" in result.stderr
    request = replicas.requests[0]
    assert (request.job_id, request.stream, request.has_tail, request.tail_lines, request.follow) == (
        7,
        "stdout",
        True,
        3,
        False,
    )


def test_stderr_and_follow_are_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """--stderr and --follow go into the request; no --tail reads from the start."""
    replicas = ScriptedReplicas([pb.LogChunk(data=b"x", job_ended=True)])
    scripted(monkeypatch, replicas)
    assert invoke("7", "--stderr", "--follow").exit_code == 0
    (request,) = replicas.requests
    assert (request.stream, request.follow, request.has_tail) == ("stderr", True, False)


def test_following_a_job_that_has_not_started_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """--follow on a pending job says once that it waits, asks again, and streams once it runs."""
    replicas = ScriptedReplicas(
        FailedPrecondition("job 7 has not started yet: it is pending"),
        FailedPrecondition("job 7 has not started yet: it is pending"),
        [pb.LogChunk(data=b"hello\n", job_ended=True, worker_id="w-1")],
    )
    scripted(monkeypatch, replicas)
    result = invoke("7", "--follow")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"hello\n"
    assert result.stderr.count("has not started yet: pending; waiting for it") == 1
    assert len(replicas.requests) == 3


def test_following_a_job_that_is_retried_goes_on_with_its_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Following from the start reads the job's first run, then, once it ended while the job
    will run again, waits (the next run placed but not started), then prints the next run's
    output from its start after a notice naming that run and its worker, and ends with the
    job."""
    first = pb.Attempt(assignment_id=3, state="finished")
    placed = pb.Attempt(assignment_id=4, state="active")
    replicas = ScriptedReplicas(
        [pb.LogChunk(data=b"one\n", job_ended=True, worker_id="w-1", assignment_id=3)],
        FailedPrecondition("job 7 has no run with assignment 4 that started on a worker"),
        [pb.LogChunk(data=b"two\n", job_ended=True, worker_id="w-2", assignment_id=4)],
        jobs=(
            pb.JobInfo(job_id=7, state="pending", attempt_history=[first]),
            pb.JobInfo(job_id=7, state="assigned", attempt_history=[first, placed]),
            pb.JobInfo(job_id=7, state="running", attempt_history=[first, placed]),
            pb.JobInfo(
                job_id=7,
                state="succeeded",
                attempt_history=[first, pb.Attempt(assignment_id=4, state="finished")],
            ),
        ),
    )
    scripted(monkeypatch, replicas)
    result = invoke("7", "--follow")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"one\ntwo\n"
    assert "job 7 runs again (assignment 4 on worker w-2): its stdout from the start" in result.stderr
    run = {"job_id": 7, "stream": "stdout", "follow": True, "has_offset": True, "offset": 0}
    assert replicas.requests == [
        pb.ReadJobLogsRequest(assignment_id=3, **run),
        pb.ReadJobLogsRequest(assignment_id=4, **run),
        pb.ReadJobLogsRequest(assignment_id=4, **run),
    ]
    assert replicas.jobs == []


def run_4_after(before: pb.Attempt) -> tuple[pb.JobInfo, pb.JobInfo]:
    """GetJob's answers once job 7 runs again as assignment 4 after ``before``: running, then
    succeeded."""

    def job(state: str, run: str) -> pb.JobInfo:
        return pb.JobInfo(
            job_id=7, state=state, attempt_history=[before, pb.Attempt(assignment_id=4, state=run)]
        )

    return job("running", "active"), job("succeeded", "finished")


def test_following_a_run_whose_worker_stops_answering_waits_then_goes_on_with_the_next_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Following, the run's stream breaks and its worker does not answer: while the run is
    active it is opened again from where it broke; once it has ended (its worker declared
    dead), a notice says the rest of its output is on that worker only, and the next run's
    output follows; the command exits 0 with the job."""
    unreachable = PeerUnavailable("127.0.0.1:1: UNAVAILABLE: worker w-1 is unreachable")
    running = pb.Attempt(assignment_id=3, state="active", worker_id="w-1")
    lost = pb.Attempt(assignment_id=3, state="lost", worker_id="w-1")
    replicas = ScriptedReplicas(
        [pb.LogChunk(data=b"one\n", worker_id="w-1", assignment_id=3), unreachable],
        unreachable,
        [pb.LogChunk(data=b"two\n", job_ended=True, worker_id="w-2", assignment_id=4)],
        jobs=(
            pb.JobInfo(job_id=7, state="running", attempt_history=[running]),
            pb.JobInfo(job_id=7, state="running", attempt_history=[running]),
            pb.JobInfo(job_id=7, state="pending", attempt_history=[lost]),
            *run_4_after(lost),
        ),
    )
    scripted(monkeypatch, replicas)
    result = invoke("7", "--follow")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"one\ntwo\n"
    assert (
        "the run of job 7 on worker w-1 (assignment 3) ended while its worker did not answer: "
        "the rest of its stdout is kept on that worker only" in result.stderr
    )
    assert "job 7 runs again (assignment 4 on worker w-2)" in result.stderr
    run = {"job_id": 7, "stream": "stdout", "follow": True, "has_offset": True}
    assert replicas.requests == [
        pb.ReadJobLogsRequest(assignment_id=3, offset=0, **run),
        pb.ReadJobLogsRequest(assignment_id=3, offset=4, **run),
        pb.ReadJobLogsRequest(assignment_id=4, offset=0, **run),
    ]
    assert replicas.jobs == []


def test_following_from_the_start_passes_over_a_run_whose_dead_worker_keeps_its_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Following a job whose first run was lost with its worker (declared dead, its output on
    it only) and which runs again elsewhere: a notice for the first run, then the second's
    output; exit 0 with the job."""
    dead = PeerUnavailable("127.0.0.1:1: UNAVAILABLE: worker w-3 was declared dead")
    lost = pb.Attempt(assignment_id=3, state="lost", worker_id="w-3")
    replicas = ScriptedReplicas(
        dead,
        [pb.LogChunk(data=b"two\n", job_ended=True, worker_id="w-1", assignment_id=4)],
        jobs=run_4_after(lost),
    )
    scripted(monkeypatch, replicas)
    result = invoke("7", "--follow")
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == b"two\n"
    assert "the run of job 7 on worker w-3 (assignment 3) ended while its worker did not answer" in (
        result.stderr
    )
    assert [r.assignment_id for r in replicas.requests] == [3, 4]


def test_without_follow_a_job_that_has_not_started_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --follow, a job that has not started: its state in one line, exit status 1."""
    scripted(monkeypatch, ScriptedReplicas(FailedPrecondition("job 7 has not started yet: it is pending")))
    result = invoke("7")
    assert result.exit_code == 1
    assert "error: job 7 has not started yet: it is pending" in result.stderr


def test_following_a_job_that_ended_unstarted_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """--follow on a job that ended without ever starting exits 1 at once."""
    said = "job 7 never started on a worker: it ended cancelled; it has no output"
    scripted(monkeypatch, ScriptedReplicas(FailedPrecondition(said), state="cancelled"))
    result = invoke("7", "--follow")
    assert result.exit_code == 1
    assert said in result.stderr


@pytest.mark.parametrize(
    "error",
    [
        NotFound("job_id 7 not found"),
        InvalidArgument(
            "job_id", 7, "must name a command or container job", detail="a sleep job writes no output"
        ),
    ],
)
def test_an_unknown_job_or_a_sleep_job_exits_2(monkeypatch: pytest.MonkeyPatch, error: StockadeError) -> None:
    """An unknown job, or a sleep job: the reason in one line, exit status 2."""
    scripted(monkeypatch, ScriptedReplicas(error))
    result = invoke("7")
    assert result.exit_code == 2
    assert f"error: {error}" in result.stderr


def test_a_worker_out_of_reach_is_named_once_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replica answered that the worker is out of reach: their words once (not "no
    control plane answered"), exit status 1."""
    said = "worker w-2 at 127.0.0.2:7302 is unreachable (refused): the output of job 7 is kept there only"
    failures = [PeerUnavailable(f"127.0.0.1:{p}: UNAVAILABLE: {said}", detail=said) for p in (1, 2)]
    scripted(monkeypatch, ScriptedReplicas(*failures))
    result = invoke("7", control_planes="127.0.0.1:1,127.0.0.1:2")
    assert result.exit_code == 1
    assert f"error: {said} (asked 2 control planes)" in result.stderr
    assert "no control plane answered" not in result.stderr


def test_a_dead_worker_is_named_when_another_replica_did_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """One replica is down, the other says the worker was declared dead: its words, and that
    one of the replicas asked did not answer."""
    said = "worker w-2 at 127.0.0.2:7302 was declared dead: the output of job 7 is kept on that worker only"
    failures = [
        ConnectionRefused("127.0.0.1:1 refused the connection"),
        PeerUnavailable(f"127.0.0.1:2: UNAVAILABLE: {said}", detail=said),
    ]
    scripted(monkeypatch, ScriptedReplicas(*failures))
    result = invoke("7", control_planes="127.0.0.1:1,127.0.0.1:2")
    assert result.exit_code == 1
    assert f"error: {said} (asked 2 control planes, 1 of them did not answer)" in result.stderr


def test_a_cluster_that_does_not_answer_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas that could not be reached at all: the usual message, exit status 1."""
    scripted(monkeypatch, ScriptedReplicas(ConnectionRefused("127.0.0.1:1 refused the connection")))
    result = invoke("7")
    assert result.exit_code == 1
    assert "no control plane answered at 127.0.0.1:1: connection refused" in result.stderr
