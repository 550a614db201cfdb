"""Worker.ReadLogs over real gRPC on 127.0.0.1, from a real agent running real command jobs that
write real files: follow, tail, a finished job, stderr, a reader that goes away, unknown
assignments; and a job that writes as fast as it can under a 1 MiB cap, whose file stays
bounded while the agent's heartbeats, seen by a scripted control plane, stay on time."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from prometheus_client import REGISTRY

from agent.core import Agent
from agent.main import run_agent
from protocol import pb
from protocol.bases import ControlPlaneBase, WorkerBase
from runtime.aio import GrpcChannel, StreamLimits, asyncio_bridge, serve_grpc, trio_service
from runtime.errors import InvalidArgument, NotFound
from runtime.settings.agent import (
    AgentSettings,
    OutputSettings,
)

RPC_TIMEOUT_S = 5.0
MIB = 1024 * 1024


@attrs.define
class ScriptedControlPlane:
    """Takes registrations and heartbeats (noting when each heartbeat arrived, trio time)."""

    heartbeat_times: list[float] = attrs.field(factory=list)
    heartbeats: list[pb.HeartbeatRequest] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self._touch()
        return pb.RegisterWorkerReply(incarnation=1, epoch=1)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeat_times.append(trio.current_time())
        self.heartbeats.append(request)
        self._touch()
        return pb.HeartbeatReply(epoch=1)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
        with trio.fail_after(timeout_s):
            while not predicate():
                await self.changed.wait()

    def finished(self) -> set[int]:
        return {o.assignment_id for hb in self.heartbeats for o in hb.finished}


@attrs.frozen
class Worker:
    agent: Agent
    cp: ScriptedControlPlane
    channel: GrpcChannel
    work_dir: Path

    async def run(self, aid: int, script: str) -> None:
        """Start command job ``aid`` (job ``aid * 10``): ``python3 -c script``."""
        request = pb.AssignRequest(
            epoch=1,
            worker_id="w-1",
            incarnation=self.agent.incarnation or 0,
            assignments=[
                pb.Assignment(
                    assignment_id=aid,
                    job_id=aid * 10,
                    committed_epoch=1,
                    spec=pb.JobSpec(
                        name=f"job-{aid}",
                        cpu_millis=100,
                        memory_mb=64,
                        command=pb.CommandRuntime(argv=[sys.executable, "-c", script]),
                    ),
                )
            ],
        )
        reply = await self.channel.call(
            self.channel.stub(pb.WorkerStub).assign, request, timeout_s=RPC_TIMEOUT_S
        )
        assert list(reply.accepted_ids) == [aid]

    async def ended(self, aid: int) -> None:
        await self.cp.wait_for(lambda: aid in self.cp.finished())

    def stream(self, aid: int, **fields: Any) -> Any:
        request = pb.ReadLogsRequest(worker_id="w-1", job_id=aid * 10, assignment_id=aid, **fields)
        return self.channel.stream(WorkerBase, "read_logs", request, StreamLimits(RPC_TIMEOUT_S))

    async def read(self, aid: int, **fields: Any) -> list[pb.LogChunk]:
        async with self.stream(aid, **fields) as chunks:
            return [chunk async for chunk in chunks]

    def job_dir(self, aid: int) -> Path:
        return self.agent.jobs_dir / f"{aid * 10}-{aid}"


@asynccontextmanager
async def worker(tmp_path: Path, output: OutputSettings | None = None) -> AsyncIterator[Worker]:
    """A scripted control plane and one agent (heartbeats every 0.25 s), on 127.0.0.1."""
    cp = ScriptedControlPlane()
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        settings = AgentSettings(
            worker_id="w-1",
            control_planes=(f"127.0.0.1:{cp_port}",),
            cpu_millis=4000,
            memory_mb=4096,
            work_dir=str(tmp_path),
            heartbeat_interval_s=0.25,
            heartbeat_timeout_s=1.0,
            labels={"container": "none"},
            output=output or OutputSettings(follow_poll_s=0.05),
        )
        agent: Agent = await nursery.start(run_agent, settings)
        channel = GrpcChannel(agent.address)
        try:
            with trio.fail_after(10):
                await agent.wait_registered()
            yield Worker(agent=agent, cp=cp, channel=channel, work_dir=tmp_path)
        finally:
            channel.close()
            nursery.cancel_scope.cancel()


async def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Return once ``condition()`` holds, looking every 20 ms (it is no event's to announce)."""
    with trio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.02)


def data_of(chunks: list[pb.LogChunk]) -> bytes:
    return b"".join(c.data for c in chunks)


STEPS = "import sys, time\nfor w in ('one', 'two', 'three'):\n    print(w, flush=True)\n    time.sleep(0.4)\n"


