"""`stockade agent` and `stockade fleet` as real processes enforcing their jobs' resources.

Each test runs the CLI's agent (or fleet) against a scripted control plane that answers
registrations and heartbeats and records them (their labels, their times, the outcomes they
carry). The tests that need cgroups skip, saying why, where the agent finds none it can use
(its ``resources`` label is then ``rlimit``).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from agent.cgroups import select_resources, worker_key
from agent.resources import JobResources, Mode
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux")

ROOT = Path(__file__).parents[2]
HEARTBEAT_S = 0.1
FENCE_S = 1.5


@attrs.define
class Recorder:
    """A ControlPlane service that answers at once and records what workers said."""

    registrations: list[pb.RegisterWorkerRequest] = attrs.field(factory=list)
    beats: list[tuple[float, pb.HeartbeatRequest]] = attrs.field(factory=list)
    """Every heartbeat, with its arrival time (monotonic)."""
    changed: trio.Event = attrs.field(factory=trio.Event)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        self._changed()
        return pb.RegisterWorkerReply(incarnation=len(self.registrations), epoch=1)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.beats.append((time.monotonic(), request))
        self._changed()
        return pb.HeartbeatReply(epoch=1)

    async def leave_worker(self, request: pb.LeaveWorkerRequest) -> pb.LeaveWorkerReply:
        return pb.LeaveWorkerReply(left=True, epoch=1)

    async def submit_job(self, request: object) -> object:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = submit_job

    def registration(self, worker_id: str) -> tuple[int, pb.RegisterWorkerRequest]:
        """The incarnation and the request of ``worker_id``'s latest registration."""
        return max((i, r) for i, r in enumerate(self.registrations, start=1) if r.worker_id == worker_id)

    def outcomes(self, worker_id: str) -> dict[int, pb.JobOutcome]:
        return {o.assignment_id: o for _, b in self.beats if b.worker_id == worker_id for o in b.finished}

    async def wait(self, predicate: object, timeout_s: float = 30.0) -> None:
        with trio.fail_after(timeout_s):
            while not predicate():  # type: ignore[operator]
                await self.changed.wait()


@attrs.frozen
class Running:
    process: trio.Process
    cp: Recorder
    stderr: Path


