"""How the launcher stops its processes: each one's deadline from SIGTERM to SIGKILL, and the
group stopped with a deadline per process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from ops.launcher.procs import (
    CONTROL_PLANE_STOP_S,
    PER_WORKER_STOP_S,
    WORKER_STOP_SLACK_S,
    stop_deadline_s,
    terminate,
)
from ops.launcher.state import ProcessSpec
from runtime.settings.agent import DEFAULT_LEAVE_TIMEOUT_S


def spec(kind: str, *args: str) -> ProcessSpec:
    return ProcessSpec(id=f"{kind}-1", kind=kind, address="", args=(kind, "--id", f"{kind}-1", *args))


def test_a_control_plane_has_the_fixed_deadline() -> None:
    """A control plane is SIGKILLed CONTROL_PLANE_STOP_S after SIGTERM, whatever it hosts."""
    assert stop_deadline_s(spec("cp"), 0) == CONTROL_PLANE_STOP_S


def test_a_workers_process_has_its_leave_budget_and_more_per_worker() -> None:
    """An agent gets its leave timeout plus the slack plus one worker's share; a fleet of 20
    gets 20 shares, and a --leave-timeout-s on its command line replaces the default."""
    one = stop_deadline_s(spec("agent"), 1)
    assert one == DEFAULT_LEAVE_TIMEOUT_S + WORKER_STOP_SLACK_S + PER_WORKER_STOP_S
    fleet = stop_deadline_s(spec("fleet", "--leave-timeout-s", "4"), 20)
    assert fleet == 4.0 + WORKER_STOP_SLACK_S + 20 * PER_WORKER_STOP_S
    assert stop_deadline_s(spec("fleet", "--leave-timeout-s=4"), 20) == fleet
    assert stop_deadline_s(spec("fleet"), 40) > stop_deadline_s(spec("fleet"), 20) > one


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for child in started:
            if child.poll() is None:  # not reaped yet (by psutil)
                child.kill()
                child.wait()


def test_each_process_is_killed_only_past_its_own_deadline(children: list[subprocess.Popen[bytes]]) -> None:
    """Of two processes that ignore SIGTERM, the one with a short deadline is SIGKILLed and the
    group returns only once the other, given a long one, has exited on its own; one that obeys
    SIGTERM is not killed."""
    ignores = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
    )
    commands = {
        "stuck": ignores + "time.sleep(60)",
        "slow": ignores + "time.sleep(1.0)",
        "obeys": "import time; print(1, flush=True); time.sleep(60)",
    }
    for command in commands.values():
        children.append(subprocess.Popen([sys.executable, "-c", command], stdout=subprocess.PIPE))
    for child in children:
        assert child.stdout is not None and child.stdout.readline()  # its handler is in place
    group = {name: psutil.Process(child.pid) for name, child in zip(commands, children, strict=True)}
    killed = terminate(group, {"stuck": 0.2, "slow": 30.0, "obeys": 30.0})
    assert killed == ["stuck"]
    # psutil reaped them (they are this process's children) and kept how each ended.
    assert {name: process.returncode for name, process in group.items()} == {
        "stuck": -9,
        "slow": 0,
        "obeys": -15,
    }