async def test_follow_streams_a_running_jobs_output_until_it_ends(tmp_path: Path) -> None:
    """Following a job that prints a line every 0.4 s: its first line arrives while it still
    runs, every line comes in order, and the last chunk says the job ended."""
    async with worker(tmp_path) as w:
        await w.run(1, STEPS)
        seen_while_running = False
        chunks = []
        async with w.stream(1, follow=True) as stream:
            async for chunk in stream:
                chunks.append(chunk)
                if b"one" in data_of(chunks) and w.agent.job_done(1) is not None:
                    seen_while_running = seen_while_running or not w.agent.job_done(1).is_set()  # type: ignore[union-attr]
    assert seen_while_running
    assert data_of(chunks) == b"one\ntwo\nthree\n"
    assert chunks[-1].job_ended and not any(c.job_ended for c in chunks[:-1])
    assert {(c.worker_id, c.assignment_id) for c in chunks} == {("w-1", 1)}


async def test_a_tail_of_a_finished_job_is_its_last_lines(tmp_path: Path) -> None:
    """A job that printed 1..10 and ended: a tail of 3 is "8\\n9\\n10\\n", ending with job_ended."""
    async with worker(tmp_path) as w:
        await w.run(2, "for i in range(1, 11): print(i)")
        await w.ended(2)
        chunks = await w.read(2, has_tail=True, tail_lines=3)
    assert data_of(chunks) == b"8\n9\n10\n"
    assert chunks[-1].job_ended


async def test_chunks_say_where_they_begin_and_a_read_may_begin_at_an_offset(tmp_path: Path) -> None:
    """Each chunk's offset is where its data begins in the output (a tail's first chunk too);
    a read from an offset sends the output from that byte on."""
    async with worker(tmp_path) as w:
        await w.run(9, "for i in range(1, 11): print(i)")
        await w.ended(9)
        tail = await w.read(9, has_tail=True, tail_lines=3)
        rest = await w.read(9, has_offset=True, offset=tail[0].offset + 2)
    whole = b"".join(f"{i}\n".encode() for i in range(1, 11))
    assert tail[0].offset == whole.index(b"8\n") and data_of(tail) == b"8\n9\n10\n"
    assert rest[0].offset == tail[0].offset + 2 and data_of(rest) == b"9\n10\n"
    assert rest[-1].job_ended


async def test_a_finished_jobs_whole_output_and_its_stderr(tmp_path: Path) -> None:
    """Without a tail, all of stdout; with stream stderr, what it wrote there."""
    async with worker(tmp_path) as w:
        await w.run(3, "import sys; print('out'); print('err', file=sys.stderr)")
        await w.ended(3)
        assert data_of(await w.read(3)) == b"out\n"
        assert data_of(await w.read(3, stream="stderr")) == b"err\n"


async def test_a_large_output_comes_whole_in_bounded_chunks(tmp_path: Path) -> None:
    """A 1 MiB output arrives byte for byte, in chunks of at most 64 KiB."""
    async with worker(tmp_path) as w:
        await w.run(4, "import sys; sys.stdout.write(''.join(chr(65 + i % 26) for i in range(1 << 20)))")
        await w.ended(4)
        chunks = await w.read(4)
    assert data_of(chunks) == bytes(65 + i % 26 for i in range(1 << 20))
    assert max(len(c.data) for c in chunks) <= 64 * 1024


async def test_a_tail_bounded_in_bytes_sends_no_more_of_a_huge_line(tmp_path: Path) -> None:
    """A job that wrote one 20 MB line: a tail of 50 lines bounded to 65,537 bytes sends
    exactly the last 65,537 bytes, the line's end."""
    async with worker(tmp_path) as w:
        await w.run(8, "import sys; sys.stdout.write('x' * 20_000_000 + 'end of the line\\n')")
        await w.ended(8)
        data = data_of(await w.read(8, has_tail=True, tail_lines=50, tail_max_bytes=65_537))
    assert len(data) == 65_537
    assert data.endswith(b"xxend of the line\n") and set(data[:-16]) == {ord("x")}


def readers() -> float:
    return REGISTRY.get_sample_value("stockade_agent_log_readers", {"worker_id": "w-1"}) or 0.0


async def test_a_reader_that_goes_away_stops_the_workers_reading(tmp_path: Path) -> None:
    """A follower of a quiet running job reads its first chunk and leaves: the worker's reader
    ends (the agent serves no stream any more), while the job runs on."""
    async with worker(tmp_path) as w:
        await w.run(5, "import time; print('hello', flush=True); time.sleep(60)")
        before = readers()
        async with w.stream(5, follow=True) as stream:
            await anext(stream)
            assert readers() == before + 1
        await eventually(lambda: readers() == before)
        done = w.agent.job_done(5)
        assert done is not None and not done.is_set()


async def test_an_assignment_the_worker_never_ran_is_not_found(tmp_path: Path) -> None:
    """ReadLogs of an assignment with no folder here is NOT_FOUND, naming the worker and folder."""
    async with worker(tmp_path) as w:
        with pytest.raises(NotFound, match=r"worker w-1 keeps no output of job 90 \(assignment 9\)"):
            await w.read(9)


