"""The Python client's two faces, trio and asyncio, against a scripted control plane served for
real on 127.0.0.1 (gRPC, plaintext): the same calls give the same typed results and errors, the
asyncio face runs on the program's own loop, and an error comes out as itself."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from scripted_control_plane import ScriptedControlPlane, grpc_error, serve

from ops.client import (
    AsyncioClient,
    Client,
    ClientSettings,
    Job,
    JobNotFound,
    LogChunk,
    NoControlPlaneReachable,
    Unavailable,
    job_spec,
)
from ops.client.streams import LOG_RESUMES
from protocol import pb
from runtime.aio import asyncio_bridge

T = TypeVar("T")
ROOT = Path(__file__).parents[2]
SPEC = job_spec(cpu_millis=100, memory_mb=16, command=["echo", "hi"])


def running_then_succeeded() -> ScriptedControlPlane:
    """A replica that stores job 7, reports it running twice then succeeded with exit code 0,
    and streams its output in two chunks."""
    states = iter(["running", "running"])

    def get_job(request: pb.GetJobRequest) -> pb.JobInfo | Exception:
        if request.job_id != 7:
            return grpc_error("NOT_FOUND", f"job_id {request.job_id} not found")
        state = next(states, "succeeded")
        return pb.JobInfo(
            job_id=7,
            state=state,
            worker_id="w-1",
            assignment_id=3,
            epoch=2,
            has_exit_code=state == "succeeded",
            exit_code=0,
            spec=pb.JobSpec(
                name="echo", cpu_millis=100, memory_mb=16, command=pb.CommandRuntime(argv=["echo"])
            ),
        )

    return ScriptedControlPlane(
        submit_job=pb.SubmitJobReply(job_id=7),
        get_job=get_job,
        read_job_logs=[
            pb.LogChunk(data=b"hel", worker_id="w-1", assignment_id=3),
            pb.LogChunk(data=b"lo\n", worker_id="w-1", assignment_id=3, job_ended=True),
        ],
    )


@pytest.fixture
def replica() -> Iterator[tuple[ScriptedControlPlane, ClientSettings]]:
    """One scripted replica (:func:`running_then_succeeded`) and plaintext settings to call it."""
    service = running_then_succeeded()
    with serve(service) as (address,):
        yield service, ClientSettings(control_planes=[address], tls=None)


async def test_the_trio_face_submits_waits_and_reads_the_output(
    replica: tuple[ScriptedControlPlane, ClientSettings],
) -> None:
    """submit returns the id, wait the ended job as a typed Job, logs the chunks in order; the
    trio program opened no trio-asyncio loop itself."""
    service, settings = replica
    async with Client.open(settings) as client:
        job_id = await client.submit(SPEC)
        job = await client.wait(job_id, timeout_s=10)
        chunks = [chunk async for chunk in client.logs(job_id, follow=True)]
    assert isinstance(job, Job)
    assert (job.job_id, job.state, job.exit_code, job.worker_id, job.ended) == (
        7,
        "succeeded",
        0,
        "w-1",
        True,
    )
    assert b"".join(c.data for c in chunks) == b"hello\n"
    assert chunks[-1] == LogChunk(
        data=b"lo\n", dropped_bytes=0, job_ended=True, worker_id="w-1", assignment_id=3
    )
    # Following from the start reads the job for its first run, and the end of a run is the
    # end once the job is read as ended (no run follows).
    assert [rpc for rpc, _ in service.requests] == [
        "submit_job",
        *["get_job"] * 4,
        "read_job_logs",
        "get_job",
    ]
    assert service.sent("read_job_logs")[0] == pb.ReadJobLogsRequest(job_id=7, stream="stdout", follow=True)


def trio_asyncio_loop() -> asyncio.AbstractEventLoop:
    """The loop ``asyncio.run`` makes once ``trio_asyncio`` is imported: one of its own, which
    runs inside a trio run."""
    import trio_asyncio

    loop = asyncio.new_event_loop()
    assert isinstance(loop, trio_asyncio.BaseTrioEventLoop)
    return loop


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.SelectorEventLoop,
    "trio-asyncio": trio_asyncio_loop,
}
"""The loops an asyncio program may run on: asyncio's own (the client is then a trio guest run
on it), or trio-asyncio's (the client then crosses with that loop's own crossing)."""


@pytest.fixture(params=sorted(LOOPS))
def run_asyncio(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    """``asyncio.run`` on each kind of loop."""

    def run(main: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            return runner.run(main)

    return run


def test_the_asyncio_face_gives_the_same_results(
    replica: tuple[ScriptedControlPlane, ClientSettings], run_asyncio: Callable[[Any], Any]
) -> None:
    """The same calls from an asyncio program give the same typed results."""
    _, settings = replica

    async def main() -> tuple[int, Job, bytes]:
        async with AsyncioClient.open(settings) as client:
            job_id = await client.submit(SPEC)
            job = await client.wait(job_id, timeout_s=10)
            async with client.logs(job_id, tail_lines=5) as chunks:
                output = b"".join([chunk.data async for chunk in chunks])
        return job_id, job, output

    job_id, job, output = run_asyncio(main())
    assert (job_id, job.state, job.exit_code) == (7, "succeeded", 0)
    assert output == b"hello\n"


def test_the_asyncio_face_raises_the_typed_errors(
    replica: tuple[ScriptedControlPlane, ClientSettings], run_asyncio: Callable[[Any], Any]
) -> None:
    """NOT_FOUND from the replica is a JobNotFound naming the job, raised as itself in asyncio."""
    _, settings = replica

    async def main() -> None:
        async with AsyncioClient.open(settings) as client:
            await client.get(8)

    with pytest.raises(JobNotFound, match="job_id 8 not found") as raised:
        run_asyncio(main())
    assert raised.value.job_id == 8


def test_an_asyncio_timeout_cancels_the_call(
    replica: tuple[ScriptedControlPlane, ClientSettings], run_asyncio: Callable[[Any], Any]
) -> None:
    """asyncio.wait_for around wait cancels it: the replica is asked no more afterwards, and the
    client still answers the next call."""
    service, settings = replica
    service.answers["get_job"] = pb.JobInfo(job_id=7, state="running")

    async def main() -> Job:
        async with AsyncioClient.open(settings) as client:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.wait(7), 0.5)
            asked = len(service.sent("get_job"))
            await asyncio.sleep(0.5)
            assert len(service.sent("get_job")) == asked
            return await client.get(7)

    assert run_asyncio(main()).state == "running"


def test_two_asyncio_clients_share_the_loop_and_close_apart(
    replica: tuple[ScriptedControlPlane, ClientSettings], run_asyncio: Callable[[Any], Any]
) -> None:
    """Two clients open at once on one loop (trio allows one run per thread: they share it) both
    answer, and the second still answers once the first is closed."""
    service, settings = replica
    service.answers["get_job"] = pb.JobInfo(job_id=7, state="running")

    async def main() -> list[str]:
        first_block, second_block = AsyncioClient.open(settings), AsyncioClient.open(settings)
        first, second = await first_block.__aenter__(), await second_block.__aenter__()
        states = [job.state for job in await asyncio.gather(first.get(7), second.get(7))]
        await first_block.__aexit__(None, None, None)
        states.append((await second.get(7)).state)
        await second_block.__aexit__(None, None, None)
        return states

    assert run_asyncio(main()) == ["running"] * 3


def test_a_client_opened_while_the_last_one_closes_gets_a_fresh_run(
    replica: tuple[ScriptedControlPlane, ClientSettings], run_asyncio: Callable[[Any], Any]
) -> None:
    """A client opened while the loop's last one is closing (its guest run ending) waits for that
    end and answers from a run of its own."""
    service, settings = replica
    service.answers["get_job"] = pb.JobInfo(job_id=7, state="running")

    async def main() -> str:
        first_block = AsyncioClient.open(settings)
        await first_block.__aenter__()
        closing = asyncio.ensure_future(first_block.__aexit__(None, None, None))
        await asyncio.sleep(0)  # the close has begun: it waits for the guest run's end
        async with AsyncioClient.open(settings) as again:
            state = (await again.get(7)).state
        await closing
        return state

    assert run_asyncio(main()) == "running"


async def test_an_error_in_the_block_comes_out_as_itself(
    replica: tuple[ScriptedControlPlane, ClientSettings],
) -> None:
    """A trio program's own error inside Client.open's block is not wrapped in an exception
    group by the loop the client opened."""
    _, settings = replica
    with pytest.raises(KeyError):
        async with Client.open(settings):
            raise KeyError("mine")


async def test_a_client_in_a_thread_of_a_trio_program_opens_a_loop_of_its_own(
    replica: tuple[ScriptedControlPlane, ClientSettings],
) -> None:
    """A trio.run in a thread (which inherits its caller's context, trio-asyncio's loop
    included) opens its own loop rather than calling through the other run's."""
    _, settings = replica

    def in_thread() -> str:
        async def main() -> str:
            async with Client.open(settings) as client:
                return (await client.get(7)).state

        return trio.run(main)

    async with asyncio_bridge():
        assert await trio.to_thread.run_sync(in_thread) == "running"


