"""Paced starts with real processes: a real agent takes 200 command jobs in one Assign and
keeps heartbeating; jobs run at the lower priority ``job_nice``; a job whose reaper finds the
fence deadline passed never runs, and its stop line says so.

The 200-job test runs the agent as a process of its own (``agent.main.main``) against a
recording control plane in the test process, with the default timing (heartbeats every
0.25 s, self-fence after 1.5 s), as ``stockade up`` runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agent.core import Agent
from agent.main import run_agent
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux")

JOBS = 200


@attrs.define
class RecordingControlPlane:
    """Answers registrations and heartbeats at once; records them with their arrival times."""

    registrations: list[pb.RegisterWorkerRequest] = attrs.field(factory=list)
    heartbeats: list[tuple[float, pb.HeartbeatRequest]] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        self._touch()
        return pb.RegisterWorkerReply(incarnation=len(self.registrations), epoch=1)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeats.append((trio.current_time(), request))
        self._touch()
        return pb.HeartbeatReply(epoch=1)

    async def wait_for(self, predicate: Any, timeout_s: float) -> None:
        with trio.fail_after(timeout_s):
            while not predicate():
                await self.changed.wait()

    def finished(self) -> dict[int, pb.JobOutcome]:
        return {o.assignment_id: o for _, hb in self.heartbeats for o in hb.finished}

    async def submit_job(self, request: object) -> object:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = submit_job


def command(aid: int, argv: list[str], cpu_millis: int = 10, memory_mb: int = 16) -> pb.Assignment:
    return pb.Assignment(
        assignment_id=aid,
        job_id=aid * 10,
        committed_epoch=1,
        spec=pb.JobSpec(cpu_millis=cpu_millis, memory_mb=memory_mb, command=pb.CommandRuntime(argv=argv)),
    )


async def assign(address: str, incarnation: int, *assignments: pb.Assignment) -> pb.AssignReply:
    channel = GrpcChannel(address)
    try:
        reply: pb.AssignReply = await channel.call(
            channel.stub(pb.WorkerStub).assign,
            pb.AssignRequest(
                epoch=1, worker_id="w-1", incarnation=incarnation, assignments=list(assignments)
            ),
            timeout_s=5,
        )
    finally:
        channel.close()
    return reply


def _agent_script(cp_port: int, work_dir: Path) -> str:
    return textwrap.dedent(f"""
        from agent.main import main
        from runtime.settings.agent import AgentSettings
        main(AgentSettings(worker_id="w-1", control_planes=["127.0.0.1:{cp_port}"],
                           cpu_millis=4000, memory_mb=8192, work_dir={str(work_dir)!r}))
    """)


async def test_200_command_jobs_in_one_assign_all_succeed_and_heartbeats_keep_going(tmp_path: Path) -> None:
    """A real agent (default settings) accepts 200 ``true`` jobs in one Assign: every one
    succeeds, the agent never fences itself or registers again, and its heartbeats keep
    coming (never 1 s apart) while the jobs start, two at a time."""
    cp = RecordingControlPlane()
    work_dir = tmp_path / "w-1"
    stderr = (tmp_path / "agent.stderr").open("wb")
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        agent = await trio.lowlevel.open_process(
            [sys.executable, "-c", _agent_script(cp_port, work_dir)], stdout=subprocess.DEVNULL, stderr=stderr
        )
        try:
            await cp.wait_for(lambda: len(cp.heartbeats) >= 4, timeout_s=30)
            began = trio.current_time()
            reply = await assign(
                cp.registrations[0].address, 1, *(command(aid, ["true"]) for aid in range(1, JOBS + 1))
            )
            assert sorted(reply.accepted_ids) == list(range(1, JOBS + 1)) and not reply.refused
            await cp.wait_for(lambda: len(cp.finished()) == JOBS, timeout_s=120)
            took_s = trio.current_time() - began
            await trio.sleep(1.0)  # heartbeats go on after the burst
            ended = trio.current_time()
        finally:
            agent.kill()
            await agent.wait()
            stderr.close()
            nursery.cancel_scope.cancel()
    assert {aid: (o.state, o.exit_code) for aid, o in cp.finished().items()} == {
        aid: ("succeeded", 0) for aid in range(1, JOBS + 1)
    }
    assert len(cp.registrations) == 1
    records = read_jsonl(work_dir / "agent.jsonl")
    assert [r for r in records if r["event"] in ("self_fence", "register")][1:] == []
    stops = [r for r in records if r["event"] == "stop"]
    assert len(stops) == JOBS and all(r["reason"] == "succeeded" and r["started"] for r in stops)
    during = [t for t, _ in cp.heartbeats if began <= t <= ended]
    gaps = [b - a for a, b in zip([began, *during], [*during, ended], strict=True)]
    print(f"{JOBS} jobs done in {took_s:.2f} s; {len(during)} heartbeats, longest gap {max(gaps):.3f} s")
    assert max(gaps) < 1.0
    assert len(during) >= (ended - began) / 0.25 / 2


@asynccontextmanager
async def agent_in_process(
    tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[Agent, RecordingControlPlane]]:
    """A real agent (run_agent: its spawner thread, real reapers) in this process."""
    cp = RecordingControlPlane()
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        values: dict[str, Any] = {
            "worker_id": "w-1",
            "control_planes": [f"127.0.0.1:{cp_port}"],
            "cpu_millis": 1000,
            "memory_mb": 1000,
            "work_dir": str(tmp_path),
            "heartbeat_interval_s": 0.05,
            "heartbeat_timeout_s": 1.0,
            "self_fence_after_s": 3.0,
        }
        values.update(overrides)
        agent: Agent = await nursery.start(run_agent, AgentSettings(**values))
        with trio.fail_after(10):
            await agent.wait_registered()
        try:
            yield agent, cp
        finally:
            nursery.cancel_scope.cancel()


async def test_a_job_runs_at_nice_job_nice_and_its_reaper_does_not(tmp_path: Path) -> None:
    """With job_nice 7 the job's nice value is the agent's + 7 (capped at 19); its reaper, the
    deadman, keeps the agent's."""
    mine = os.nice(0)
    async with agent_in_process(tmp_path, job_nice=7) as (agent, cp):
        argv = ["sh", "-c", "nice; cut -d ' ' -f 19 /proc/$PPID/stat"]
        await assign(agent.address, 1, command(1, argv))
        await cp.wait_for(lambda: 1 in cp.finished(), timeout_s=10)
        outcome = cp.finished()[1]
    job_nice, reaper_nice = (int(line) for line in (await trio.Path(outcome.stdout_path).read_text()).split())
    assert (outcome.state, job_nice, reaper_nice) == ("succeeded", min(19, mine + 7), mine)


