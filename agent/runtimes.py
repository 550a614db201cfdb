"""Job runtimes: ``sleep`` (hold resources, do nothing) and ``command`` (a child process).

:func:`run_job` runs one job until it ends on its own or until its ``stop`` event is set,
and returns only once the job has really ended (for a command: its process has exited and
been reaped). It does not raise for a job that fails; a command that cannot be started is a
failed result whose ``detail`` names the error.

Command jobs:

- run in ``<jobs_dir>/<job_id>-<assignment_id>/`` with stdout and stderr appended to
  ``stdout.log`` and ``stderr.log`` there, stdin from ``/dev/null``;
- start in a session (and process group) of their own, so a stop can signal the whole
  group: SIGTERM, then SIGKILL after ``stop_grace_s``. When the main process has exited,
  whatever is left of its group is SIGKILLed too (the job owns nothing after it ends);
- set ``PR_SET_PDEATHSIG`` = SIGKILL (Linux ``prctl(2)``), so they die when the agent is
  SIGKILLed. That signal fires when the *thread* that forked the child ends, not the
  process, so the child is forked from the calling (trio) thread with ``subprocess.Popen``
  and not through ``trio.run_process``, which forks from a worker thread that trio's thread
  cache retires after 10 s idle, which would kill the job;
- wait for the exit through a pidfd (``os.pidfd_open``), polling ``waitid`` every 50 ms
  where pidfds are missing. The exit is observed before the child is reaped, so the
  group sweep cannot hit a recycled process id.

Wall-clock ``time.time()`` is right here: ``started_unix_s``/``finished_unix_s`` are records
for humans and the checker, not timers.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from agent.messages import CommandSpec, JobState, RuntimeSpec, SleepSpec

_PR_SET_PDEATHSIG = 1
_POLL_INTERVAL_S = 0.05
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


@attrs.frozen(kw_only=True)
class JobResult:
    """How one run of a job ended."""

    state: JobState
    stopped: bool
    """True when the stop event ended the job (it did not end on its own)."""
    exit_code: int | None
    """The process's exit status; negative ``-N`` when signal N killed it (``subprocess``
    convention); 0 for a sleep job that ran its full duration; None when there is none."""
    started_unix_s: float
    finished_unix_s: float
    stdout_path: str = ""
    stderr_path: str = ""
    detail: str = ""


def job_dir_for(jobs_dir: Path, job_id: int, assignment_id: int) -> Path:
    """The folder of one assignment's files: ``<jobs_dir>/<job_id>-<assignment_id>``."""
    return jobs_dir / f"{job_id}-{assignment_id}"


async def run_job(
    runtime: RuntimeSpec,
    *,
    job_dir: Path,
    stop: trio.Event,
    stop_grace_s: float,
) -> JobResult:
    """Run one job until it ends or ``stop`` is set; return once it has really ended.

    Args:
        runtime: what to run.
        job_dir: the job's folder (created for command jobs; must be absolute).
        stop: set it to stop the job early (SIGTERM, then SIGKILL after ``stop_grace_s``).
        stop_grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
        The result; ``stopped`` tells a stop from a natural end.

    Raises:
        trio.Cancelled: when cancelled, after SIGKILLing a command's process group and
            waiting for it to exit (shielded).
    """
    match runtime:
        case SleepSpec():
            return await _run_sleep(runtime, stop=stop)
        case CommandSpec():
            return await _run_command(runtime, job_dir=job_dir, stop=stop, stop_grace_s=stop_grace_s)


