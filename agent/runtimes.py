"""Job runtimes: ``sleep`` (hold resources, do nothing), ``command`` (a child process) and
``container`` (a Docker container, :mod:`agent.container`).

:func:`run_job` runs one job until it ends on its own or until its ``stop`` event is set,
and returns only once the job has really ended (for a command: its processes have exited
and been reaped). It does not raise for a job that fails; a command that cannot be started
is a failed result whose ``detail`` names the error.

Command jobs:

- run in ``<jobs_dir>/<job_id>-<assignment_id>/`` with stdout and stderr appended to
  ``stdout.log`` and ``stderr.log`` there, stdin from ``/dev/null``;
- run as ``run_as`` when that is another user (the agent's ``job_user`` when the agent is
  root): then in ``work/`` inside the job folder, owned by that user, while the job folder,
  its logs (opened by the agent and inherited as descriptors) and the reaper's files stay
  the agent's, so the job can neither forge its report nor point a file of the agent's
  elsewhere. The reaper drops the privileges in the job's process just before the exec
  (:meth:`agent.reaper._Reaper.start`);
- get a clean environment: ``job_env`` (the spec's ``env``; the agent's ``STOCKADE_JOB_ID``
  and ``STOCKADE_ASSIGNMENT_ID``, and a task's ``STOCKADE_ARRAY_ID`` and
  ``STOCKADE_ARRAY_INDEX``: :mod:`agent.job_env`), ``PATH`` = :data:`JOB_PATH` and ``HOME`` =
  their working directory unless the spec's ``env`` sets them, nothing else;
- run under a per-job supervisor process, the *reaper* (:mod:`agent.reaper`), which the
  agent starts as the leader of a new session; the reaper starts the job in a session and
  process group of its own. The reaper pauses the job's tree when the worker's fence deadline
  passes and kills it at the kill deadline (a deadman switch that works while the agent is
  frozen, and after it died: the reaper outlives its agent, and a restarted agent can take it
  over, :mod:`agent.adoption`); see :mod:`agent.reaper`;
- stop (the ``stop`` event) with SIGTERM to the reaper, which sends SIGTERM to the job's
  group and SIGKILL after ``stop_grace_s``; should the reaper not have finished
  :data:`REAPER_SLACK_S` later, the agent asks it to kill at once (SIGUSR1), and another
  :data:`REAPER_SLACK_S` later SIGKILLs it (its job's main process dies with it). When the
  main process has exited, the reaper SIGKILLs whatever is left of the job (the job owns
  nothing after it ends);
- are reported from the reaper's report file: the exit code (negative ``-N`` when signal N
  killed the job), the time everything was gone, and, for a job the reaper killed at the
  fence deadline, the time it stopped it (``JobResult.fenced``, ``ended_at`` = that time);
  the reaper's times are ``CLOCK_MONOTONIC`` seconds, which every process shares;
- the reaper is forked with ``subprocess.Popen`` on the process's one dedicated spawner
  thread (:class:`agent.starts.Spawner`), which keeps the fork (and the few file operations
  before it) off the trio thread; a container job's supervisor too, whose
  ``PR_SET_PDEATHSIG`` fires when the *thread* that forked it ends, not the process, so it is
  never forked through ``trio.run_process`` or ``trio.to_thread``, whose worker threads trio's
  thread cache retires after 10 s idle. Without a spawner (``spawner=None``: tools and tests)
  the calling thread forks, blocking its loop for the fork;
- the reaper runs the job at ``job_nice`` lower priority, with the ``oom_score_adj`` the
  agent passes (the worker's ``job_oom_score_adj``, 1000: the OOM killer's first choice), and
  says, through a pipe, when the job has exec'd (or could not be); ``on_started`` is called then (see
  :mod:`agent.starts` for the start slots this frees);
- are held to their ``cpu_millis`` and ``memory_mb`` when the agent passes its ``resources``
  (:mod:`agent.resources`): the job's cgroup is made before its reaper is forked (a failure
  ends the job unstarted, ``resources_error: ...``), the job's process joins it before its
  exec, and once the reaper has exited the cgroup's OOM kills are read (a job they hit ends
  failed, ``oom_killed: ...``, unless it was stopped) and it is removed;
- the agent waits for the reaper's exit as for any job supervisor (:mod:`agent.supervised`:
  a pidfd, the exit observed before the reaper is reaped).

Container jobs run the same way under a supervisor process of their own
(:mod:`agent.container_supervisor`) that speaks the reaper's protocol (start pipe, fence-deadline
file, signals, report file) and does Docker calls where the reaper sends signals; the agent
side is :func:`agent.container.run_container`, which shares
:func:`agent.supervised.popen_supervisor` and :func:`agent.supervised.wait_supervisor` with
command jobs.

Sleep jobs have no process: the agent decides when they stopped (see :mod:`agent.core`). One
ends once it has *run* its full duration, the worker's pauses not counted (:class:`PauseView`),
also when the agent notices later (it was frozen); stopped while paused, it ended when the
pause began.

A run's times are trio's clock (``began_at``, ``ended_at``), never the wall clock: the control
plane dates the run by the database's clock from what they measure (its length, and how long
before a report it ended), and the job log by the database's clock as the agent knows it
(:mod:`agent.dbclock`).

Why one module of about 590 lines: :func:`run_job` and its :class:`JobResult` serve every
runtime, and the command runtime's start and report reading are one protocol with
:mod:`agent.reaper`, read best in one place (the supervisor plumbing it shares with container
jobs is :mod:`agent.supervised`).
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import attrs
import trio

from agent import reaper
from agent.fence import MAX_PAUSES, trio_time_of
from agent.messages import JobState
from agent.resources import ConfinedJob, Confinement, JobLimits, JobResources, oom_detail, release
from agent.starts import Spawner
from agent.supervised import popen_supervisor, wait_supervisor
from runtime.jobs import CommandRuntime, ContainerRuntime, JobRuntime, SleepRuntime
from runtime.os_users import RunAs, chown, ensure_traversable

_T = TypeVar("_T")
JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The ``PATH`` of every command job (and of its reaper, which searches it for the program)."""
WORK_SUBDIR = "work"
"""The working directory and ``HOME`` of a job that runs as another user: this folder inside
its job folder, owned by that user (the job folder itself, with the reaper's files and the
output logs, stays the agent's)."""