def _read(path: str) -> str:
    return Path(path).read_text()


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@asynccontextmanager
async def running(tmp_path: Path, command: list[str], cp: Recorder | None = None) -> AsyncIterator[Running]:
    """``stockade <command> --control-planes <recorder>`` running until the block ends (then
    SIGTERM, and SIGKILL if it lingers)."""
    cp = cp or Recorder()
    stderr = tmp_path / f"{command[0]}-{time.monotonic_ns()}.stderr"
    with stderr.open("wb") as stderr_file:
        async with asyncio_bridge(), trio.open_nursery() as nursery:
            port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
            process = await trio.lowlevel.open_process(
                [
                    sys.executable,
                    "-m",
                    "ops.cli",
                    *command,
                    "--control-planes",
                    f"127.0.0.1:{port}",
                    "--insecure",
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr_file,
                env=_env(),
            )
            try:
                yield Running(process=process, cp=cp, stderr=stderr)
            finally:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(15):
                        await process.wait()
                if process.poll() is None:
                    process.kill()
                    await process.wait()
                nursery.cancel_scope.cancel()


def _agent(work_dir: Path, *extra: str, worker_id: str = "w-c") -> list[str]:
    return [
        *("agent", "--id", worker_id, "--cpu-millis", "2000", "--memory-mb", "2000"),
        *("--work-dir", str(work_dir), "--heartbeat-interval-s", str(HEARTBEAT_S)),
        *("--self-fence-after-s", str(FENCE_S), "--no-containers", *extra),
    ]


async def _assign(
    cp: Recorder,
    worker_id: str,
    assignment_id: int,
    argv: list[str],
    memory_mb: int = 64,
    cpu_millis: int = 500,
) -> None:
    incarnation, registration = cp.registration(worker_id)
    channel = GrpcChannel(registration.address)
    try:
        reply = await channel.call(
            channel.stub(pb.WorkerStub).assign,
            pb.AssignRequest(
                epoch=1,
                worker_id=worker_id,
                incarnation=incarnation,
                assignments=[
                    pb.Assignment(
                        assignment_id=assignment_id,
                        job_id=100 + assignment_id,
                        spec=pb.JobSpec(
                            cpu_millis=cpu_millis, memory_mb=memory_mb, command=pb.CommandRuntime(argv=argv)
                        ),
                    )
                ],
            ),
            timeout_s=5,
        )
    finally:
        channel.close()
    assert list(reply.accepted_ids) == [assignment_id], reply.refused


def _machine_mode() -> tuple[Mode, list[str]]:
    """The mode an agent of this machine gets (probed with a throwaway worker)."""
    found, skipped = select_resources("auto", worker_key="w-probe-0", job_nice=10, pids_max=16)
    found.close()
    return found.mode, skipped


@pytest.fixture
def cgroups_here() -> Mode:
    mode, skipped = _machine_mode()
    if mode is Mode.RLIMIT:
        pytest.skip(f"no usable cgroups on this machine: {'; '.join(skipped)}")
    return mode


def _heartbeating(cp: Recorder, worker_id: str) -> bool:
    return any(b.worker_id == worker_id for _, b in cp.beats)


BOMB = (
    "import os, time\n"
    "made = 0\n"
    "for _ in range(2000):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(2)\n"
    "        os._exit(0)\n"
    "    made += 1\n"
    "print(made, flush=True)\n"
    "time.sleep(2)\n"
)


async def test_a_fork_bomb_is_stopped_by_the_pids_limit_while_the_agent_keeps_heartbeating(
    tmp_path: Path, cgroups_here: Mode
) -> None:
    """The agent registers resources=<its cgroup mode>; a job trying 2000 forks under
    --job-pids-max 64 gets fewer than 64 processes and ends on its own, and meanwhile every
    heartbeat comes on time (no gap near the fence span) and the worker never pauses."""
    work_dir = tmp_path / "work"
    async with running(tmp_path, _agent(work_dir, "--job-pids-max", "64")) as agent:
        await agent.cp.wait(lambda: _heartbeating(agent.cp, "w-c"))
        _, registration = agent.cp.registration("w-c")
        assert registration.labels["resources"] == cgroups_here.value
        await _assign(agent.cp, "w-c", 1, ["python3", "-c", BOMB])
        began = time.monotonic()
        await agent.cp.wait(lambda: 1 in agent.cp.outcomes("w-c"))
        outcome = agent.cp.outcomes("w-c")[1]
    assert outcome.state == "succeeded", outcome.detail
    assert int(_read(outcome.stdout_path)) < 64
    _assert_heartbeats_on_time(agent, work_dir, since=began)
    assert f"job resources: {cgroups_here.value}" in agent.stderr.read_text()


def _assert_heartbeats_on_time(agent: Running, work_dir: Path, *, since: float) -> None:
    """Every heartbeat since ``since`` came within half the fence span of the one before, and
    the worker never paused."""
    times = [t for t, _ in agent.cp.beats if t >= since]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < FENCE_S / 2, f"longest gap between heartbeats {max(gaps):.2f} s"
    assert not [r for r in read_jsonl(work_dir / "agent.jsonl") if r["event"] in ("pause", "self_fence")]


async def test_jobs_spinning_on_every_core_leave_the_agents_heartbeats_on_time(
    tmp_path: Path, cgroups_here: Mode
) -> None:
    """Two jobs of 1000 millicores, each spinning on four processes for 3 s (more than the
    machine's cores), run at a lower CPU weight than the agent: its heartbeats keep coming on
    time and the worker never pauses."""
    work_dir = tmp_path / "work"
    spin = "for i in 1 2 3 4; do (while :; do :; done) & done; sleep 3"
    async with running(tmp_path, _agent(work_dir)) as agent:
        await agent.cp.wait(lambda: _heartbeating(agent.cp, "w-c"))
        began = time.monotonic()
        for aid in (1, 2):
            await _assign(agent.cp, "w-c", aid, ["sh", "-c", spin], cpu_millis=1000)
        await agent.cp.wait(lambda: {1, 2} <= set(agent.cp.outcomes("w-c")))
    assert [agent.cp.outcomes("w-c")[aid].state for aid in (1, 2)] == ["succeeded", "succeeded"]
    _assert_heartbeats_on_time(agent, work_dir, since=began)


async def test_a_job_over_its_memory_ends_failed_oom_killed_in_the_agents_outcome(
    tmp_path: Path, cgroups_here: Mode
) -> None:
    """A 64 MiB job (run as the job user when the agent is root) that fills 128 MiB is reported
    failed with the detail oom_killed, and its cgroup is gone afterwards."""
    work_dir = tmp_path / "work"
    async with running(tmp_path, _agent(work_dir)) as agent:
        await agent.cp.wait(lambda: _heartbeating(agent.cp, "w-c"))
        await _assign(agent.cp, "w-c", 1, ["python3", "-c", "x = b'x' * (128 * 2**20)"])
        await agent.cp.wait(lambda: 1 in agent.cp.outcomes("w-c"))
        outcome = agent.cp.outcomes("w-c")[1]
        assert outcome.state == "failed"
        assert outcome.detail.startswith("oom_killed: the kernel killed it"), outcome.detail
        here = _resources_of(work_dir, "w-c")
        assert here.find("101-1") is None


def _resources_of(work_dir: Path, worker_id: str) -> JobResources:
    """The worker's cgroups as a later life of its agent would find them (no setup side effect
    beyond its own folder)."""
    settings = AgentSettings(
        worker_id=worker_id, control_planes=["127.0.0.1:1"], cpu_millis=1, memory_mb=1, work_dir=str(work_dir)
    )
    found, _ = select_resources("auto", worker_key=worker_key(settings), job_nice=10, pids_max=16)
    return found


async def test_a_killed_agents_job_cgroup_is_removed_by_its_next_start(
    tmp_path: Path, cgroups_here: Mode
) -> None:
    """SIGKILL of the agent while a job runs leaves the job running in its cgroup (its reaper
    outlives the agent, for the next agent process to take it over); the agent started again on
    the same work folder keeps that cgroup at its start, takes the job over, stops it (the
    scripted control plane does not continue the incarnation) and then removes the cgroup."""
    work_dir = tmp_path / "work"
    async with running(tmp_path, _agent(work_dir)) as agent:
        await agent.cp.wait(lambda: _heartbeating(agent.cp, "w-c"))
        await _assign(agent.cp, "w-c", 1, ["sleep", "60"])
        await agent.cp.wait(lambda: 1 in agent.cp.beats[-1][1].running_assignment_ids)
        agent.process.kill()
        await agent.process.wait()
    left = _resources_of(work_dir, "w-c")
    assert left.find("101-1") is not None
    async with running(tmp_path, _agent(work_dir)) as again:
        await again.cp.wait(lambda: _heartbeating(again.cp, "w-c"))
        assert left.find("101-1") is None
    logged = again.stderr.read_text()
    assert "found jobs of the previous agent process" in logged
    assert "removed job cgroups left by an earlier life of this worker" not in logged


async def test_an_agent_forced_to_rlimits_says_so_in_its_label_and_its_log(tmp_path: Path) -> None:
    """--job-resources rlimit: the worker registers resources=rlimit, logs what is not enforced,
    and its job runs with RLIMIT_AS = its memory_mb."""
    work_dir = tmp_path / "work"
    async with running(tmp_path, _agent(work_dir, "--job-resources", "rlimit")) as agent:
        await agent.cp.wait(lambda: _heartbeating(agent.cp, "w-c"))
        assert agent.cp.registration("w-c")[1].labels["resources"] == "rlimit"
        await _assign(agent.cp, "w-c", 1, ["grep", "Max address space", "/proc/self/limits"])
        await agent.cp.wait(lambda: 1 in agent.cp.outcomes("w-c"))
    outcome = agent.cp.outcomes("w-c")[1]
    assert _read(outcome.stdout_path).split()[3] == str(64 * 2**20)
    logged = agent.stderr.read_text()
    assert "job resources: rlimit only, no cgroups" in logged and "not enforced" in logged


def test_an_agent_asked_for_a_mode_this_machine_lacks_refuses_to_start_saying_why(tmp_path: Path) -> None:
    """--job-resources cgroup2 where the unified hierarchy offers no controllers: exit 1 with one
    line naming the mode and why, no traceback."""
    mode, _ = _machine_mode()
    if mode is Mode.CGROUP2:
        pytest.skip("this machine has a usable cgroup v2")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.cli",
            *_agent(tmp_path / "work", "--job-resources", "cgroup2"),
            "--control-planes",
            "127.0.0.1:1",
            "--insecure",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "job_resources cgroup2 cannot be used here: " in done.stderr
    assert "Traceback" not in done.stderr


async def test_every_worker_of_a_fleet_runs_its_jobs_in_cgroups_of_its_own(
    tmp_path: Path, cgroups_here: Mode
) -> None:
    """Two workers in one fleet process both register resources=<mode>; each one's job runs in
    a cgroup under that worker's own folder."""
    spec = tmp_path / "fleet.json"
    spec.write_text(
        json.dumps(
            [
                {"id": f"w-{i}", "port": 0, "cpu_millis": 1000, "memory_mb": 1000, "work_dir": f"w-{i}"}
                for i in (1, 2)
            ]
        )
    )
    command = ["fleet", "--id", "fleet-c", "--spec", str(spec), "--heartbeat-interval-s", str(HEARTBEAT_S)]
    async with running(tmp_path, command) as fleet:
        await fleet.cp.wait(lambda: _heartbeating(fleet.cp, "w-1") and _heartbeating(fleet.cp, "w-2"))
        for aid, worker_id in enumerate(("w-1", "w-2"), start=1):
            assert fleet.cp.registration(worker_id)[1].labels["resources"] == cgroups_here.value
            await _assign(fleet.cp, worker_id, aid, ["cat", "/proc/self/cgroup"])
        await fleet.cp.wait(lambda: 1 in fleet.cp.outcomes("w-1") and 2 in fleet.cp.outcomes("w-2"))
        for aid, worker_id in enumerate(("w-1", "w-2"), start=1):
            outcome = fleet.cp.outcomes(worker_id)[aid]
            assert outcome.state == "succeeded", outcome.detail
            key = worker_key(
                AgentSettings(
                    worker_id=worker_id,
                    control_planes=["127.0.0.1:1"],
                    cpu_millis=1,
                    memory_mb=1,
                    work_dir=str(tmp_path / worker_id),
                )
            )
            lines = _read(outcome.stdout_path).splitlines()
            assert any(line.endswith(f"{key}/{100 + aid}-{aid}") for line in lines), lines