async def test_a_request_for_another_worker_is_refused(tmp_path: Path) -> None:
    """A ReadLogs naming another worker id is INVALID_ARGUMENT."""
    async with worker(tmp_path) as w:
        request = pb.ReadLogsRequest(worker_id="w-2", job_id=10, assignment_id=1)
        with pytest.raises(InvalidArgument, match="must be this worker's id"):
            async with w.channel.stream(
                WorkerBase, "read_logs", request, StreamLimits(RPC_TIMEOUT_S)
            ) as chunks:
                await anext(chunks)


NUMBERED = "import sys\nfor i in range(300_000):\n    sys.stdout.write('%09d\\n' % i)\nsys.stdout.flush()\n"
"""Writes 3,000,000 bytes: 300,000 numbered lines of 10 bytes."""


async def test_an_output_over_its_cap_keeps_its_newest_part_and_says_what_was_dropped(tmp_path: Path) -> None:
    """A job that wrote 3 MB under a 1 MiB cap: its file takes about the cap on disk, and a
    reader from the start is told of the dropped bytes first, then gets the newest part, each
    byte once, up to the job's last line."""
    async with worker(tmp_path, OutputSettings(max_output_mb=1, check_interval_s=0.05)) as w:
        await w.run(6, NUMBERED)
        await w.ended(6)
        path = w.job_dir(6) / "stdout.log"
        await eventually(lambda: os.stat(path).st_blocks * 512 <= 1.2 * MIB)
        chunks = await w.read(6)
    dropped = sum(c.dropped_bytes for c in chunks)
    data = data_of(chunks)
    assert chunks[0].dropped_bytes > 0
    assert dropped + len(data) == 3_000_000
    assert len(data) <= MIB
    assert data.endswith(b"000299999\n")
    first_whole = data.index(b"\n") + 1
    lines = data[first_whole:].split(b"\n")[:-1]
    assert [int(line) for line in lines] == list(range(300_000 - len(lines), 300_000))


FLOOD = (
    "import os, time\nchunk = b'x' * (1 << 20)\nend = time.monotonic() + 3\n"
    "while time.monotonic() < end:\n    os.write(1, chunk)\n"
)
"""Writes 1 MiB at a time, as fast as it can, for 3 s."""


async def test_a_job_writing_as_fast_as_it_can_stays_bounded_and_heartbeats_stay_on_time(
    tmp_path: Path,
) -> None:
    """A job floods its stdout for 3 s under a 1 MiB cap: the disk space its file takes stays
    far below what it wrote (bounded by the cap plus one check's worth of writing), and the
    heartbeats the control plane sees keep coming every 0.25 s, none more than 1 s apart (the
    worker pauses its jobs after 1.5 s without one)."""
    async with worker(tmp_path, OutputSettings(max_output_mb=1)) as w:
        await w.run(7, FLOOD)
        path = w.job_dir(7) / "stdout.log"
        most_on_disk = 0
        began = len(w.cp.heartbeat_times)
        while 7 not in w.cp.finished():
            with trio.move_on_after(0.01):
                await w.cp.changed.wait()
            try:
                most_on_disk = max(most_on_disk, os.stat(path).st_blocks * 512)
            except FileNotFoundError:
                pass
        times = w.cp.heartbeat_times[began:]
        written = os.stat(path).st_size
    gaps = [b - a for a, b in itertools.pairwise(times)]
    print(
        f"wrote {written / MIB:.0f} MiB, at most {most_on_disk / MIB:.1f} MiB on disk, "
        f"heartbeat gaps max {max(gaps):.3f} s"
    )
    assert written > 50 * MIB  # it did flood
    assert most_on_disk < written / 4
    assert max(gaps) < 1.0


FAST_LINES = (
    "import os, time\nline = b'y' * 4095 + b'\\n'\nend = time.monotonic() + 30\n"
    "while time.monotonic() < end:\n    os.write(1, line * 2)\n    time.sleep(0.001)\n"
)
"""Writes two 4 KiB lines a millisecond for 30 s (the test ends it sooner)."""


async def test_reads_of_a_job_still_writing_fast_end_at_the_output_as_it_was(tmp_path: Path) -> None:
    """Without follow, a read ends where the output ended when it was asked for, however fast
    the job goes on writing and while its cap drops the head: a whole read is at most about
    the cap, and a tail of 5 lines is those 5 lines; neither says job_ended."""
    async with worker(tmp_path, OutputSettings(max_output_mb=1, check_interval_s=0.05)) as w:
        await w.run(8, FAST_LINES)
        path = w.job_dir(8) / "stdout.log"
        await eventually(lambda: path.exists() and path.stat().st_size > 3 * MIB, timeout_s=20)
        whole = await w.read(8)
        tail = await w.read(8, has_tail=True, tail_lines=5)
    assert not any(c.job_ended for c in whole + tail)
    assert len(data_of(whole)) <= 2 * MIB
    assert data_of(tail) == (b"y" * 4095 + b"\n") * 5
