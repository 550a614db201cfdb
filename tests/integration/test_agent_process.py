"""The agent as a real process (agent.main.main): SIGTERM stops its jobs and exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO

import pytest
import trio
from jobfiles import job_writable

from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.text import read_jsonl

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux")


class RegistrationsOnly:
    """A ControlPlane service that answers registrations and heartbeats and records them."""

    def __init__(self) -> None:
        self.registrations: list[pb.RegisterWorkerRequest] = []
        self.registered = trio.Event()
        self.heartbeated = trio.Event()
        """Set at the first heartbeat: the agent has taken its registration's answer in."""
        self.leaves: list[tuple[pb.LeaveWorkerRequest, list[int]]] = []
        """Every leave, with the watched job processes alive when it came."""
        self.watched: list[int] = []

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        self.registered.set()
        return pb.RegisterWorkerReply(incarnation=len(self.registrations), epoch=1)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeated.set()
        return pb.HeartbeatReply(epoch=1)

    async def leave_worker(self, request: pb.LeaveWorkerRequest) -> pb.LeaveWorkerReply:
        """Record the leave, and which of the watched job processes were still alive then."""
        self.leaves.append((request, [pid for pid in self.watched if _alive(pid)]))
        return pb.LeaveWorkerReply(left=True, epoch=1)

    async def submit_job(self, request: object) -> object:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = submit_job


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _open_for_writing(path: Path) -> IO[bytes]:
    return path.open("wb")


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def _child_pid(pid_file: Path) -> int:
    """Wait until the job wrote its pid (a file: nothing to wait on but polling)."""
    with trio.fail_after(10):
        while True:
            if text := _read(pid_file).strip():
                return int(text)
            await trio.sleep(0.02)


def _agent_script(cp_port: int, work_dir: Path) -> str:
    return textwrap.dedent(f"""
        from agent.main import main
        from runtime.settings.agent import AgentSettings
        main(AgentSettings(worker_id="w-p", control_planes=["127.0.0.1:{cp_port}"],
                           cpu_millis=1000, memory_mb=1000, work_dir={str(work_dir)!r},
                           heartbeat_interval_s=0.1, stop_grace_s=2.0))
    """)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_stops_jobs_then_exits_zero(tmp_path: Path, signum: signal.Signals) -> None:
    """On SIGTERM or SIGINT the agent stops its running command, logs it, tells the control
    plane it left once the command's process is gone, and exits 0."""
    cp = RegistrationsOnly()
    pid_file = job_writable(tmp_path) / "child.pid"
    stderr_path = tmp_path / "agent.stderr"
    stderr_file = _open_for_writing(stderr_path)
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        agent = await trio.lowlevel.open_process(
            [sys.executable, "-c", _agent_script(cp_port, tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
        )
        try:
            with trio.fail_after(30):
                await cp.heartbeated.wait()  # registered, and the agent has taken the answer in
            channel = GrpcChannel(cp.registrations[0].address)
            try:
                stub = channel.stub(pb.WorkerStub)
                argv = ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
                reply = await channel.call(
                    stub.assign,
                    pb.AssignRequest(
                        epoch=1,
                        worker_id="w-p",
                        incarnation=1,
                        assignments=[
                            pb.Assignment(
                                assignment_id=1,
                                job_id=10,
                                spec=pb.JobSpec(
                                    cpu_millis=100, memory_mb=10, command=pb.CommandRuntime(argv=argv)
                                ),
                            )
                        ],
                    ),
                    timeout_s=5,
                )
                assert list(reply.accepted_ids) == [1]
            finally:
                channel.close()
            child = await _child_pid(pid_file)
            cp.watched.append(child)
            agent.send_signal(signum)
            with trio.fail_after(15):
                code = await agent.wait()
            assert code == 0, _read(stderr_path)
            assert not _alive(child)
        finally:
            if agent.poll() is None:
                agent.kill()
                await agent.wait()
            nursery.cancel_scope.cancel()
            stderr_file.close()
    records = read_jsonl(tmp_path / "agent.jsonl")
    stops = [(r["assignment_id"], r["reason"], r.get("exit_code")) for r in records if r["event"] == "stop"]
    assert stops == [(1, "shutdown", -15)]
    # Then it left, once its job's process was gone, naming the life and the run that registered.
    [(leave, alive_then)] = cp.leaves
    assert alive_then == []
    assert (leave.worker_id, leave.incarnation) == ("w-p", 1)
    assert leave.agent_run_id == cp.registrations[0].agent_run_id != ""
    assert (records[-1]["event"], records[-1]["left"]) == ("leave", True)