async def _run_sleep(spec: SleepSpec, *, stop: trio.Event) -> JobResult:
    started = time.time()
    with trio.move_on_after(spec.duration_ms / 1000.0):
        await stop.wait()
        return JobResult(
            state=JobState.CANCELLED,
            stopped=True,
            exit_code=None,
            started_unix_s=started,
            finished_unix_s=time.time(),
            detail="stopped before its duration ran out",
        )
    return JobResult(
        state=JobState.SUCCEEDED,
        stopped=False,
        exit_code=0,
        started_unix_s=started,
        finished_unix_s=time.time(),
    )


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` of a command job: die with the agent (PR_SET_PDEATHSIG)."""

    def setup() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:  # the agent died before prctl took effect
                os.kill(os.getpid(), signal.SIGKILL)

    return setup


def _spawn(
    argv: tuple[str, ...], *, job_dir: Path, stdout_path: Path, stderr_path: Path
) -> subprocess.Popen[bytes]:
    """Fork and exec ``argv`` from the calling thread (see the module docstring for why).

    Raises:
        OSError: the folder or the output files cannot be created, or ``argv[0]`` cannot
            be executed (not found, not executable).
        subprocess.SubprocessError: the child setup failed.
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    with stdout_path.open("ab") as out, stderr_path.open("ab") as err:
        return subprocess.Popen(
            list(argv),
            cwd=job_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            close_fds=True,
            start_new_session=True,
            preexec_fn=_child_setup(os.getpid()),  # PDEATHSIG: see module docstring
        )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    """Signal process group ``pgid``; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _has_exited(pid: int) -> bool:
    """True once ``pid`` has exited; does not reap it (``WNOWAIT``)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None and info.si_pid == pid


async def _wait_exited(pid: int) -> None:
    """Wait until child ``pid`` has exited, leaving it unreaped (a zombie pinning its id)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is None:
        while True:
            if _has_exited(pid):
                return
            await trio.sleep(_POLL_INTERVAL_S)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def _run_command(
    spec: CommandSpec, *, job_dir: Path, stop: trio.Event, stop_grace_s: float
) -> JobResult:
    stdout_path = job_dir / "stdout.log"
    stderr_path = job_dir / "stderr.log"
    paths = {"stdout_path": str(stdout_path), "stderr_path": str(stderr_path)}
    started = time.time()
    if stop.is_set():
        return JobResult(
            state=JobState.CANCELLED,
            stopped=True,
            exit_code=None,
            started_unix_s=started,
            finished_unix_s=time.time(),
            detail="stopped before it was started",
            **paths,
        )
    try:
        proc = _spawn(spec.argv, job_dir=job_dir, stdout_path=stdout_path, stderr_path=stderr_path)
    except (OSError, subprocess.SubprocessError) as exc:
        return JobResult(
            state=JobState.FAILED,
            stopped=False,
            exit_code=None,
            started_unix_s=started,
            finished_unix_s=time.time(),
            detail=f"cannot start {spec.argv[0]!r}: {exc}",
            **paths,
        )
    pid = proc.pid  # also the process group id (start_new_session)
    stopped = False

    async def stop_when_asked() -> None:
        nonlocal stopped
        await stop.wait()
        stopped = True
        _signal_group(pid, signal.SIGTERM)
        await trio.sleep(stop_grace_s)
        _signal_group(pid, signal.SIGKILL)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_asked)
            await _wait_exited(pid)
            nursery.cancel_scope.cancel()
    except BaseException:
        # Cancelled (or a bug): the job must not outlive its record. Kill and reap, shielded.
        with trio.CancelScope(shield=True):
            _signal_group(pid, signal.SIGKILL)
            await _wait_exited(pid)
            _signal_group(pid, signal.SIGKILL)
            proc.wait()
        raise
    # The main process has exited but is not reaped yet, so its id still names the group:
    # sweep what is left of the job, then reap.
    _signal_group(pid, signal.SIGKILL)
    code = proc.wait()
    finished = time.time()
    state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
    if stopped:
        state = JobState.CANCELLED
    return JobResult(
        state=state,
        stopped=stopped,
        exit_code=code,
        started_unix_s=started,
        finished_unix_s=finished,
        detail=_describe_exit(code),
        **paths,
    )
