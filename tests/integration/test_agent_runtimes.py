"""Job runtimes with real child processes: exit codes, output files, stops, the reaper that
kills a job with the agent or at the fence deadline."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from agent.deadman import FENCED_AT_FILE, write_fence_deadline
from agent.fence import trio_time_of
from agent.job_results import JobResult
from agent.messages import JobState
from agent.runtimes import RunOptions, run_job
from agent.supervised import StopNotice
from runtime.jobs import CommandRuntime, SleepRuntime
from runtime.os_users import RunAs, resolve_unprivileged_user
from runtime.settings.agent import SHARED_JOB_USER

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
        CommandRuntime(argv=("sh", "-c", "echo hi; echo oops >&2; exit 3")),
        job_dir=tmp_path / "7-70",
        stop=trio.Event(),
        stop_grace_s=1.0,
    )
    assert result.state is JobState.FAILED and result.exit_code == 3 and not result.stopped
    assert Path(result.stdout_path) == tmp_path / "7-70" / "stdout.log"
    assert _read(result.stdout_path) == "hi\n"
    assert _read(result.stderr_path) == "oops\n"
    assert result.ended_at >= result.began_at


async def test_command_runs_in_its_job_folder(tmp_path: Path) -> None:
    """The command's working directory is its job folder; exit 0 is success."""
    result = await run_job(
        CommandRuntime(argv=("pwd",)), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0
    )
    assert result.state is JobState.SUCCEEDED and result.exit_code == 0
    assert _read(result.stdout_path).strip() == str(tmp_path / "j")


async def test_missing_command_fails_with_a_detail(tmp_path: Path) -> None:
    """A command that does not exist is a failed result naming the error with the reason
    command_not_found (what no_retry_on may list), no exit code."""
    result = await run_job(
        CommandRuntime(argv=("no-such-command-xyz",)),
        job_dir=tmp_path / "j",
        stop=trio.Event(),
        stop_grace_s=1.0,
    )
    assert result.state is JobState.FAILED and result.exit_code is None
    assert "no-such-command-xyz" in result.detail and "No such file" in result.detail
    assert result.detail.startswith("command_not_found: ")


async def test_stop_sends_sigterm(tmp_path: Path) -> None:
    """A stopped command gets SIGTERM and the result says it was stopped."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_later, stop, 0.2)
        with trio.fail_after(5):
            result = await run_job(
                CommandRuntime(argv=("sleep", "30")), job_dir=tmp_path / "j", stop=stop, stop_grace_s=5.0
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
        result = await run_job(CommandRuntime(argv=argv), job_dir=tmp_path / "j", stop=stop, stop_grace_s=0.3)
    assert result.exit_code == -signal.SIGKILL
    assert trio.current_time() - started >= 0.3


async def test_leftover_group_members_are_killed_when_the_job_ends(tmp_path: Path) -> None:
    """When a command's main process exits, what it left running in its group is killed."""
    pid_file = tmp_path / "bg.pid"
    argv = ("sh", "-c", f"sleep 60 & echo $! > {pid_file}")
    result = await run_job(
        CommandRuntime(argv=argv), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0
    )
    assert result.exit_code == 0
    background = int(pid_file.read_text())
    await _wait_for(lambda: not _alive(background))


async def test_cancelled_runtime_kills_its_process(tmp_path: Path) -> None:
    """If the runtime itself is cancelled, it kills and reaps the process before raising."""
    pid_file = tmp_path / "pid"
    argv = ("sh", "-c", f"echo $$ > {pid_file}; exec sleep 60")
    with trio.move_on_after(1.0):
        await run_job(CommandRuntime(argv=argv), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0)
    assert not _alive(int(pid_file.read_text()))


