"""`stockade fleet` as a real process: SIGTERM stops every worker's jobs and exits 0; a worker
that cannot start takes the fleet down with an error naming it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import trio
from jobfiles import job_writable
from prometheus_client.parser import text_string_to_metric_families

from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.text import read_jsonl

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux")

ROOT = Path(__file__).parents[2]


class RegistrationsOnly:
    """A ControlPlane service that answers registrations and heartbeats and records them."""

    def __init__(self, expected: int) -> None:
        self.registrations: list[pb.RegisterWorkerRequest] = []
        self.expected = expected
        self.all_registered = trio.Event()
        self.heartbeated: set[str] = set()
        self.all_heartbeated = trio.Event()
        """Set once every expected worker heartbeats: each has taken its registration's answer in."""
        self.leaves: list[tuple[pb.LeaveWorkerRequest, list[int]]] = []
        """Every leave, with the watched job processes alive when it came."""
        self.watched: list[int] = []

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        if len({r.worker_id for r in self.registrations}) >= self.expected:
            self.all_registered.set()
        return pb.RegisterWorkerReply(incarnation=len(self.registrations), epoch=1)

    def incarnation(self, worker_id: str) -> int:
        """The incarnation given to ``worker_id``'s latest registration."""
        return max(i for i, r in enumerate(self.registrations, start=1) if r.worker_id == worker_id)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeated.add(request.worker_id)
        if len(self.heartbeated) >= self.expected:
            self.all_heartbeated.set()
        return pb.HeartbeatReply(epoch=1)

    async def leave_worker(self, request: pb.LeaveWorkerRequest) -> pb.LeaveWorkerReply:
        """Record the leave, and which of the watched job processes were still alive then."""
        self.leaves.append((request, [pid for pid in self.watched if _alive(pid)]))
        return pb.LeaveWorkerReply(left=True, epoch=1)

    async def submit_job(self, request: object) -> object:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = submit_job


def _fleet_command(spec: Path, control_planes: str, *more: str) -> list[str]:
    return [
        *(sys.executable, "-m", "ops.cli", "fleet", "--id", "fleet-t", "--spec", str(spec)),
        *("--control-planes", control_planes, "--heartbeat-interval-s", "0.1", "--insecure", *more),
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples the process serves on 127.0.0.1:``port``/metrics: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5.0) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _spec(tmp_path: Path, ports: list[int]) -> Path:
    path = tmp_path / "fleet.json"
    entries = [
        {"id": f"w-{i}", "port": port, "cpu_millis": 1000, "memory_mb": 1000, "work_dir": f"w-{i}"}
        for i, port in enumerate(ports, start=1)
    ]
    path.write_text(json.dumps(entries))
    return path


async def test_sigterm_stops_every_workers_jobs_then_exits_zero(tmp_path: Path) -> None:
    """Two workers in one fleet register on their own addresses, and the fleet's /metrics shows
    each one's running job and start under its worker_id; on SIGTERM each one's running
    command is stopped and logged in its own agent.jsonl, each worker then leaves, and the
    fleet exits 0."""
    metrics_port = _free_port()
    cp = RegistrationsOnly(expected=2)
    spec = _spec(tmp_path, [0, 0])
    stderr_path = tmp_path / "fleet.stderr"
    with stderr_path.open("wb") as stderr_file:
        async with asyncio_bridge(), trio.open_nursery() as nursery:
            cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
            fleet = await trio.lowlevel.open_process(
                _fleet_command(spec, f"127.0.0.1:{cp_port}", "--metrics-port", str(metrics_port)),
                stdout=subprocess.DEVNULL,
                stderr=stderr_file,
                env=_env(),
            )
            try:
                with trio.fail_after(30):
                    await cp.all_registered.wait()
                    await cp.all_heartbeated.wait()
                addresses = {r.worker_id: r.address for r in cp.registrations}
                assert set(addresses) == {"w-1", "w-2"}
                assert len(set(addresses.values())) == 2
                child_pids = []
                for aid, worker_id in enumerate(sorted(addresses), start=1):
                    pid_file = job_writable(tmp_path) / f"{worker_id}.pid"
                    channel = GrpcChannel(addresses[worker_id])
                    try:
                        reply = await channel.call(
                            channel.stub(pb.WorkerStub).assign,
                            pb.AssignRequest(
                                epoch=1,
                                worker_id=worker_id,
                                incarnation=cp.incarnation(worker_id),
                                assignments=[
                                    pb.Assignment(
                                        assignment_id=aid,
                                        job_id=10 + aid,
                                        spec=pb.JobSpec(
                                            cpu_millis=100,
                                            memory_mb=10,
                                            command=pb.CommandRuntime(
                                                argv=["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
                                            ),
                                        ),
                                    )
                                ],
                            ),
                            timeout_s=5,
                        )
                        assert list(reply.accepted_ids) == [aid]
                    finally:
                        channel.close()
                    with trio.fail_after(10):
                        # another process's file: nothing to wait on but polling
                        while not (pid_file.exists() and pid_file.read_text().strip()):  # noqa: ASYNC110
                            await trio.sleep(0.02)
                    child_pids.append(int(pid_file.read_text()))
                cp.watched += child_pids
                samples = await trio.to_thread.run_sync(_scrape, metrics_port)
                for worker_id in ("w-1", "w-2"):
                    worker = frozenset({("worker_id", worker_id)})
                    assert samples[("stockade_agent_jobs_running", worker)] == 1
                    assert (
                        samples[("stockade_agent_job_starts_total", worker | {("runtime", "command")})] == 1
                    )
                    assert samples[("stockade_agent_fence_state", worker | {("state", "live")})] == 1
                fleet.send_signal(signal.SIGTERM)
                with trio.fail_after(15):
                    code = await fleet.wait()
                assert code == 0, stderr_path.read_text()
                assert not any(_alive(pid) for pid in child_pids)
            finally:
                if fleet.poll() is None:
                    fleet.kill()
                    await fleet.wait()
                nursery.cancel_scope.cancel()
    for aid, worker_id in enumerate(["w-1", "w-2"], start=1):
        records = read_jsonl(tmp_path / worker_id / "agent.jsonl")
        assert {r["worker_id"] for r in records} == {worker_id}
        stops = [(r["assignment_id"], r["reason"]) for r in records if r["event"] == "stop"]
        assert stops == [(aid, "shutdown")]
    logged = stderr_path.read_text()
    assert "worker_id=w-1" in logged and "worker_id=w-2" in logged
    # Each worker left on its own, naming its own incarnation, once its job's process was gone.
    assert sorted((r.worker_id, r.incarnation) for r, _ in cp.leaves) == [
        (w, cp.incarnation(w)) for w in ("w-1", "w-2")
    ]
    own_job = dict(zip(["w-1", "w-2"], cp.watched, strict=True))
    assert not any(own_job[r.worker_id] in alive for r, alive in cp.leaves)


def test_a_worker_whose_port_is_taken_fails_the_fleet_naming_it(tmp_path: Path) -> None:
    """When w-2's port is taken the fleet exits 1 with an error that names w-2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = _spec(tmp_path, [0, port])
        completed = subprocess.run(
            _fleet_command(spec, "127.0.0.1:1"),
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
            check=False,
        )
    assert completed.returncode == 1, completed.stderr
    assert "error: fleet-t: worker w-2 failed:" in completed.stderr
    assert str(port) in completed.stderr.splitlines()[-1]