async def test_every_control_plane_down_is_one_error_naming_the_addresses() -> None:
    """Nothing listens at either address: one NoControlPlaneReachable naming both, after one walk."""
    settings = ClientSettings(control_planes=["127.0.0.1:1", "127.0.0.1:2"], tls=None)
    async with Client.open(settings) as client:
        with pytest.raises(NoControlPlaneReachable) as raised:
            await client.status()
    assert raised.value.addresses == ("127.0.0.1:1", "127.0.0.1:2")
    assert "127.0.0.1:1 refused the connection" in str(raised.value)
    assert "127.0.0.1:2 refused the connection" in str(raised.value)


async def test_a_stream_is_read_from_the_next_replica_when_the_first_cannot_start_it() -> None:
    """The first replica answers UNAVAILABLE before any chunk: the output comes whole from the
    second, once."""
    down = ScriptedControlPlane(read_job_logs=grpc_error("UNAVAILABLE", "restarting"))
    up = ScriptedControlPlane(read_job_logs=[pb.LogChunk(data=b"a"), pb.LogChunk(data=b"b")])
    with serve(down, up) as addresses:
        async with Client.open(ClientSettings(control_planes=addresses, tls=None)) as client:
            chunks = [chunk.data async for chunk in client.logs(7)]
    assert chunks == [b"a", b"b"]
    assert len(down.sent("read_job_logs")) == len(up.sent("read_job_logs")) == 1


