"""Container jobs of an agent run as a real process, killed or frozen: its containers stop (or
pause) anyway, by their supervisors (the harness of test_agent_reaper.py: a scripted control
plane, one assignment, SIGKILL or SIGSTOP of the agent)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from container_images import remove_containers
from test_agent_reaper import FENCE_S, WORKER, assign, running_agent, wait_for

from agent.container import container_name
from agent.runtimes import ContainerJob, owner_of
from protocol import pb

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="container jobs need Linux")


def _name(tmp_path: Path) -> str:
    """The container of the one assignment (job 10, assignment 1) the harness's agent (work
    folder ``tmp_path/work``) is sent."""
    owner = owner_of(str(tmp_path / "work"))
    job = ContainerJob(
        worker_id=WORKER, job_id=10, assignment_id=1, cpu_millis=100, memory_mb=64, owner=owner
    )
    return container_name(job)


@pytest.fixture
def no_containers_left(job_image: str) -> Iterator[str]:
    """The job image; the harness worker's containers are removed before and after."""
    remove_containers(WORKER)
    try:
        yield job_image
    finally:
        remove_containers(WORKER)


def _state(name: str) -> dict[str, Any] | None:
    import docker
    import docker.errors

    client = docker.from_env(timeout=10)
    try:
        return dict(client.containers.get(name).attrs["State"])
    except docker.errors.NotFound:
        return None
    finally:
        client.close()


def _spec(image: str) -> pb.JobSpec:
    return pb.JobSpec(
        cpu_millis=100, memory_mb=64, container=pb.ContainerRuntime(image=image, argv=["sleep", "300"])
    )


async def test_a_sigkilled_agents_container_is_killed_by_its_supervisor(
    no_containers_left: str, tmp_path: Path
) -> None:
    """SIGKILL of the agent: its container's supervisor (parent-death signal) kills the
    container and removes it."""
    name = _name(tmp_path)
    async with running_agent(tmp_path) as agent:
        await assign(agent, _spec(no_containers_left))
        await wait_for(lambda: (_state(name) or {}).get("Running") is True, timeout_s=30)
        agent.process.kill()
        await agent.process.wait()
        await wait_for(lambda: _state(name) is None, timeout_s=15)


async def test_a_frozen_agents_container_is_paused_at_the_deadline_then_killed_at_the_grace(
    no_containers_left: str, tmp_path: Path
) -> None:
    """A SIGSTOPped agent's container is paused (docker pause) by its supervisor once the fence
    deadline passes, while the agent is still frozen, and killed at the kill deadline."""
    grace_s = 4.0
    name = _name(tmp_path)
    async with running_agent(tmp_path, db_outage_grace_s=grace_s) as agent:
        await assign(agent, _spec(no_containers_left))
        await wait_for(lambda: (_state(name) or {}).get("Running") is True, timeout_s=30)
        agent.process.send_signal(signal.SIGSTOP)
        deadline = agent.deadline_unix_s()
        assert (_state(name) or {}).get("Paused") is False
        await trio.sleep(max(0.0, deadline - time.time()))
        # A docker pause takes a while on a loaded machine: paused soon after, the agent frozen.
        await wait_for(lambda: (_state(name) or {}).get("Paused") is True, timeout_s=5)
        assert agent.process.poll() is None
        kill_at = deadline - FENCE_S + grace_s
        await trio.sleep(max(0.0, kill_at + 1.0 - time.time()))
        assert (_state(name) or {}).get("Running") is not True, "the paused container outlived the grace"
        agent.process.send_signal(signal.SIGCONT)
        await wait_for(lambda: len(agent.cp.registrations) == 2, timeout_s=15)
        (stop,) = agent.stops()
        assert stop["reason"] == "self_fence"
        assert deadline - 0.05 <= stop["time"] <= deadline + 2.0  # when the pause was made
