"""The agent as a real process, killed or frozen: its jobs stop anyway, and its log tells when.

Each test runs ``agent.main.main`` in a child process against a scripted control plane, gives
it one job, then SIGKILLs or SIGSTOPs it. Command jobs write a wall-clock timestamp to a file
every 50 ms from a grandchild process (a subshell), so the file shows when the job's last
process stopped. Every reaper and job process works in a folder under the agent's work folder
(jobs get a clean environment, so the agent alone carries the test's marker), so psutil can tell
whether any of them is left. When the tests run as root the jobs run as the agent's job user, so
what they write goes to a folder every user may write (:func:`job_writable`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import trio
from jobfiles import job_writable

from agent.deadman import read_fence_deadline
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.text import read_jsonl

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reapers need Linux")

WORKER = "w-r"
HEARTBEAT_S = 0.1
FENCE_S = 1.0
MARKER = "STOCKADE_REAPER_TEST"


@attrs.define
class RecordingControlPlane:
    """Answers registrations and heartbeats at once and records them."""

    registrations: list[pb.RegisterWorkerRequest] = attrs.field(factory=list)
    heartbeats: list[pb.HeartbeatRequest] = attrs.field(factory=list)
    registered: trio.Event = attrs.field(factory=trio.Event)
    heartbeated: trio.Event = attrs.field(factory=trio.Event)
    ended: set[int] = attrs.field(factory=set)
    """Assignments every heartbeat reply lists as ended (to stop)."""

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        self.registered.set()
        return pb.RegisterWorkerReply(incarnation=len(self.registrations), epoch=1)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeats.append(request)
        self.heartbeated.set()
        stop = sorted(set(request.running_assignment_ids) & self.ended)
        return pb.HeartbeatReply(epoch=1, stop_assignment_ids=stop)

    async def submit_job(self, request: object) -> object:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = submit_job


@attrs.frozen
class AgentProcess:
    process: trio.Process
    cp: RecordingControlPlane
    work_dir: Path
    marker: str

    @property
    def pid(self) -> int:
        return self.process.pid

    def deadline_unix_s(self) -> float:
        """The fence deadline in the agent's file, as a wall-clock time."""
        deadlines = read_fence_deadline(self.work_dir / "fence_deadline")
        assert deadlines is not None
        return deadlines[0] - time.monotonic() + time.time()

    def stops(self) -> list[dict[str, Any]]:
        log = self.work_dir / "agent.jsonl"
        return [r for r in read_jsonl(log) if r["event"] == "stop"] if log.exists() else []

    def leftovers(self) -> list[psutil.Process]:
        """Live (not zombie) processes of this test other than the agent itself: those marked
        in their environment, and those working under the agent's work folder (reapers, jobs)."""
        found = []
        inside = f"{self.work_dir}{os.sep}"
        for proc in psutil.process_iter():
            try:
                if proc.pid == self.pid or proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                if proc.environ().get(MARKER) == self.marker or proc.cwd().startswith(inside):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found


def _agent_script(cp_port: int, work_dir: Path, db_outage_grace_s: float) -> str:
    return textwrap.dedent(f"""
        from agent.main import main
        from runtime.settings.agent import AgentSettings
        main(AgentSettings(worker_id={WORKER!r}, control_planes=["127.0.0.1:{cp_port}"],
                           cpu_millis=1000, memory_mb=1000, work_dir={str(work_dir)!r},
                           heartbeat_interval_s={HEARTBEAT_S}, heartbeat_timeout_s=0.3,
                           self_fence_after_s={FENCE_S}, stop_grace_s=0.5,
                           db_outage_grace_s={db_outage_grace_s!r}))
    """)


@asynccontextmanager
async def running_agent(tmp_path: Path, db_outage_grace_s: float = 0.0) -> AsyncIterator[AgentProcess]:
    """An agent process registered with a recording control plane; killed (with every
    process of the test) on the way out. ``db_outage_grace_s`` 0 (the default here): jobs are
    killed at the fence deadline; longer: they pause there and are killed that long after
    the last acknowledged heartbeat."""
    cp = RecordingControlPlane()
    marker = uuid.uuid4().hex
    work_dir = tmp_path / "work"
    stderr_file = (tmp_path / "agent.stderr").open("wb")
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", _agent_script(cp_port, work_dir, db_outage_grace_s)],
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
            env={**os.environ, MARKER: marker},
        )
        agent = AgentProcess(process=process, cp=cp, work_dir=work_dir, marker=marker)
        try:
            with trio.fail_after(30):
                # The registration has been answered once the agent heartbeats: only then does
                # it accept work (under load its reply may take a while to be processed).
                await cp.heartbeated.wait()
            yield agent
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                await process.wait()
            for leftover in agent.leftovers():
                # A leftover may end between the listing and the kill (a reaper that sees its
                # agent gone exits on its own).
                with contextlib.suppress(psutil.NoSuchProcess):
                    leftover.kill()
            nursery.cancel_scope.cancel()
            stderr_file.close()