@attrs.frozen(kw_only=True)
class JobResult:
    """How one run of a job ended."""

    state: JobState
    stopped: bool
    """True when the job did not end on its own: the stop event ended it, or its reaper killed
    it at the fence deadline (then ``fenced`` is true too)."""
    exit_code: int | None
    """The process's exit status; negative ``-N`` when signal N killed it (``subprocess``
    convention); 0 for a sleep job that ran its full duration; None when there is none."""
    began_at: float
    """Trio time its run began (a command: just before its reaper was forked)."""
    ended_at: float
    """Trio time the job had really ended (for a job its reaper fenced: when it stopped it)."""
    stdout_path: str = ""
    stderr_path: str = ""
    detail: str = ""
    fenced: bool = False
    """True when its reaper SIGKILLed the job because the worker's fence deadline had passed."""
    started: bool = True
    """False when the job never ran: a command that was not exec'd (stopped before its
    reaper was started, the reaper or the exec failed, the fence deadline had passed)."""


@attrs.frozen(kw_only=True)
class RunOptions:
    """What a job's spec asks of its run beyond the runtime (``runtime.jobs.JobSpec``)."""

    timeout_s: float | None = None
    """Stop the job once it has run this long (from its start, by the monotonic clock) and end it failed
    with detail ``timeout: ...``; None: no limit. A command's reaper enforces it (also while
    the agent is frozen); a sleep's and a container's the agent."""
    workdir: str = ""
    """A command's working directory, an absolute path that must exist on the worker (else
    the job fails, ``workdir_not_found: ...``); empty: the job's folder (or its ``work/``
    when it runs as another user). A container job's is :attr:`ContainerJob.workdir`."""

    @property
    def default(self) -> bool:
        """True when it asks for nothing."""
        return self.timeout_s is None and not self.workdir


def timeout_detail(timeout_s: float) -> str:
    """The detail of a job stopped at its timeout; its prefix ``timeout`` is the reason the
    control plane records (schema.sql, record_outcomes)."""
    return f"timeout: ran past its timeout_s of {timeout_s:g} s and was stopped"


@attrs.frozen(kw_only=True)
class OutputPaths:
    stdout_path: str
    stderr_path: str


