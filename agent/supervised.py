"""A job's supervisor process, from the agent's side: started, told to stop, waited for.

Command jobs' reapers and container jobs' supervisors alike: :func:`popen_supervisor` starts one
with the write end of its start pipe, and :func:`wait_supervisor` waits for its exit (through a
pidfd, else polling ``waitid``) while passing a stop on. The exit is observed before the
supervisor is reaped, so the sweep of its group cannot hit a recycled process id.
:class:`SupervisedRun` holds what both kinds of job are given and runs those steps for them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, TypeVar

import attrs
import trio

from agent import deadman
from agent.job_results import JobResult, OutputPaths, never_ran
from agent.sleep_jobs import either
from agent.starts import Spawner
from runtime.settings.agent import JOB_PROCESSES

_T = TypeVar("_T")

_POLL_INTERVAL_S = JOB_PROCESSES.exit_poll_s
REAPER_SLACK_S = JOB_PROCESSES.reaper_slack_s
"""How long past its due time the agent waits for a supervisor before it steps in, in seconds."""


@attrs.define(eq=False)
class StopNotice:
    """A stop with a grace of its own (a preemption's), for a job whose supervisor honours it:
    the job gets SIGTERM at once and is killed ``grace_s`` after, unless the ordinary stop (the
    job's ``stop`` event) comes meanwhile and kills it after ``stop_grace_s`` from then, if that
    is earlier. Given at most once (:meth:`give`)."""

    given: trio.Event = attrs.field(factory=trio.Event)
    """Set once the stop was asked for."""
    grace_s: float = 0.0
    """The grace asked for, in seconds (> 0 once ``given`` is set)."""

    def give(self, grace_s: float) -> None:
        """Ask for the stop with ``grace_s`` seconds of grace (> 0); a second call does nothing.

        Raises:
            ValueError: ``grace_s`` is not a finite number above 0.
        """
        if not 0.0 < grace_s < float("inf"):
            raise ValueError(f"grace_s must be a finite number above 0, got {grace_s!r}")
        if not self.given.is_set():
            self.grace_s = grace_s
            self.given.set()


def _tell_grace(job_dir: Path | None, grace_s: float) -> bool:
    """Write ``grace_s`` for the supervisor in ``job_dir``; False when there is no folder or
    the file cannot be written."""
    if job_dir is None:
        return False
    try:
        deadman.write_stop_grace(job_dir, grace_s)
    except OSError:
        return False
    return True


async def pass_stop_on(
    send: Callable[[int], None],
    *,
    stop: trio.Event,
    stop_grace_s: float,
    notice: StopNotice | None = None,
    job_dir: Path | None = None,
) -> None:
    """Wait for ``stop`` (or ``notice``) and pass it on to a job's supervisor with ``send``:
    SIGTERM (the supervisor's SIGTERM to the job and SIGKILL after ``stop_grace_s``); SIGUSR1
    when it is not done :data:`REAPER_SLACK_S` after the grace; SIGKILL another
    :data:`REAPER_SLACK_S` later. A ``notice`` first: its grace written into ``job_dir``
    (:func:`agent.deadman.write_stop_grace`), then :data:`agent.deadman.NOTICE_SIGNAL`; a
    ``stop`` during its grace hurries it (SIGTERM: killed ``stop_grace_s`` from then at the
    latest). Returns once the supervisor was SIGKILLed; cancel it when it exits."""
    if notice is None:
        await stop.wait()
    else:
        await either(stop, notice.given)
    if notice is not None and not stop.is_set():
        # Not written: the supervisor stops the job with its own grace, and so it is timed.
        grace_s = notice.grace_s if _tell_grace(job_dir, notice.grace_s) else stop_grace_s
        due_s = trio.current_time() + grace_s + REAPER_SLACK_S
        send(deadman.NOTICE_SIGNAL)
        with trio.move_on_at(due_s):
            await stop.wait()
    if stop.is_set():
        send(signal.SIGTERM)
        await trio.sleep(stop_grace_s + REAPER_SLACK_S)
    send(signal.SIGUSR1)  # not done yet: kill the job now
    await trio.sleep(REAPER_SLACK_S)
    # A supervisor that does not answer: SIGKILL it; its job's main process dies with it.
    send(signal.SIGKILL)


def popen_supervisor(
    command: Callable[[int], list[str]],
    *,
    job_dir: Path,
    stdout_path: Path,
    stderr_path: Path,
    env: Mapping[str, str],
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a job's supervisor process from the calling thread: ``command(started_fd)`` in
    ``job_dir``, the leader of a new session, its stdout and stderr appended to the job's files,
    with ``env`` only, holding the write end of the start pipe as ``started_fd``. Returns the
    process and the read end of its start pipe (non-blocking; the caller closes it).

    Raises:
        OSError: the output files cannot be opened, or the interpreter cannot be executed.
    """
    started_r, started_w = os.pipe()  # close-on-exec: only the supervisor gets started_w (pass_fds)
    try:
        argv = command(started_w)
        with _private_append(stdout_path) as out, _private_append(stderr_path) as err:
            proc = subprocess.Popen(
                argv,
                cwd=job_dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                close_fds=True,
                pass_fds=(started_w,),
                start_new_session=True,
            )
    except BaseException:
        os.close(started_r)
        raise
    finally:
        os.close(started_w)
    os.set_blocking(started_r, False)
    return proc, started_r


def _private_append(path: Path) -> BinaryIO:
    """``path`` opened to append, mode 0600 (created so, or made so): a job's output is read
    only by the agent, never by another job (docs/tenancy.md, "Identities")."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def _read_started(fd: int) -> bytes:
    """What the start pipe holds now: the start byte, b"" at EOF or when nothing came yet."""
    try:
        return os.read(fd, 1)
    except BlockingIOError:
        return b""


def _signal_group(pgid: int, sig: int) -> None:
    """Signal process group ``pgid``; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_process(pid: int, sig: int) -> None:
    """Signal process ``pid`` (an unreaped child of ours, so the id cannot be reused)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


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


async def wait_supervisor(
    proc: subprocess.Popen[bytes],
    started_fd: int,
    *,
    stop: trio.Event,
    stop_grace_s: float,
    on_started: Callable[[], None],
    notice: StopNotice | None = None,
    job_dir: Path | None = None,
) -> tuple[bool, bool, int]:
    """Wait until a job's supervisor has exited, passing on a stop or a ``notice`` (a stop with
    its own grace, written into ``job_dir``: :func:`pass_stop_on`; SIGKILL goes to the
    supervisor's group) and calling ``on_started`` once its start pipe ``started_fd`` said the
    start is over (it closes it); then reap it.

    Returns whether a stop (or the notice) was asked for, whether the start pipe said the job
    started, and the supervisor's exit status.

    Raises:
        trio.Cancelled: after having the supervisor kill the job (shielded).
    """
    pid = proc.pid  # the supervisor; also its process group id (start_new_session)
    stopped = False
    start_signal: bytes | None = None
    """What the start pipe said (None: not read yet)."""

    def start_is_over(said: bytes) -> None:
        nonlocal start_signal
        if start_signal is None:
            start_signal = said
            os.close(started_fd)
            on_started()

    async def watch_start() -> None:
        await trio.lowlevel.wait_readable(started_fd)
        start_is_over(_read_started(started_fd))

    def send(sig: int) -> None:
        nonlocal stopped
        stopped = True
        if sig == signal.SIGKILL:
            _signal_group(pid, sig)
        else:
            _signal_process(pid, sig)

    async def stop_when_asked() -> None:
        await pass_stop_on(send, stop=stop, stop_grace_s=stop_grace_s, notice=notice, job_dir=job_dir)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_asked)
            nursery.start_soon(watch_start)
            await _wait_exited(pid)
            nursery.cancel_scope.cancel()
    except BaseException:
        # Cancelled (or a bug): the job must not outlive its record. Kill and reap, shielded.
        with trio.CancelScope(shield=True):
            _signal_process(pid, signal.SIGUSR1)
            with trio.move_on_after(REAPER_SLACK_S):
                await _wait_exited(pid)
            _signal_group(pid, signal.SIGKILL)
            proc.wait()
        raise
    finally:
        if start_signal is None:
            # The reaper has exited (or been killed): the pipe holds whatever it said, and EOF.
            start_is_over(_read_started(started_fd))
    # The reaper has exited but is not reaped yet, so its id still names its group: sweep
    # anything that joined that group, then reap.
    _signal_group(pid, signal.SIGKILL)
    return stopped, start_signal == deadman.STARTED_BYTE, proc.wait()


@attrs.frozen(kw_only=True)
class SupervisedRun:
    """What a job run under a supervisor process (a command's reaper, a container's supervisor)
    is given by :func:`agent.runtimes.run_job` (see its Args for each field): where it runs,
    how its supervisor is started, how it is stopped."""

    job_dir: Path
    job_env: Mapping[str, str]
    spawner: Spawner | None
    on_started: Callable[[], None]
    fence_deadline_path: Path | None
    stop: trio.Event
    stop_grace_s: float
    notice: StopNotice | None = None

    @property
    def paths(self) -> OutputPaths:
        """The job's output files, in :attr:`job_dir`."""
        return OutputPaths.in_folder(self.job_dir)

    def stop_asked(self) -> bool:
        """Whether ``stop`` or the ``notice`` was given already."""
        return self.stop.is_set() or (self.notice is not None and self.notice.given.is_set())

    def not_started(self, began_at: float, detail: str, *, stopped: bool = False) -> JobResult:
        """Call ``on_started`` and return :func:`agent.job_results.never_ran` (ended now; at
        ``began_at`` when ``stopped`` before its start): the job's supervisor never ran it."""
        self.on_started()
        ended_at = began_at if stopped else None
        return never_ran(self.paths, stopped=stopped, began_at=began_at, ended_at=ended_at, detail=detail)

    async def spawn(self, fork: Callable[[], _T]) -> _T:
        """``fork()`` on :attr:`spawner`'s thread (shielded there), or on the calling thread."""
        return fork() if self.spawner is None else await self.spawner.run(fork)

    def popen(
        self, command: Callable[[int], list[str]], *, env: Mapping[str, str]
    ) -> tuple[subprocess.Popen[bytes], int]:
        """:func:`popen_supervisor` in :attr:`job_dir`, its output appended to the job's files."""
        paths = self.paths
        return popen_supervisor(
            command,
            job_dir=self.job_dir,
            stdout_path=Path(paths.stdout_path),
            stderr_path=Path(paths.stderr_path),
            env=env,
        )

    async def wait(self, proc: subprocess.Popen[bytes], started_fd: int) -> tuple[bool, bool, int]:
        """:func:`wait_supervisor` for ``proc`` with this run's stops and ``on_started``."""
        return await wait_supervisor(
            proc,
            started_fd,
            stop=self.stop,
            stop_grace_s=self.stop_grace_s,
            on_started=self.on_started,
            notice=self.notice,
            job_dir=self.job_dir,
        )
