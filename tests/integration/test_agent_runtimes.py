"""Job runtimes with real child processes: exit codes, output files, stops, and PDEATHSIG."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from agent.messages import CommandSpec, JobState, SleepSpec
from agent.runtimes import run_job

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="command jobs need Linux")


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``predicate`` (a file or /proc check: nothing to wait on) until it holds."""
    with trio.fail_after(timeout_s):
        while True:
            if predicate():
                return
            await trio.sleep(0.02)


def _read(path: str | Path) -> str:
    return Path(path).read_text()


async def test_command_records_exit_code_and_output(tmp_path: Path) -> None:
    """A command's exit code is recorded and its stdout/stderr land in the job folder."""
    result = await run_job(
        CommandSpec(argv=("sh", "-c", "echo hi; echo oops >&2; exit 3")),
        job_dir=tmp_path / "7-70",
        stop=trio.Event(),
        stop_grace_s=1.0,
    )
    assert result.state is JobState.FAILED and result.exit_code == 3 and not result.stopped
    assert Path(result.stdout_path) == tmp_path / "7-70" / "stdout.log"
    assert _read(result.stdout_path) == "hi\n"
    assert _read(result.stderr_path) == "oops\n"
    assert result.finished_unix_s >= result.started_unix_s


async def test_command_runs_in_its_job_folder(tmp_path: Path) -> None:
    """The command's working directory is its job folder; exit 0 is success."""
    result = await run_job(
        CommandSpec(argv=("pwd",)), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0
    )
    assert result.state is JobState.SUCCEEDED and result.exit_code == 0
    assert _read(result.stdout_path).strip() == str(tmp_path / "j")


async def test_missing_command_fails_with_a_detail(tmp_path: Path) -> None:
    """A command that cannot be started is a failed result naming the error, no exit code."""
    result = await run_job(
        CommandSpec(argv=("no-such-command-xyz",)),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
    )
    assert result.state is JobState.FAILED and result.exit_code is None
    assert "no-such-command-xyz" in result.detail and "No such file" in result.detail


async def test_stop_sends_sigterm(tmp_path: Path) -> None:
    """A stopped command gets SIGTERM and the result says it was stopped."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_later, stop, 0.2)
        with trio.fail_after(5):
            result = await run_job(
                CommandSpec(argv=("sleep", "30")), job_dir=tmp_path / "j", stop=stop, stop_grace_s=5.0
            )
    assert result.stopped and result.state is JobState.CANCELLED
    assert result.exit_code == -signal.SIGTERM


async def test_stop_sigkills_after_the_grace(tmp_path: Path) -> None:
    """A command that ignores SIGTERM is SIGKILLed after stop_grace_s."""
    stop = trio.Event()
    ready = tmp_path / "ready"
    argv = ("sh", "-c", f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_when, stop, ready.exists)
        started = trio.current_time()
        result = await run_job(CommandSpec(argv=argv), job_dir=tmp_path / "j", stop=stop, stop_grace_s=0.3)
    assert result.exit_code == -signal.SIGKILL
    assert trio.current_time() - started >= 0.3


async def test_leftover_group_members_are_killed_when_the_job_ends(tmp_path: Path) -> None:
    """When a command's main process exits, what it left running in its group is killed."""
    pid_file = tmp_path / "bg.pid"
    argv = ("sh", "-c", f"sleep 60 & echo $! > {pid_file}")
    result = await run_job(
        CommandSpec(argv=argv), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0
    )
    assert result.exit_code == 0
    background = int(pid_file.read_text())
    await _wait_for(lambda: not _alive(background))


async def test_cancelled_runtime_kills_its_process(tmp_path: Path) -> None:
    """If the runtime itself is cancelled, it kills and reaps the process before raising."""
    pid_file = tmp_path / "pid"
    argv = ("sh", "-c", f"echo $$ > {pid_file}; exec sleep 60")
    with trio.move_on_after(1.0):
        await run_job(CommandSpec(argv=argv), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0)
    assert not _alive(int(pid_file.read_text()))


async def test_sleep_job_succeeds_or_stops(tmp_path: Path) -> None:
    """A sleep job succeeds after its duration, or ends at once when stopped."""
    done = await run_job(SleepSpec(duration_ms=10), job_dir=tmp_path, stop=trio.Event(), stop_grace_s=1.0)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    stop = trio.Event()
    stop.set()
    stopped = await run_job(SleepSpec(duration_ms=60_000), job_dir=tmp_path, stop=stop, stop_grace_s=1.0)
    assert stopped.stopped and stopped.state is JobState.CANCELLED


async def test_child_dies_when_the_agent_is_sigkilled(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a command job dies with the agent process that started it."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import trio
        from pathlib import Path
        from agent.messages import CommandSpec
        from agent.runtimes import run_job
        argv = ("sh", "-c", "echo $$ > {pid_file}; exec sleep 60")
        trio.run(lambda: run_job(CommandSpec(argv=argv), job_dir=Path({str(tmp_path)!r}) / "j",
                                 stop=trio.Event(), stop_grace_s=1.0))
    """)
    agent = await trio.lowlevel.open_process([sys.executable, "-c", script])
    try:
        await _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        child = int(pid_file.read_text())
        await trio.sleep(0.3)
        assert _alive(child)
        agent.send_signal(signal.SIGKILL)
        await agent.wait()
        await _wait_for(lambda: not _alive(child))
    finally:
        if agent.poll() is None:
            agent.kill()
            await agent.wait()
        if pid_file.exists() and pid_file.read_text().strip():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


async def _set_later(event: trio.Event, delay_s: float) -> None:
    await trio.sleep(delay_s)
    event.set()


async def _set_when(event: trio.Event, predicate: Callable[[], bool]) -> None:
    await _wait_for(predicate)
    event.set()