async def assign(agent: AgentProcess, spec: pb.JobSpec) -> None:
    """Send assignment 1 (job 10) with ``spec`` to the agent; it must accept it."""
    channel = GrpcChannel(agent.cp.registrations[-1].address)
    try:
        reply = await channel.call(
            channel.stub(pb.WorkerStub).assign,
            pb.AssignRequest(
                epoch=1,
                worker_id=WORKER,
                incarnation=len(agent.cp.registrations),
                assignments=[pb.Assignment(assignment_id=1, job_id=10, spec=spec)],
            ),
            timeout_s=5,
        )
    finally:
        channel.close()
    assert list(reply.accepted_ids) == [1], (reply.refused, len(agent.cp.registrations))


def writer_job(path: Path) -> pb.JobSpec:
    """A command whose grandchild appends the wall-clock time to ``path`` every 50 ms."""
    loop = f"while :; do date +%s.%N >> {path}; sleep 0.05; done"
    argv = ["sh", "-c", f"({loop}); echo done"]
    return pb.JobSpec(cpu_millis=100, memory_mb=10, command=pb.CommandRuntime(argv=argv))


def stamps(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [float(line) for line in path.read_text().split()]


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` (files and /proc: nothing to wait on) until it holds."""
    with trio.fail_after(timeout_s):
        while True:
            if predicate():
                return
            await trio.sleep(0.02)


async def test_sigkilled_agent_takes_grandchildren_down_at_the_fence_deadline(tmp_path: Path) -> None:
    """SIGKILL of the agent: its reaper outlives it and stops a command job's grandchildren at
    the fence deadline the agent last wrote (killed there, with no outage grace); nothing is
    left by the deadline + 0.5 s."""
    out = job_writable(tmp_path) / "stamps"
    async with running_agent(tmp_path) as agent:
        await assign(agent, writer_job(out))
        await wait_for(lambda: len(stamps(out)) >= 5)
        assert agent.leftovers(), "the reaper and the job should be running"
        agent.process.kill()
        killed_at = time.time()
        await agent.process.wait()
        deadline = agent.deadline_unix_s()
        assert killed_at < deadline <= killed_at + FENCE_S + 0.1
        await trio.sleep(max(0.0, deadline + 0.5 - time.time()))
        assert agent.leftovers() == []
        last = stamps(out)[-1]
        await trio.sleep(0.3)
        assert stamps(out)[-1] == last, "the job still writes after its fence deadline"
        assert last <= deadline + 0.3


async def test_frozen_agent_command_job_stops_at_the_fence_deadline(tmp_path: Path) -> None:
    """A SIGSTOPped agent's command job stops by the fence deadline + 0.3 s while the agent is
    still stopped, and the stop line the thawed agent writes carries the kill time."""
    out = job_writable(tmp_path) / "stamps"
    async with running_agent(tmp_path) as agent:
        await assign(agent, writer_job(out))
        await wait_for(lambda: len(stamps(out)) >= 5)
        agent.process.send_signal(signal.SIGSTOP)
        deadline = agent.deadline_unix_s()
        await trio.sleep(max(0.0, deadline + 0.5 - time.time()))
        assert agent.process.poll() is None
        last = stamps(out)[-1]
        assert deadline - FENCE_S < last <= deadline + 0.3
        assert agent.leftovers() == [], "job processes outlived the fence deadline"
        await trio.sleep(0.3)
        assert stamps(out)[-1] == last
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(agent.stops()) == 1)
        (stop,) = agent.stops()
        assert stop["reason"] == "self_fence"
        assert stop["exit_code"] == -signal.SIGKILL
        assert deadline <= stop["time"] <= deadline + 0.3
        assert stop["time"] >= last


async def test_frozen_agent_sleep_job_stops_at_the_fence_deadline(tmp_path: Path) -> None:
    """A sleep job whose duration runs out while its agent is frozen past the fence deadline
    is logged as stopped by the fence at the deadline, and never reported as succeeded."""
    async with running_agent(tmp_path) as agent:
        sleep = pb.JobSpec(cpu_millis=100, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=1500))
        await assign(agent, sleep)
        ends_at = time.time() + 1.5
        await trio.sleep(0.2)
        agent.process.send_signal(signal.SIGSTOP)
        deadline = agent.deadline_unix_s()
        # Frozen past the deadline and past the end of the sleep job's duration, in that order.
        assert deadline < ends_at
        await trio.sleep(max(0.0, ends_at + 0.5 - time.time()))
        heartbeats_before = len(agent.cp.heartbeats)
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(agent.cp.registrations) == 2)  # fenced, then registered again
        await trio.sleep(3 * HEARTBEAT_S)
        (stop,) = agent.stops()
        assert stop["reason"] == "self_fence"
        assert stop["time"] == pytest.approx(deadline, abs=0.01)
        reported = [o for hb in agent.cp.heartbeats[heartbeats_before:] for o in hb.finished]
        assert reported == []
        records = read_jsonl(agent.work_dir / "agent.jsonl")
        assert [r["event"] for r in records] == ["register", "start", "self_fence", "stop", "register"]


async def test_a_command_job_that_ended_before_the_fence_deadline_keeps_its_success(tmp_path: Path) -> None:
    """A command job that exits 0 while its agent is frozen, before the fence deadline, is not
    turned into a fenced stop when the agent thaws past the deadline and fences itself: its
    stop line says succeeded with its exit code, and its success is reported (with the
    registration that follows the fence) instead of being thrown away."""
    async with running_agent(tmp_path) as agent:
        quick = pb.JobSpec(cpu_millis=100, memory_mb=10, command=pb.CommandRuntime(argv=["sleep", "0.3"]))
        await assign(agent, quick)
        await trio.sleep(0.1)  # the job is running; freeze the agent until past its deadline
        agent.process.send_signal(signal.SIGSTOP)
        deadline = agent.deadline_unix_s()
        await trio.sleep(max(0.0, deadline + 0.5 - time.time()))
        heartbeats_before = len(agent.cp.heartbeats)
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(agent.cp.registrations) == 2)  # fenced, then registered again
        (stop,) = agent.stops()
        assert stop["reason"] == "succeeded" and stop["exit_code"] == 0 and stop["started"] is True
        assert stop["time"] < deadline
        reported = [o for o in agent.cp.registrations[-1].finished] + [
            o for hb in agent.cp.heartbeats[heartbeats_before:] for o in hb.finished
        ]
        assert [(o.assignment_id, o.state, o.exit_code) for o in reported] == [(1, "succeeded", 0)]
        log = agent.work_dir / "agent.jsonl"
        await wait_for(lambda: [r["event"] for r in read_jsonl(log)].count("register") == 2)
        events = [r["event"] for r in read_jsonl(log)]
        assert events == ["register", "start", "self_fence", "stop", "register"]


# ---------------------------------------------------------------- pause through an outage


async def writer_frozen_past_its_deadline(agent: AgentProcess, out: Path) -> float:
    """Give the agent a writer job (into ``out``), SIGSTOP the agent once the job writes, and
    wait until half a second past its fence deadline; returns the deadline (wall clock)."""
    await assign(agent, writer_job(out))
    await wait_for(lambda: len(stamps(out)) >= 5)
    agent.process.send_signal(signal.SIGSTOP)
    deadline = agent.deadline_unix_s()
    await trio.sleep(max(0.0, deadline + 0.5 - time.time()))
    return deadline


def is_stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


async def test_a_frozen_agents_command_job_is_paused_at_the_deadline_and_resumed_after(
    tmp_path: Path,
) -> None:
    """With an outage grace, a SIGSTOPped agent's command job is held (SIGSTOP, every process
    of it) from the fence deadline on, not killed; once the agent thaws and a heartbeat is
    acknowledged with the assignment still active, it runs on, and nothing ended it."""
    out = job_writable(tmp_path) / "stamps"
    async with running_agent(tmp_path, db_outage_grace_s=30.0) as agent:
        deadline = await writer_frozen_past_its_deadline(agent, out)
        last = stamps(out)[-1]
        assert deadline - FENCE_S < last <= deadline + 0.3
        held = agent.leftovers()
        assert held, "the paused job's processes are gone"
        assert any(is_stopped(p) for p in held)
        await trio.sleep(0.3)
        assert stamps(out)[-1] == last, "the paused job still writes"
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: stamps(out)[-1] > last + 0.2)
        assert agent.stops() == []
        events = [r["event"] for r in read_jsonl(agent.work_dir / "agent.jsonl")]
        assert events == ["register", "start", "pause", "resume"]
        assert len(agent.cp.registrations) == 1


async def test_a_paused_job_whose_assignment_ended_meanwhile_is_killed_never_resumed(
    tmp_path: Path,
) -> None:
    """A paused job whose assignment the first acknowledged heartbeat lists as ended is killed
    while still held: it never writes again, and its stop line carries the time it paused."""
    out = job_writable(tmp_path) / "stamps"
    async with running_agent(tmp_path, db_outage_grace_s=30.0) as agent:
        deadline = await writer_frozen_past_its_deadline(agent, out)
        last = stamps(out)[-1]
        agent.cp.ended.add(1)  # the leader ended it while the worker was cut off
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(agent.stops()) == 1)
        await trio.sleep(0.5)
        assert stamps(out)[-1] == last, "a job whose assignment ended ran again"
        assert agent.leftovers() == []
        (stop,) = agent.stops()
        assert deadline - 0.05 <= stop["time"] <= deadline + 0.3
        events = [r["event"] for r in read_jsonl(agent.work_dir / "agent.jsonl")]
        assert events == ["register", "start", "pause", "stop", "resume"]


async def test_a_job_paused_longer_than_the_outage_grace_is_killed_by_its_reaper(
    tmp_path: Path,
) -> None:
    """An agent frozen past the outage grace: its reaper kills the paused job at the kill
    deadline, while the agent is still frozen; the thawed agent logs the stop at the pause
    time and registers again (a new incarnation)."""
    out = job_writable(tmp_path) / "stamps"
    grace_s = 2.5
    async with running_agent(tmp_path, db_outage_grace_s=grace_s) as agent:
        deadline = await writer_frozen_past_its_deadline(agent, out)
        kill_at = deadline - FENCE_S + grace_s
        assert agent.leftovers(), "killed at the pause deadline"
        await trio.sleep(max(0.0, kill_at + 0.5 - time.time()))
        assert agent.leftovers() == [], "the paused job outlived the outage grace"
        last = stamps(out)[-1]
        assert last <= deadline + 0.3
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(agent.cp.registrations) == 2)
        (stop,) = agent.stops()
        assert stop["reason"] == "self_fence"
        assert deadline - 0.05 <= stop["time"] <= deadline + 0.3


async def test_a_pause_holds_processes_in_other_sessions_and_leaves_self_stopped_ones_stopped(
    tmp_path: Path,
) -> None:
    """A job whose writer moved to a session of its own (``setsid``, its parent alive) is held
    as a whole at the fence deadline: neither writer writes while the agent is frozen past it.
    On resume both write again, and a process the job had stopped itself stays stopped."""
    folder = job_writable(tmp_path)
    own, other, stopped_pid = folder / "own", folder / "other", folder / "stopped.pid"
    loop = "while :; do date +%s.%N >> {}; sleep 0.05; done"
    script = (
        f"setsid sh -c '{loop.format(other)}' & "
        f"sleep 1000 & P=$!; kill -STOP $P; echo $P > {stopped_pid}; "
        f"{loop.format(own)}"
    )
    spec = pb.JobSpec(cpu_millis=100, memory_mb=10, command=pb.CommandRuntime(argv=["sh", "-c", script]))
    async with running_agent(tmp_path, db_outage_grace_s=30.0) as agent:
        await assign(agent, spec)
        await wait_for(lambda: len(stamps(own)) >= 5 and len(stamps(other)) >= 5 and stopped_pid.exists())
        agent.process.send_signal(signal.SIGSTOP)
        deadline = agent.deadline_unix_s()
        await trio.sleep(max(0.0, deadline + 0.5 - time.time()))
        last = {path: stamps(path)[-1] for path in (own, other)}
        assert all(stamp <= deadline + 0.3 for stamp in last.values()), (deadline, last)
        await trio.sleep(0.5)
        assert {path: stamps(path)[-1] for path in (own, other)} == last, "a process of the job ran on"
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: all(stamps(path)[-1] > last[path] + 0.2 for path in (own, other)))
        assert psutil.Process(int(stopped_pid.read_text())).status() == psutil.STATUS_STOPPED