def never_ran(
    paths: OutputPaths, *, stopped: bool, began_at: float, ended_at: float, detail: str
) -> JobResult:
    """The result of a command job that never ran: stopped before its reaper was started
    (``stopped``: cancelled), or its reaper or its exec failed (failed)."""
    return JobResult(
        state=JobState.CANCELLED if stopped else JobState.FAILED,
        stopped=stopped,
        exit_code=None,
        began_at=began_at,
        ended_at=ended_at,
        detail=detail,
        stdout_path=paths.stdout_path,
        stderr_path=paths.stderr_path,
        started=False,
    )


def owner_of(work_dir: str) -> str:
    """12 hex digits of the sha256 of the absolute work folder: one worker of one cluster (a
    container job's owner, :class:`ContainerJob`)."""
    return hashlib.sha256(os.path.abspath(work_dir).encode()).hexdigest()[:12]


@attrs.frozen(kw_only=True)
class ContainerJob:
    """What a container job needs besides its runtime: whose it is (the container's name and
    labels) and its limits (the container's hard limits)."""

    worker_id: str
    job_id: int
    assignment_id: int
    cpu_millis: int
    """CPU, in millicores: the container's ``nano_cpus`` (times 1,000,000)."""
    memory_mb: int
    """Memory, in MiB: the container's memory limit, swap included (none)."""
    user: str = ""
    """``uid:gid`` the container's processes run as (the agent's job user); empty: the image's."""
    owner: str = ""
    """The agent's :func:`agent.container.owner_of` (its work folder's): in the container's name
    and labels, so the agents of two clusters on one engine never take each other's."""
    workdir: str = ""
    """The job's ``workdir``: the working directory inside the container (Docker creates it
    when the image lacks it); empty: the image's own."""
    oom_score_adj: int | None = None
    """The container's ``oom_score_adj`` (Docker's ``--oom-score-adj``; :mod:`runtime.oom`);
    None: the engine's default (0)."""


def job_dir_for(jobs_dir: Path, job_id: int, assignment_id: int) -> Path:
    """The folder of one assignment's files: ``<jobs_dir>/<job_id>-<assignment_id>``."""
    return jobs_dir / f"{job_id}-{assignment_id}"


def _nothing() -> None:
    pass


def cannot_run(runtime: JobRuntime) -> str | None:
    """Why ``runtime`` could not be run at all (a command with no program), or None."""
    match runtime:
        case CommandRuntime(argv=()):
            return "command argv must not be empty"
        case ContainerRuntime(image=""):
            return "container image must not be empty"
        case SleepRuntime() | CommandRuntime() | ContainerRuntime():
            return None


def forks(runtime: JobRuntime) -> bool:
    """Whether starting ``runtime`` forks processes (a command's reaper, a container's
    supervisor), so it takes one of the paced start slots (:mod:`agent.starts`)."""
    return isinstance(runtime, CommandRuntime | ContainerRuntime)


def timed_by_agent_s(runtime: JobRuntime) -> float | None:
    """How long a job the agent itself times runs, in seconds (a sleep: it has no process, so
    the agent decides when it stopped; see :mod:`agent.core`); None for a runtime whose end
    its process reports."""
    return runtime.duration_ms / 1000.0 if isinstance(runtime, SleepRuntime) else None