async def test_sleep_job_succeeds_or_stops(tmp_path: Path) -> None:
    """A sleep job succeeds after its duration, or ends at once when stopped."""
    done = await run_job(SleepRuntime(duration_ms=10), job_dir=tmp_path, stop=trio.Event(), stop_grace_s=1.0)
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    stop = trio.Event()
    stop.set()
    stopped = await run_job(SleepRuntime(duration_ms=60_000), job_dir=tmp_path, stop=stop, stop_grace_s=1.0)
    assert stopped.stopped and stopped.state is JobState.CANCELLED


async def test_child_dies_when_the_agent_is_sigkilled(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG: a command job run with no fence-deadline file (a tool's run_job: no
    deadman, nothing could take it over) dies with the process that started it."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import trio
        from pathlib import Path
        from runtime.jobs import CommandRuntime
        from agent.job_results import JobResult
        from agent.runtimes import RunOptions, run_job
        argv = ("sh", "-c", "echo $$ > {pid_file}; exec sleep 60")
        trio.run(lambda: run_job(CommandRuntime(argv=argv), job_dir=Path({str(tmp_path)!r}) / "j",
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


async def test_a_grandchild_in_another_session_is_killed_when_the_job_ends(tmp_path: Path) -> None:
    """The reaper is a child subreaper: a process the job moved to a session of its own, and
    orphaned, is still killed when the job's main process exits."""
    pid_file = tmp_path / "escaped.pid"
    inner = f"echo $$ > {pid_file}; exec sleep 60"
    argv = ("sh", "-c", f"setsid sh -c '{inner}' & while [ ! -s {pid_file} ]; do sleep 0.01; done")
    result = await run_job(
        CommandRuntime(argv=argv), job_dir=tmp_path / "j", stop=trio.Event(), stop_grace_s=1.0
    )
    assert result.exit_code == 0
    escaped = int(pid_file.read_text())
    await _wait_for(lambda: not _alive(escaped), timeout_s=1.0)


def _deadline_in(path: Path, delay_s: float) -> float:
    """Write a fence deadline ``delay_s`` from now; return it (``time.monotonic()``, the clock of
    the file and of the reaper's times)."""
    deadline = time.monotonic() + delay_s
    write_fence_deadline(path, deadline)
    return deadline


async def test_the_reaper_kills_the_job_once_the_fence_deadline_passes(tmp_path: Path) -> None:
    """Past the fence deadline the reaper SIGKILLs the job, grandchildren included, records
    the kill time, and the result says the job was fenced and ended then."""
    deadline_file = tmp_path / "fence_deadline"
    deadline = _deadline_in(deadline_file, 0.5)
    pid_file = tmp_path / "grandchild.pid"
    argv = ("sh", "-c", f"sh -c 'echo $$ > {pid_file}; exec sleep 60'; true")
    with trio.fail_after(5):
        result = await run_job(
            CommandRuntime(argv=argv),
            job_dir=tmp_path / "j",
            stop=trio.Event(),
            stop_grace_s=5.0,
            fence_deadline_path=deadline_file,
        )
    assert result.fenced and result.stopped and result.state is JobState.CANCELLED
    assert result.exit_code == -signal.SIGKILL
    fenced_at = float((tmp_path / "j" / FENCED_AT_FILE).read_text())
    assert result.ended_at == pytest.approx(trio_time_of(fenced_at), abs=1e-3)
    assert deadline - 0.001 <= fenced_at < deadline + 0.1
    assert not _alive(int(pid_file.read_text()))


async def test_a_deadline_that_moves_on_keeps_the_job_running(tmp_path: Path) -> None:
    """The reaper reads the deadline file anew: a job whose deadline keeps moving runs on."""
    deadline_file = tmp_path / "fence_deadline"
    # Each move leaves 2 s: a loaded machine may run the mover late, never that late.
    _deadline_in(deadline_file, 2.0)
    stop = trio.Event()

    async def heartbeat_then_stop() -> None:
        for _ in range(25):  # 2.5 s, past the first deadline
            await trio.sleep(0.1)
            _deadline_in(deadline_file, 2.0)
        stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat_then_stop)
        result = await run_job(
            CommandRuntime(argv=("sleep", "30")),
            job_dir=tmp_path / "j",
            stop=stop,
            stop_grace_s=1.0,
            fence_deadline_path=deadline_file,
        )
    assert not result.fenced and result.stopped and result.exit_code == -signal.SIGTERM


async def test_the_fence_deadline_wins_over_a_preemptions_grace(tmp_path: Path) -> None:
    """A job given a stop with a grace of its own (ten minutes) that traps SIGTERM and runs on
    is killed by its reaper once the fence deadline passes, fenced, not after the grace."""
    deadline_file = tmp_path / "fence_deadline"
    _deadline_in(deadline_file, 60.0)
    out = tmp_path / "out"
    argv = ("sh", "-c", f"trap 'echo term >> {out}' TERM; echo up >> {out}; while :; do sleep 0.05; done")
    notice = StopNotice()

    async def preempt_then_fence() -> None:
        await _wait_for(lambda: out.exists() and "up" in _read(out))
        notice.give(600.0)
        await _wait_for(lambda: "term" in _read(out))
        _deadline_in(deadline_file, 0.0)  # the worker lost contact: kill now, no pause

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(preempt_then_fence)
            result = await run_job(
                CommandRuntime(argv=argv),
                job_dir=tmp_path / "j",
                stop=trio.Event(),
                stop_grace_s=1.0,
                fence_deadline_path=deadline_file,
                notice=notice,
            )
    assert result.fenced and result.stopped and result.exit_code == -signal.SIGKILL
    assert _read(out).split() == ["up", "term"]


async def test_a_stop_during_a_preemptions_grace_kills_after_the_stop_grace(tmp_path: Path) -> None:
    """A job given a stop with a grace of its own (ten minutes) that traps SIGTERM and runs on,
    then stopped as usual (an agent shutting down): it gets no second SIGTERM and is killed
    after the ordinary stop grace, stopped, not fenced."""
    out = tmp_path / "out"
    argv = ("sh", "-c", f"trap 'echo term >> {out}' TERM; echo up >> {out}; while :; do sleep 0.05; done")
    notice = StopNotice()
    stop = trio.Event()

    async def preempt_then_stop() -> None:
        await _wait_for(lambda: out.exists() and "up" in _read(out))
        notice.give(600.0)
        await _wait_for(lambda: "term" in _read(out))
        stop.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(preempt_then_stop)
            result = await run_job(
                CommandRuntime(argv=argv), job_dir=tmp_path / "j", stop=stop, stop_grace_s=0.3, notice=notice
            )
    assert result.stopped and not result.fenced and result.state is JobState.CANCELLED
    assert result.exit_code == -signal.SIGKILL
    assert _read(out).split() == ["up", "term"]


async def test_a_job_is_not_started_past_its_fence_deadline(tmp_path: Path) -> None:
    """A reaper that finds the deadline passed (or the file unreadable) never starts the job."""
    marker = tmp_path / "ran"
    for name, delay_s in (("passed", -1.0), ("missing", None)):
        deadline_file = tmp_path / f"{name}_deadline"
        if delay_s is not None:
            _deadline_in(deadline_file, delay_s)
        result = await run_job(
            CommandRuntime(argv=("touch", str(marker))),
            job_dir=tmp_path / name / "j",
            stop=trio.Event(),
            stop_grace_s=1.0,
            fence_deadline_path=deadline_file,
        )
        assert result.fenced and result.exit_code is None and "not started" in result.detail
    assert not marker.exists()


def _paused_deadline(path: Path, kill_in_s: float) -> None:
    """Write a fence-deadline file whose pause deadline has passed and whose kill deadline is
    ``kill_in_s`` from now: the worker's jobs are paused."""
    now = time.monotonic()
    write_fence_deadline(path, now - 0.1, now + kill_in_s)


async def _touch_while_paused(
    tmp_path: Path, kill_in_s: float, meanwhile: Callable[[Path, trio.Event], Awaitable[None]]
) -> tuple[JobResult, bool]:
    """Run a job that touches a marker file, its reaper started while the worker's jobs are
    paused (the kill deadline ``kill_in_s`` away), with ``meanwhile(deadline_file, stop)``
    beside it. Returns the result and whether the marker exists (whether the job ran)."""
    deadline_file = tmp_path / "fence_deadline"
    _paused_deadline(deadline_file, kill_in_s=kill_in_s)
    marker = tmp_path / "ran"
    stop = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(meanwhile, deadline_file, stop)
            result = await run_job(
                CommandRuntime(argv=("touch", str(marker))),
                job_dir=tmp_path / "j",
                stop=stop,
                stop_grace_s=1.0,
                fence_deadline_path=deadline_file,
            )
            nursery.cancel_scope.cancel()
    return result, marker.exists()


async def test_a_start_during_a_pause_is_held_and_made_once_the_deadline_moves_on(tmp_path: Path) -> None:
    """A reaper that starts while its worker's jobs are paused holds the start, and starts the
    job once the agent moves the deadlines on: the job runs and succeeds, not fenced."""

    async def resume_later(deadline_file: Path, stop: trio.Event) -> None:
        await trio.sleep(0.4)
        assert not (tmp_path / "ran").exists(), "started while paused"
        _deadline_in(deadline_file, 30.0)

    result, ran = await _touch_while_paused(tmp_path, 30.0, resume_later)
    assert result.state is JobState.SUCCEEDED and not result.fenced and result.started
    assert ran


async def test_a_start_held_during_a_pause_ends_unstarted_on_a_stop(tmp_path: Path) -> None:
    """A stop that comes while the start is held ends the job unstarted (a stop, not a
    fence), also when the agent moves the deadline on just after signalling it."""

    async def stop_later(deadline_file: Path, stop: trio.Event) -> None:
        await trio.sleep(0.4)
        stop.set()
        _deadline_in(deadline_file, 30.0)

    result, ran = await _touch_while_paused(tmp_path, 30.0, stop_later)
    assert result.stopped and not result.fenced and not result.started
    assert result.state is JobState.CANCELLED and result.exit_code is None
    assert "stopped before it was started" in result.detail
    assert not ran


async def test_a_start_held_during_a_pause_is_refused_at_the_kill_deadline(tmp_path: Path) -> None:
    """A start held through the whole outage grace is refused at the kill deadline: fenced,
    never started."""

    async def nothing(deadline_file: Path, stop: trio.Event) -> None:
        await trio.sleep_forever()

    result, ran = await _touch_while_paused(tmp_path, 0.4, nothing)
    assert result.fenced and not result.started and "not started" in result.detail
    assert not ran


def _job_user() -> RunAs:
    """The shared job user (created on first use when the tests run as root)."""
    return resolve_unprivileged_user(SHARED_JOB_USER)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_a_root_agents_command_runs_as_the_job_user_with_a_clean_environment(tmp_path: Path) -> None:
    """Run as root with a job user, a command runs as that (non-root) user in its own session
    and process group, in a folder of its own that is its HOME, with only PATH, HOME and the
    job's variables in its environment; its stdout and stderr are captured."""
    run_as = _job_user()
    script = "id -u; id -G; ps -o sid= -o pgid= -p $$; echo $$; pwd; echo out > here; env; echo err >&2"
    result = await run_job(
        CommandRuntime(argv=("sh", "-c", script)),
        job_dir=tmp_path / "5-50",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_as=run_as,
        job_env={"STOCKADE_JOB_ID": "5", "STOCKADE_ASSIGNMENT_ID": "50"},
    )
    assert result.state is JobState.SUCCEEDED, (result, _read(result.stderr_path))
    uid, groups, session, pid, cwd, *env_lines = _read(result.stdout_path).splitlines()
    assert int(uid) == run_as.uid != 0
    assert groups.split() == [str(run_as.gid)]
    assert session.split() == [pid, pid]  # session and group leader
    home = tmp_path / "5-50" / "work"
    assert cwd == str(home) and (home / "here").stat().st_uid == run_as.uid
    env = dict(line.split("=", 1) for line in env_lines)
    env.pop("PWD", None)  # sh's own
    env.pop("SHLVL", None)
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "STOCKADE_JOB_ID": "5",
        "STOCKADE_ASSIGNMENT_ID": "50",
    }
    assert _read(result.stderr_path) == "err\n"
    # The job folder (logs, the reaper's report) stays the agent's: the job cannot touch it.
    assert (tmp_path / "5-50").stat().st_uid == os.geteuid()
    assert os.stat(result.stdout_path).st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_a_job_user_job_cannot_write_its_reapers_files(tmp_path: Path) -> None:
    """A command running as the job user cannot create files in its job folder, so it cannot
    forge its reaper's report."""
    result = await run_job(
        CommandRuntime(argv=("sh", "-c", "echo exit_code=0 > ../reaper.report")),
        job_dir=tmp_path / "6-60",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_as=_job_user(),
    )
    assert result.state is JobState.FAILED and result.exit_code != 0
    assert "Permission denied" in _read(result.stderr_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_a_workdir_the_job_user_cannot_enter_fails_the_job_unstarted(tmp_path: Path) -> None:
    """A ``workdir`` that exists but is closed to the job's user (root's, mode 0700) is entered
    with that user's rights: the job never runs and fails ``workdir_denied`` naming the path,
    where a root reaper's chdir would have let it in. An open one is entered as the user."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    ran = tmp_path / "ran"
    result = await run_job(
        CommandRuntime(argv=("sh", "-c", f"pwd; touch {ran}")),
        job_dir=tmp_path / "8-80",
        stop=trio.Event(),
        stop_grace_s=1.0,
        run_as=_job_user(),
        run_options=RunOptions(workdir=str(closed)),
    )
    assert result.state is JobState.FAILED and not result.started
    assert result.detail.startswith("workdir_denied:") and str(closed) in result.detail
    assert "Permission denied" in result.detail and not ran.exists()
    with tempfile.TemporaryDirectory() as opened:  # tmp_path's parents are closed to others
        os.chmod(opened, 0o755)
        result = await run_job(
            CommandRuntime(argv=("pwd",)),
            job_dir=tmp_path / "9-90",
            stop=trio.Event(),
            stop_grace_s=1.0,
            run_as=_job_user(),
            run_options=RunOptions(workdir=opened),
        )
    assert result.state is JobState.SUCCEEDED and _read(result.stdout_path).strip() == opened


async def test_a_command_as_the_agents_own_user_gets_a_clean_environment(tmp_path: Path) -> None:
    """Without another user, a command runs as this process in its job folder, and still sees
    only PATH, HOME (its job folder) and the job's variables, not this process's environment."""
    os.environ["STOCKADE_LEAK_TEST"] = "leak"
    try:
        result = await run_job(
            CommandRuntime(argv=("sh", "-c", "id -u; env")),
            job_dir=tmp_path / "7-70",
            stop=trio.Event(),
            stop_grace_s=1.0,
            job_env={"STOCKADE_JOB_ID": "7", "STOCKADE_ASSIGNMENT_ID": "70"},
        )
    finally:
        del os.environ["STOCKADE_LEAK_TEST"]
    uid, *env_lines = _read(result.stdout_path).splitlines()
    assert int(uid) == os.geteuid()
    env = dict(line.split("=", 1) for line in env_lines)
    assert set(env) - {"PWD", "SHLVL"} == {"PATH", "HOME", "STOCKADE_JOB_ID", "STOCKADE_ASSIGNMENT_ID"}
    assert env["HOME"] == str(tmp_path / "7-70")
