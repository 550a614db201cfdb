"""A job's timeout, working directory and environment, with real child processes: the reaper
stops a command at its timeout (its whole tree), the agent stops a sleep at its own; a command
runs in its ``workdir`` or fails naming a missing one; ``env`` reaches the command."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import trio

from agent.messages import JobState
from agent.runtimes import RunOptions, run_job
from runtime.jobs import CommandRuntime, SleepRuntime

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux")


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_command_past_its_timeout_fails_with_reason_timeout_and_its_tree_is_gone(
    tmp_path: Path,
) -> None:
    """A command (and a grandchild it started) running past ``timeout_s`` is stopped by its
    reaper and ends failed, not stopped, its detail beginning ``timeout``."""
    script = "sleep 60 & echo $! > child.pid; sleep 60"
    began = time.monotonic()
    result = await run_job(
        CommandRuntime(argv=("sh", "-c", script)),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_options=RunOptions(timeout_s=0.5),
    )
    assert result.state is JobState.FAILED and not result.stopped
    assert result.detail.startswith("timeout: ran past its timeout_s of 0.5 s")
    assert time.monotonic() - began < 60, "the job ran its whole sleep: nothing stopped it"
    child = int((tmp_path / "j" / "child.pid").read_text())
    assert not _alive(child)


async def test_a_command_within_its_timeout_ends_on_its_own(tmp_path: Path) -> None:
    """A command that ends before its timeout keeps its own end."""
    result = await run_job(
        CommandRuntime(argv=("true",)),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_options=RunOptions(timeout_s=30),
    )
    assert result.state is JobState.SUCCEEDED and result.detail == "exit code 0"


async def test_a_sleep_past_its_timeout_fails_with_reason_timeout() -> None:
    """The agent times a sleep job's ``timeout_s`` itself: it ends failed, reason timeout."""
    result = await run_job(
        SleepRuntime(duration_ms=60_000),
        job_dir=Path("/nonexistent"),
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_options=RunOptions(timeout_s=0.2),
    )
    assert result.state is JobState.FAILED and not result.stopped
    assert result.detail.startswith("timeout:")


async def test_a_stop_before_the_timeout_is_a_stop() -> None:
    """A job stopped (cancelled) before its timeout is a stop, not a timeout."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _set_later(stop, 0.1))
        result = await run_job(
            SleepRuntime(duration_ms=60_000),
            job_dir=Path("/nonexistent"),
            stop=stop,
            stop_grace_s=1.0,
            run_options=RunOptions(timeout_s=30),
        )
    assert result.stopped and result.state is JobState.CANCELLED


async def _set_later(event: trio.Event, delay_s: float) -> None:
    await trio.sleep(delay_s)
    event.set()


async def test_a_command_runs_in_its_workdir(tmp_path: Path) -> None:
    """``workdir`` is the command's working directory."""
    workdir = tmp_path / "here"
    workdir.mkdir()
    result = await run_job(
        CommandRuntime(argv=("pwd",)),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_options=RunOptions(workdir=str(workdir)),
    )
    assert result.state is JobState.SUCCEEDED
    assert _read(result.stdout_path).strip() == str(workdir)


async def test_a_missing_workdir_fails_the_job_naming_it(tmp_path: Path) -> None:
    """A ``workdir`` that is not a directory on the worker: the job never runs and fails
    with detail ``workdir_not_found`` naming the path."""
    missing = tmp_path / "missing"
    result = await run_job(
        CommandRuntime(argv=("touch", str(tmp_path / "ran"))),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_options=RunOptions(workdir=str(missing)),
    )
    assert result.state is JobState.FAILED and not result.started
    assert result.detail.startswith("workdir_not_found:") and str(missing) in result.detail
    assert not (tmp_path / "ran").exists()


async def test_env_reaches_the_command(tmp_path: Path) -> None:
    """The job's environment variables reach the command."""
    result = await run_job(
        CommandRuntime(argv=("sh", "-c", 'printf %s "$GREETING"')),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
        job_env={"GREETING": "hello world"},
    )
    assert _read(result.stdout_path) == "hello world"


async def test_the_jobs_env_may_set_path_and_home(tmp_path: Path) -> None:
    """A job's own PATH and HOME win over the agent's defaults."""
    result = await run_job(
        CommandRuntime(argv=("/bin/sh", "-c", 'printf "%s %s" "$PATH" "$HOME"')),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
        job_env={"PATH": "/opt/x:/usr/bin:/bin", "HOME": "/srv/home"},
    )
    assert _read(result.stdout_path) == "/opt/x:/usr/bin:/bin /srv/home"