async def run_job(
    runtime: JobRuntime,
    *,
    job_dir: Path,
    stop: trio.Event,
    stop_grace_s: float,
    fence_deadline_path: Path | None = None,
    job_nice: int = 0,
    spawner: Spawner | None = None,
    on_started: Callable[[], None] = _nothing,
    run_as: RunAs | None = None,
    job_env: Mapping[str, str] | None = None,
    pause: PauseView | None = None,
    container: ContainerJob | None = None,
    run_options: RunOptions | None = None,
    resources: JobResources | None = None,
    limits: JobLimits | None = None,
    on_spawned: Callable[[int], None] | None = None,
    oom_score_adj: int | None = None,
) -> JobResult:
    """Run one job until it ends or ``stop`` is set; return once it has really ended.

    Args:
        runtime: what to run.
        job_dir: the job's folder (created for command jobs; must be absolute).
        stop: set it to stop the job early (SIGTERM, then SIGKILL after ``stop_grace_s``).
        stop_grace_s: seconds between SIGTERM and SIGKILL.
        fence_deadline_path: the worker's fence-deadline file (see :mod:`agent.reaper`); a
            command's reaper kills it once that deadline has passed. None: no deadman.
        job_nice: added to a command's nice value (lower CPU priority), 0..19.
        spawner: the thread that forks a command's reaper; None: the calling thread.
        on_started: called once, when the start is over: a command has exec'd or could not
            be started (a sleep job: at once); at the latest just before this returns.
        run_as: the user a command runs as; None, or this process's own user: as this process,
            in ``job_dir``. Another user: in ``job_dir/work`` (its ``HOME``, owned by it).
        job_env: variables a command gets besides ``PATH`` (:data:`JOB_PATH`) and ``HOME``
            (its working directory); nothing else of this process's environment is passed on.
        pause: the worker's pauses, which a sleep job's duration does not count (a command
            is paused by its reaper); None: never paused.
        container: a container job's names and limits (required for one; a container job
            without it fails at once).
        run_options: the spec's timeout and working directory (:class:`RunOptions`); None:
            neither.
        resources: how the worker enforces a command's limits (:mod:`agent.resources`);
            None, or no ``limits``: not at all (tools and tests).
        limits: the command's ``cpu_millis`` and ``memory_mb``.
        on_spawned: called with a command's reaper's pid once it is forked (the agent records
            it, so that a restarted agent can take the job over: :mod:`agent.adoption`).
        oom_score_adj: a command's ``oom_score_adj``, set in its process before the exec
            (:mod:`runtime.oom`); None: it inherits this process's. (A container job's is in
            ``container``.)

    Returns:
        The result; ``stopped`` tells a stop from a natural end, ``started`` whether a
        command ran at all.

    Raises:
        trio.Cancelled: when cancelled, after having a command's reaper SIGKILL the job and
            waiting for the reaper to exit (shielded).
    """
    options = run_options or RunOptions()
    match runtime:
        case SleepRuntime():
            on_started()
            return await _timed(
                lambda inner: _run_sleep(runtime, stop=inner, pause=pause), stop, options.timeout_s
            )
        case CommandRuntime():
            return await _run_command(
                runtime,
                job_dir=job_dir,
                stop=stop,
                stop_grace_s=stop_grace_s,
                fence_deadline_path=fence_deadline_path,
                job_nice=job_nice,
                spawner=spawner,
                on_started=on_started,
                run_as=run_as,
                job_env=job_env or {},
                options=options,
                resources=None if limits is None else resources,
                limits=limits,
                on_spawned=on_spawned,
                oom_score_adj=oom_score_adj,
            )
        case ContainerRuntime():
            # Imported here: it loads the Docker SDK only where a container job runs.
            from agent.container import run_container

            return await _timed(
                lambda inner: run_container(
                    runtime,
                    job=container,
                    job_dir=job_dir,
                    stop=inner,
                    stop_grace_s=stop_grace_s,
                    fence_deadline_path=fence_deadline_path,
                    spawner=spawner,
                    on_started=on_started,
                    job_env=job_env or {},
                ),
                stop,
                options.timeout_s,
            )


async def _timed(
    run: Callable[[trio.Event], Awaitable[JobResult]], stop: trio.Event, timeout_s: float | None
) -> JobResult:
    """``run(inner_stop)``, where ``inner_stop`` is set by ``stop`` or once ``timeout_s`` has
    passed (the agent's clock); a run the timeout stopped ends failed, with
    :func:`timeout_detail`, not stopped (it is the job's own end, reported as an outcome)."""
    if timeout_s is None:
        return await run(stop)
    inner = trio.Event()
    timed_out = False

    async def watch() -> None:
        nonlocal timed_out
        with trio.move_on_after(timeout_s):
            await stop.wait()
            inner.set()
            return
        timed_out = not stop.is_set()
        inner.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        result = await run(inner)
        nursery.cancel_scope.cancel()
    if timed_out and result.stopped and not result.fenced:
        return attrs.evolve(result, state=JobState.FAILED, stopped=False, detail=timeout_detail(timeout_s))
    return result


class JobRunner(Protocol):
    """What runs the agent's jobs: :func:`run_job` bound to the process's spawner
    (:func:`job_runner`), or a scripted stand-in in unit tests."""

    async def __call__(
        self,
        runtime: JobRuntime,
        *,
        job_dir: Path,
        stop: trio.Event,
        stop_grace_s: float,
        fence_deadline_path: Path | None,
        job_nice: int,
        on_started: Callable[[], None],
        run_as: RunAs | None,
        job_env: Mapping[str, str],
        pause: PauseView | None = None,
        container: ContainerJob | None = None,
        run_options: RunOptions | None = None,
        resources: JobResources | None = None,
        limits: JobLimits | None = None,
        on_spawned: Callable[[int], None] | None = None,
        oom_score_adj: int | None = None,
    ) -> JobResult: ...