async def test_a_job_whose_reaper_finds_the_fence_deadline_passed_is_logged_as_not_started(
    tmp_path: Path,
) -> None:
    """The agent cannot update its fence-deadline file, which holds a passed deadline: the
    reaper refuses to start the job, the stop line says ``started: false`` (reason
    self_fence), and the worker fences itself."""
    marker = tmp_path / "ran"
    async with agent_in_process(tmp_path / "w") as (agent, cp):
        (agent.fence_deadline_path.parent / "fence_deadline.tmp").mkdir()  # writes fail now
        agent.fence_deadline_path.write_text(f"{time.monotonic() - 1.0!r}\n")
        reply = await assign(agent.address, 1, command(1, ["touch", str(marker)]))
        assert list(reply.accepted_ids) == [1]
        with trio.fail_after(10):
            while not [r for r in read_jsonl(agent.joblog.path) if r["event"] == "stop"]:  # noqa: ASYNC110 (a file)
                await trio.sleep(0.02)
        (agent.fence_deadline_path.parent / "fence_deadline.tmp").rmdir()
    events = {r["event"]: r for r in read_jsonl(agent.joblog.path)}
    stop = events["stop"]
    assert (stop["assignment_id"], stop["reason"], stop["started"]) == (1, "self_fence", False)
    assert "exit_code" not in stop
    assert "start" in events and "self_fence" in events
    assert not marker.exists()
    assert 1 not in cp.finished()
