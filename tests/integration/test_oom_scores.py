"""Who the kernel's OOM killer takes first, read from /proc of real processes: an agent (or a
fleet) lowers its ``oom_score_adj`` (as far as the kernel lets it), its reapers keep the agent's,
and its jobs, in every resource mode and in containers, get ``job_oom_score_adj`` (1000).

Each agent starts from an ``oom_score_adj`` of :data:`START` (raising one needs no right), so a
test sees the agent lower its own whether or not this machine grants ``CAP_SYS_RESOURCE``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from container_images import remove_containers
from jobfiles import job_writable
from test_agent_reaper import MARKER, WORKER, AgentProcess, RecordingControlPlane, assign, wait_for

from agent.container import container_name
from agent.runtimes import ContainerJob, owner_of
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import asyncio_bridge, serve_grpc, trio_service
from runtime.oom import DEFAULT_AGENT_OOM_SCORE_ADJ, read_oom_score_adj

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/PID/oom_score_adj is Linux's")

START = 500
"""The ``oom_score_adj`` every agent of these tests inherits."""

_CAP_SYS_RESOURCE = 24


def has_cap_sys_resource() -> bool:
    """Whether this process (and so an agent it starts) may lower an ``oom_score_adj`` at will."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    return False


def _script(kind: str, cp_port: int, work_dir: Path, options: dict[str, Any]) -> str:
    settings = (
        f"AgentSettings(worker_id={WORKER!r}, control_planes=['127.0.0.1:{cp_port}'], cpu_millis=1000, "
        f"memory_mb=1000, work_dir={str(work_dir)!r}, heartbeat_interval_s=0.1, stop_grace_s=0.5, "
        f"**{options!r})"
    )
    run = f"main({settings})" if kind == "agent" else f"main([{settings}], fleet_id='fleet-oom')"
    module = "agent.main" if kind == "agent" else "agent.fleet"
    return textwrap.dedent(f"""
        with open("/proc/self/oom_score_adj", "w") as file:
            file.write("{START}")
        from {module} import main
        from runtime.settings.agent import AgentSettings
        {run}
    """)


@asynccontextmanager
async def agent_process(tmp_path: Path, kind: str = "agent", **options: Any) -> AsyncIterator[AgentProcess]:
    """An agent (``kind`` "agent") or a one-worker fleet ("fleet") process of worker
    :data:`WORKER` with the AgentSettings ``options``, registered with a recording control
    plane; stopped (and whatever it left killed) on the way out."""
    cp = RecordingControlPlane()
    marker = uuid.uuid4().hex
    work_dir = tmp_path / "work"
    stderr_path = tmp_path / "agent.stderr"
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        with stderr_path.open("wb") as stderr_file:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-c", _script(kind, cp_port, work_dir, options)],
                stdout=subprocess.DEVNULL,
                stderr=stderr_file,
                env={**os.environ, MARKER: marker},
            )
        agent = AgentProcess(process=process, cp=cp, work_dir=work_dir, marker=marker)
        try:
            with trio.fail_after(30):
                await _first(cp.heartbeated.wait, process.wait)
            assert process.poll() is None, f"the agent exited: {stderr_path.read_text()}"
            yield agent
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                with trio.move_on_after(15):
                    await process.wait()
                if process.poll() is None:
                    process.kill()
                    await process.wait()
            for leftover in agent.leftovers():
                with suppress(psutil.NoSuchProcess):
                    leftover.kill()
            nursery.cancel_scope.cancel()


async def _first(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return once the first of ``waits`` has returned."""
    async with trio.open_nursery() as nursery:
        for wait in waits:

            async def run(wait: Callable[[], Awaitable[object]] = wait) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(run)


def _unavailable(mode: str) -> str:
    """Why an agent here cannot enforce resources in ``mode`` (empty: it can), probed in a
    process of its own (a cgroup2 agent moves itself into a leaf cgroup)."""
    probe = (
        "import sys, uuid\n"
        "from agent.cgroups import select_resources\n"
        "from runtime.errors import ResourcesUnavailable\n"
        "try:\n"
        f"    found, _ = select_resources({mode!r}, worker_key='w-probe-' + uuid.uuid4().hex[:8], "
        "job_nice=10, pids_max=16)\n"
        "except ResourcesUnavailable as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    found.close()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


@pytest.fixture
def resource_mode(request: pytest.FixtureRequest) -> str:
    """The ``job_resources`` the test is parametrized with; skips where this machine cannot."""
    mode: str = request.param
    if why := _unavailable(mode):
        pytest.skip(why)
    return mode


def _command(pid_file: Path) -> pb.JobSpec:
    """A job that writes its pid and its parent's (its reaper's), then sleeps."""
    argv = ["sh", "-c", f"echo $$ $PPID > {pid_file}; exec sleep 60"]
    return pb.JobSpec(cpu_millis=100, memory_mb=64, command=pb.CommandRuntime(argv=argv))


def _pids(pid_file: Path) -> tuple[int, int] | None:
    text = pid_file.read_text() if pid_file.exists() else ""
    if len(parts := text.split()) != 2:
        return None
    return int(parts[0]), int(parts[1])


def _agent_score_is_lowered(agent: AgentProcess, stderr: str) -> None:
    """The agent's own score: the one asked for where the kernel grants it, else as low as it
    could go (below what it inherited) and a warning said so."""
    score = read_oom_score_adj(agent.pid)
    assert score is not None
    if has_cap_sys_resource():
        assert score == DEFAULT_AGENT_OOM_SCORE_ADJ
    else:
        assert DEFAULT_AGENT_OOM_SCORE_ADJ < score < START
        assert "OOM score not lowered as asked" in stderr


@pytest.mark.parametrize(
    ("kind", "resource_mode"),
    [("agent", "cgroup2"), ("agent", "cgroup1"), ("agent", "rlimit"), ("fleet", "auto")],
    indirect=["resource_mode"],
)
async def test_the_agent_and_its_reaper_are_protected_and_the_job_goes_first(
    tmp_path: Path, kind: str, resource_mode: str
) -> None:
    """In each resource mode, and in a fleet, the agent lowers its oom_score_adj, the job's
    reaper keeps the agent's, and the job has 1000."""
    pid_file = job_writable(tmp_path) / "pids"
    async with agent_process(tmp_path, kind, job_resources=resource_mode) as agent:
        await assign(agent, _command(pid_file))
        await wait_for(lambda: _pids(pid_file) is not None, timeout_s=15)
        pids = _pids(pid_file)
        assert pids is not None
        job, reaper = pids
        scores = (read_oom_score_adj(agent.pid), read_oom_score_adj(reaper), read_oom_score_adj(job))
        _agent_score_is_lowered(agent, (tmp_path / "agent.stderr").read_text())
    assert scores[1:] == (scores[0], 1000)