def job_runner(spawner: Spawner | None) -> JobRunner:
    """:func:`run_job` with command reapers forked on ``spawner`` (None: the calling thread)."""
    return partial(run_job, spawner=spawner)


class PauseView(Protocol):
    """What a sleep job needs to know of its worker's pauses (:class:`agent.fence.FenceClock`):
    paused time does not count against its duration."""

    @property
    def changed(self) -> trio.Event:
        """Set when the jobs pause, resume or are fenced (a fresh one is armed after)."""

    def paused_since(self) -> float | None:
        """trio time the jobs count as paused from, while they are; None while they run."""

    def paused_s_between(self, start: float, end: float) -> float:
        """Seconds of pause between trio times ``start`` and ``end``."""


async def either(first: trio.Event, second: trio.Event) -> None:
    """Return once ``first`` or ``second`` is set."""
    async with trio.open_nursery() as nursery:

        async def wait(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, first)
        nursery.start_soon(wait, second)


def sleep_end(began: float, duration_s: float, pause: PauseView, now: float) -> float:
    """The trio time a sleep job begun at ``began`` has run ``duration_s`` seconds by, as known
    at ``now``: its pauses do not count. Not run that long yet: ``now`` plus what is left, or
    ``inf`` while it is paused (it ends only after it resumes). Run that long: the time it was
    reached, found by adding the pauses that fell before it until none is left to add.
    """
    ran_s = (now - began) - pause.paused_s_between(began, now)
    if ran_s < duration_s:
        return math.inf if pause.paused_since() is not None else now + (duration_s - ran_s)
    end = began + duration_s
    for _ in range(2 * MAX_PAUSES):
        later = began + duration_s + pause.paused_s_between(began, end)
        if later <= end:
            break
        end = later
    return min(end, now)


async def _run_sleep(spec: SleepRuntime, *, stop: trio.Event, pause: PauseView | None = None) -> JobResult:
    """Hold the job's resources for its duration, its pauses not counted: it ends at the first
    time it has *run* that long (also when the agent notices later: it was frozen), or when
    ``stop`` is set; stopped while paused, it ended when the pause began (it did no work
    after)."""
    began = trio.current_time()
    duration_s = spec.duration_ms / 1000.0
    end = began + duration_s
    while True:
        now = trio.current_time()
        if pause is not None:
            end = sleep_end(began, duration_s, pause, now)
        if end <= now:
            return JobResult(
                state=JobState.SUCCEEDED,
                stopped=False,
                exit_code=0,
                began_at=began,
                ended_at=end,  # when it ran out, even if noticed later
            )
        held_from = None if pause is None else pause.paused_since()
        if stop.is_set():
            return JobResult(
                state=JobState.CANCELLED,
                stopped=True,
                exit_code=None,
                began_at=began,
                ended_at=now if held_from is None else max(began, held_from),
                detail="stopped before its duration ran out",
            )
        if pause is not None and held_from is not None:
            await either(stop, pause.changed)  # resumed, fenced, or stopped
            continue
        # A pause that begins meanwhile only makes it end later: the next turn finds it out.
        with trio.move_on_at(end):
            await stop.wait()