async def test_a_stream_that_breaks_after_a_chunk_goes_on_elsewhere_from_where_it_broke() -> None:
    """Once a chunk came, a broken stream is opened again (on the other replica, the first
    being gone) for the same run from the byte after the last one received: no byte twice."""

    async def breaks(request: pb.ReadJobLogsRequest) -> AsyncIterator[pb.LogChunk]:
        if request.has_offset:  # a replica going down: it opens nothing more
            raise grpc_error("UNAVAILABLE", "shutting down")

        async def chunks() -> AsyncIterator[pb.LogChunk]:
            yield pb.LogChunk(data=b"first", assignment_id=3, offset=0)
            raise grpc_error("UNAVAILABLE", "went away")

        return chunks()

    async def goes_on(request: pb.ReadJobLogsRequest) -> AsyncIterator[pb.LogChunk]:
        async def chunks() -> AsyncIterator[pb.LogChunk]:
            yield pb.LogChunk(data=b"second", assignment_id=3, offset=request.offset)

        return chunks()

    first = ScriptedControlPlane(read_job_logs=breaks)
    other = ScriptedControlPlane(read_job_logs=goes_on)
    with serve(first, other) as addresses:
        async with Client.open(ClientSettings(control_planes=addresses, tls=None)) as client:
            got = [chunk.data async for chunk in client.logs(7, tail_lines=10)]
    assert got == [b"first", b"second"]
    resumed = pb.ReadJobLogsRequest(job_id=7, stream="stdout", assignment_id=3, has_offset=True, offset=5)
    assert first.sent("read_job_logs")[1:] in ([], [resumed])  # asked first when it answered last
    assert other.sent("read_job_logs") == [resumed]


async def test_a_stream_that_keeps_breaking_ends_after_a_bounded_number_of_openings() -> None:
    """A stream that breaks again each time it is opened, sending nothing new, ends with the
    error after LOG_RESUMES openings, each from where the output stopped."""

    async def breaks(request: pb.ReadJobLogsRequest) -> AsyncIterator[pb.LogChunk]:
        async def chunks() -> AsyncIterator[pb.LogChunk]:
            yield pb.LogChunk(
                data=b"" if request.has_offset else b"once", assignment_id=3, offset=request.offset
            )
            raise grpc_error("UNAVAILABLE", "went away")

        return chunks()

    replica = ScriptedControlPlane(read_job_logs=breaks)
    with serve(replica) as addresses:
        async with Client.open(ClientSettings(control_planes=addresses, tls=None)) as client:
            got = []
            with pytest.raises(Unavailable) as raised:
                async for chunk in client.logs(7):
                    got.append(chunk.data)
    assert b"".join(got) == b"once"
    assert len(replica.sent("read_job_logs")) == 1 + LOG_RESUMES
    assert {r.offset for r in replica.sent("read_job_logs")[1:]} == {4}
    assert (
        f"(the stream of job 7's output broke and was opened again {LOG_RESUMES} times from where it "
        "broke, with no output since)"
    ) in raised.value.__notes__


async def test_a_stream_left_early_is_closed_at_the_replica() -> None:
    """Leaving ``async with client.logs(...)`` after one chunk ends the call: the replica's
    stream is cancelled rather than left sending."""
    ended = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def endless(request: pb.ReadJobLogsRequest) -> AsyncIterator[pb.LogChunk]:
        async def chunks() -> AsyncIterator[pb.LogChunk]:
            try:
                while True:
                    yield pb.LogChunk(data=b"x")
                    await asyncio.sleep(0.01)
            finally:
                token.run_sync_soon(ended.set)

        return chunks()

    service = ScriptedControlPlane(read_job_logs=endless, get_job=pb.JobInfo(job_id=7, state="running"))
    with serve(service) as addresses:
        async with Client.open(ClientSettings(control_planes=addresses, tls=None)) as client:
            async with client.logs(7, follow=True) as chunks:
                async for _ in chunks:
                    break
            with trio.fail_after(5):
                await ended.wait()


def test_an_asyncio_program_keeps_its_own_event_loop() -> None:
    """In a fresh asyncio program, the client runs on asyncio's own loop and never imports
    trio_asyncio (whose import would replace the event loop policy of the whole process)."""
    program = textwrap.dedent(
        """
        import asyncio, sys
        from ops.client import AsyncioClient, ClientSettings, NoControlPlaneReachable

        async def main():
            settings = ClientSettings(control_planes=["127.0.0.1:1"], tls=None)
            async with AsyncioClient.open(settings) as client:
                try:
                    await client.status()
                except NoControlPlaneReachable:
                    pass
            print(type(asyncio.get_running_loop()).__module__, "trio_asyncio" in sys.modules)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["asyncio.unix_events", "False"]