async def test_a_job_gets_the_workers_job_oom_score_adj(tmp_path: Path) -> None:
    """job_oom_score_adj 300: the job's process has 300."""
    pid_file = job_writable(tmp_path) / "pids"
    async with agent_process(tmp_path, job_resources="rlimit", job_oom_score_adj=300) as agent:
        await assign(agent, _command(pid_file))
        await wait_for(lambda: _pids(pid_file) is not None, timeout_s=15)
        pids = _pids(pid_file)
        assert pids is not None
        assert read_oom_score_adj(pids[0]) == 300


@pytest.mark.skipif(
    os.geteuid() != 0 or not has_cap_sys_resource(),
    reason="a job keeps its score only when a root agent's reaper sets it with CAP_SYS_RESOURCE",
)
async def test_a_job_run_as_the_job_user_cannot_lower_its_score(tmp_path: Path) -> None:
    """A root agent's job (run as the job user) that writes 0 to its oom_score_adj is refused
    and keeps 1000."""
    out = job_writable(tmp_path) / "out"
    argv = [
        "sh",
        "-c",
        f"(echo 0 > /proc/self/oom_score_adj) 2>/dev/null; cat /proc/self/oom_score_adj > {out}",
    ]
    spec = pb.JobSpec(cpu_millis=100, memory_mb=64, command=pb.CommandRuntime(argv=argv))
    async with agent_process(tmp_path, job_resources="rlimit") as agent:
        await assign(agent, spec)
        await wait_for(lambda: out.exists() and out.read_text().strip() != "", timeout_s=15)
    assert out.read_text().strip() == "1000"


@pytest.fixture
def no_containers_left(job_image: str) -> Iterator[str]:
    """The job image; the test worker's containers are removed before and after."""
    remove_containers(WORKER)
    try:
        yield job_image
    finally:
        remove_containers(WORKER)


def _container(name: str) -> dict[str, Any] | None:
    import docker
    import docker.errors

    client = docker.from_env(timeout=10)
    try:
        return dict(client.containers.get(name).attrs)
    except docker.errors.NotFound:
        return None
    finally:
        client.close()


async def test_a_container_job_goes_first_too(no_containers_left: str, tmp_path: Path) -> None:
    """A container job's container is created with OomScoreAdj 1000 and its processes have it;
    its supervisor keeps the agent's score."""
    owner = owner_of(str(tmp_path / "work"))
    name = container_name(
        ContainerJob(worker_id=WORKER, job_id=10, assignment_id=1, cpu_millis=100, memory_mb=64, owner=owner)
    )
    spec = pb.JobSpec(
        cpu_millis=100,
        memory_mb=64,
        container=pb.ContainerRuntime(image=no_containers_left, argv=["sleep", "300"]),
    )
    async with agent_process(tmp_path, job_resources="rlimit") as agent:
        await assign(agent, spec)
        await wait_for(
            lambda: ((_container(name) or {}).get("State") or {}).get("Running") is True, timeout_s=30
        )
        found = _container(name)
        assert found is not None
        container_pid = int(found["State"]["Pid"])
        supervisors = [p.pid for p in psutil.Process(agent.pid).children()]
        scores = {
            "container": (found["HostConfig"]["OomScoreAdj"], read_oom_score_adj(container_pid)),
            "supervisor": [read_oom_score_adj(pid) for pid in supervisors],
        }
        agent_score = read_oom_score_adj(agent.pid)
    assert scores == {"container": (1000, 1000), "supervisor": [agent_score]}