def _spawn_reaper(
    argv: tuple[str, ...],
    *,
    job_dir: Path,
    stdout_path: Path,
    stderr_path: Path,
    stop_grace_s: float,
    fence_deadline_path: Path | None,
    job_nice: int,
    run_as: RunAs | None,
    job_env: Mapping[str, str],
    options: RunOptions,
    confinement: Confinement,
    oom_score_adj: int | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the job's reaper from the calling thread (see the module docstring for which).

    Returns:
        The reaper, and the read end of its start pipe (non-blocking; the caller closes it):
        :data:`agent.reaper.STARTED_BYTE` once the job has exec'd, EOF without it when the
        reaper ended without starting it.

    Raises:
        OSError: the folder or the output files cannot be created, or the interpreter cannot
            be executed.
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    reaper.clear_files(job_dir)
    switch = run_as is not None and run_as.is_other_user
    home = job_dir
    if switch:
        assert run_as is not None
        home = job_dir / WORK_SUBDIR
        home.mkdir(mode=0o700, exist_ok=True)
        chown(home, run_as)
        ensure_traversable(job_dir)  # the job may reach its HOME by path, not only as its cwd
    # The job's own PATH or HOME (its spec's env) wins over the defaults.
    env = {"PATH": JOB_PATH, "HOME": str(home), **job_env}
    command = partial(
        reaper.reaper_argv,
        sys.executable,
        parent_pid=os.getpid(),
        stop_grace_s=stop_grace_s,
        fence_deadline_path=None if fence_deadline_path is None else str(fence_deadline_path),
        argv=argv,
        job_nice=job_nice,
        run_as_uid=run_as.uid if switch and run_as else None,
        run_as_gid=run_as.gid if switch and run_as else None,
        job_cwd=options.workdir or (WORK_SUBDIR if switch else ""),
        timeout_s=options.timeout_s,
        cgroup_procs=confinement.cgroup_procs,
        address_space_bytes=confinement.address_space_bytes,
        clone_into=confinement.clone_into,
        oom_score_adj=oom_score_adj,
    )
    return popen_supervisor(
        lambda started_fd: command(started_fd=started_fd),
        job_dir=job_dir,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        env=env,
    )


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def _run_command(
    spec: CommandRuntime,
    *,
    job_dir: Path,
    stop: trio.Event,
    stop_grace_s: float,
    fence_deadline_path: Path | None,
    job_nice: int,
    spawner: Spawner | None,
    on_started: Callable[[], None],
    run_as: RunAs | None,
    job_env: Mapping[str, str],
    options: RunOptions,
    resources: JobResources | None,
    limits: JobLimits | None,
    on_spawned: Callable[[int], None] | None = None,
    oom_score_adj: int | None = None,
) -> JobResult:
    stdout_path = job_dir / "stdout.log"
    stderr_path = job_dir / "stderr.log"
    paths = OutputPaths(stdout_path=str(stdout_path), stderr_path=str(stderr_path))
    began = trio.current_time()
    if stop.is_set():
        on_started()
        return never_ran(
            paths, stopped=True, began_at=began, ended_at=began, detail="stopped before it was started"
        )
    spawn_reaper = partial(
        _spawn_reaper,
        spec.argv,
        job_dir=job_dir,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        stop_grace_s=stop_grace_s,
        fence_deadline_path=fence_deadline_path,
        job_nice=job_nice,
        run_as=run_as,
        job_env=job_env,
        options=options,
        oom_score_adj=oom_score_adj,
    )

    def spawn() -> tuple[subprocess.Popen[bytes], int, ConfinedJob | None]:
        confined = None
        if resources is not None and limits is not None:
            try:
                confined = resources.confine(job_dir.name, limits)
            except OSError as exc:
                raise _CannotConfine(f"resources_error: cannot make the job's cgroup: {exc}") from exc
        try:
            proc, started_fd = spawn_reaper(
                confinement=Confinement() if confined is None else confined.confinement
            )
        except BaseException:
            if confined is not None:
                confined.remove()
            raise
        return proc, started_fd, confined

    try:
        # Shielded inside Spawner.run: the reaper it forks always comes back here, and no
        # checkpoint follows before the try below that kills it when cancelled.
        proc, started_fd, confined = spawn() if spawner is None else await spawner.run(spawn)
    except _CannotConfine as exc:
        on_started()
        return never_ran(paths, stopped=False, began_at=began, ended_at=trio.current_time(), detail=str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        on_started()
        return never_ran(
            paths,
            stopped=False,
            began_at=began,
            ended_at=trio.current_time(),
            detail=f"cannot start the reaper of {spec.argv[0]!r}: {exc}",
        )
    if on_spawned is not None:
        on_spawned(proc.pid)  # no checkpoint since the fork came back: wait_supervisor owns it next
    try:
        stopped, exec_reported, reaper_code = await wait_supervisor(
            proc, started_fd, stop=stop, stop_grace_s=stop_grace_s, on_started=on_started
        )
    finally:
        # Also when cancelled: the cgroup goes with the job (its leftovers are killed first).
        oom_kills = 0 if confined is None else (await release(confined)).oom_kills
    result = command_result(
        reaper.read_report(job_dir),
        reaper_code,
        stopped=stopped,
        exec_reported=exec_reported,
        began_at=began,
        paths=paths,
    )
    return oom_killed(result, oom_kills, limits)


class _CannotConfine(Exception):
    """The job's cgroup could not be made; the message is the job's detail."""


def oom_killed(result: JobResult, oom_kills: int, limits: JobLimits | None) -> JobResult:
    """``result`` as failed with :func:`agent.resources.oom_detail` when the kernel's OOM killer
    hit the job in its cgroup (``oom_kills`` > 0) and the job ended on its own (a stop, a
    fence or its timeout keeps its own end), whatever its exit code, as for a container."""
    if (
        not oom_kills
        or limits is None
        or result.stopped
        or result.fenced
        or not result.started
        or result.detail.startswith("timeout:")
    ):
        return result
    return attrs.evolve(result, state=JobState.FAILED, detail=oom_detail(limits.memory_mb, result.detail))


def _parse(report: dict[str, str], key: str, kind: Callable[[str], _T]) -> _T | None:
    try:
        return kind(report[key])
    except (KeyError, ValueError):
        return None


def report_time(report: dict[str, str], key: str) -> float | None:
    """A time of a supervisor's report (``ended_monotonic_s``, ``fenced_monotonic_s``:
    ``CLOCK_MONOTONIC`` seconds, shared by every process of the machine) in trio's clock; None
    when the report has none (or only the wall-clock time a supervisor of an older agent wrote,
    which is not read)."""
    value = _parse(report, key, float)
    return None if value is None or not math.isfinite(value) else trio_time_of(value)


def command_result(
    report: dict[str, str],
    reaper_code: int,
    *,
    stopped: bool,
    exec_reported: bool,
    began_at: float,
    paths: OutputPaths,
) -> JobResult:
    """The result of a command job from its reaper's report (see :func:`agent.reaper.read_report`)
    and its start pipe (``exec_reported``: the reaper said the job exec'd), begun at trio time
    ``began_at``. ``stopped`` is whether the agent asked for a stop; the report's own
    ``stopped`` (whether the stop reached the job before it ended) decides when there is one.
    A time the report lacks is now. Called in trio (its times are trio's clock)."""
    now = trio.current_time()
    if "error" in report:
        return never_ran(
            paths,
            stopped=False,
            began_at=began_at,
            ended_at=max(began_at, report_time(report, "ended_monotonic_s") or now),
            detail=report["error"],
        )
    code = _parse(report, "exit_code", int)
    ran = exec_reported or code is not None
    fenced_at = report_time(report, "fenced_monotonic_s")
    finished = max(began_at, report_time(report, "ended_monotonic_s") or now)
    if not report:
        code = reaper_code
        detail = f"its reaper ended without a report ({_describe_exit(reaper_code)})"
    elif code is None and fenced_at is None:
        detail = "stopped before it was started (its start was held at the fence deadline)"
    elif code is None:
        detail = "not started: the fence deadline had passed"
    else:
        detail = _describe_exit(code)
    if fenced_at is not None:
        return JobResult(
            state=JobState.CANCELLED,
            stopped=True,
            fenced=True,
            exit_code=code,
            began_at=began_at,
            ended_at=max(began_at, fenced_at),
            detail=f"killed by its reaper at the fence deadline: {detail}",
            stdout_path=paths.stdout_path,
            stderr_path=paths.stderr_path,
            started=ran,
        )
    if "stopped" in report:
        # The reaper knows whether the stop reached the job before it ended: a job that ended
        # on its own keeps its own end (and its outcome), even if the agent asked for a stop
        # meanwhile (it thawed past its fence deadline, a cancel crossed the end).
        stopped = report["stopped"] == "1"
    state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
    timed_out_after_s = _parse(report, "timed_out_after_s", float)
    if timed_out_after_s is not None:
        # Its reaper stopped it at its timeout: the job's own end, a failure.
        stopped, state, detail = False, JobState.FAILED, f"{timeout_detail(timed_out_after_s)} ({detail})"
    if stopped:
        state = JobState.CANCELLED
    return JobResult(
        state=state,
        stopped=stopped,
        exit_code=code,
        began_at=began_at,
        ended_at=finished,
        detail=detail,
        stdout_path=paths.stdout_path,
        stderr_path=paths.stderr_path,
        started=ran,
    )
