"""Job runtimes: ``sleep`` (:mod:`agent.sleep_jobs`), ``command`` (a child process under its
reaper, :mod:`agent.reaper`) and ``container`` (a Docker container, :mod:`agent.container`).

:func:`run_job` runs one job until it has really ended; it does not raise for a job that fails.
How a command job runs: docs/design.md, "Command jobs on the agent's side".
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from agent import deadman, reaper
from agent.job_results import JobResult, command_result, oom_killed, timeout_detail
from agent.messages import JobState
from agent.resources import ConfinedJob, Confinement, JobLimits, JobResources, release
from agent.sleep_jobs import PauseView, run_sleep
from agent.starts import Spawner
from agent.supervised import StopNotice, SupervisedRun
from runtime.jobs import CommandRuntime, ContainerRuntime, JobRuntime, SleepRuntime
from runtime.os_users import RunAs, chown, ensure_traversable

JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The ``PATH`` of every command job (and of its reaper, which searches it for the program)."""
WORK_SUBDIR = "work"
"""The working directory and ``HOME`` of a job that runs as another user: this folder inside
its job folder, owned by that user, mode 0700 (the job folder itself stays the agent's)."""


def private_job_dir(job_dir: Path, run_as: RunAs) -> None:
    """Close ``job_dir`` (the agent's) to all but its job: group ``run_as.gid`` (a job's own
    gid: :mod:`agent.identities`), mode 0710, so the job may pass through it to its ``work/``
    (its ``HOME``, by path too) and nobody else may enter; its parents searchable by all."""
    os.chown(job_dir, os.geteuid(), run_as.gid, follow_symlinks=False)
    job_dir.chmod(0o710)
    ensure_traversable(job_dir.parent)


@attrs.frozen(kw_only=True)
class RunOptions:
    """What a job's spec asks of its run beyond the runtime (``runtime.jobs.JobSpec``)."""

    timeout_s: float | None = None
    """Stop the job once it has run this long (from its start, by the monotonic clock) and end it
    failed with detail ``timeout: ...``; None: no limit. A command's reaper enforces it; a
    sleep's and a container's the agent."""
    workdir: str = ""
    """A command's working directory, an absolute path that must exist on the worker; empty:
    the job's folder (or its ``work/`` when it runs as another user)."""

    @property
    def default(self) -> bool:
        """True when it asks for nothing."""
        return self.timeout_s is None and not self.workdir


def owner_of(work_dir: str) -> str:
    """12 hex digits of the sha256 of the absolute work folder: one worker of one cluster (a
    container job's owner, :class:`ContainerJob`)."""
    return hashlib.sha256(os.path.abspath(work_dir).encode()).hexdigest()[:12]


@attrs.frozen(kw_only=True)
class ContainerJob:
    """What a container job needs besides its runtime: whose it is and its limits."""

    worker_id: str
    job_id: int
    assignment_id: int
    cpu_millis: int
    memory_mb: int
    """The container's memory limit, swap included (none)."""
    user: str = ""
    """``uid:gid`` the container's processes run as (the agent's job user); empty: the image's."""
    owner: str = ""
    """:func:`owner_of` the agent's work folder: in the container's name and labels, so the
    agents of two clusters on one engine never take each other's."""
    workdir: str = ""
    """The working directory inside the container; empty: the image's own."""
    oom_score_adj: int | None = None
    """The container's ``oom_score_adj`` (:mod:`runtime.oom`); None: the engine's default."""


def job_dir_for(jobs_dir: Path, job_id: int, assignment_id: int) -> Path:
    """The folder of one assignment's files: ``<jobs_dir>/<job_id>-<assignment_id>``."""
    return jobs_dir / f"{job_id}-{assignment_id}"


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
    """How long a job the agent itself times runs, in seconds (a sleep); None for a runtime
    whose end its process reports."""
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
    on_started: Callable[[], None] = lambda: None,
    run_as: RunAs | None = None,
    job_env: Mapping[str, str] | None = None,
    pause: PauseView | None = None,
    container: ContainerJob | None = None,
    run_options: RunOptions | None = None,
    resources: JobResources | None = None,
    limits: JobLimits | None = None,
    on_spawned: Callable[[int], None] | None = None,
    oom_score_adj: int | None = None,
    notice: StopNotice | None = None,
) -> JobResult:
    """Run one job until it ends or ``stop`` is set; return once it has really ended.

    Args:
        runtime: what to run.
        job_dir: the job's folder (created for command jobs; must be absolute).
        stop: set it to stop the job early (SIGTERM, then SIGKILL after ``stop_grace_s`` seconds).
        fence_deadline_path: the worker's fence-deadline file (:mod:`agent.reaper`); a command's
            reaper kills it once that deadline has passed. None: no deadman.
        job_nice: added to a command's nice value, 0..19.
        spawner: the thread that forks a command's reaper; None: the calling thread.
        on_started: called once, when the start is over: a command has exec'd or could not be
            started (a sleep job: at once); at the latest just before this returns.
        run_as: the user a command runs as; None, or this process's own user: in ``job_dir``.
            Another user: in ``job_dir/work`` (its ``HOME``, owned by it).
        job_env: variables a command gets besides ``PATH`` (:data:`JOB_PATH`) and ``HOME``;
            nothing else of this process's environment is passed on.
        pause: the worker's pauses, which a sleep job's duration does not count; None: never.
        container: a container job's names and limits (a container job without it fails).
        run_options: the spec's timeout and working directory; None: neither.
        resources: how the worker enforces a command's ``limits`` (``cpu_millis``,
            ``memory_mb``); None, or no ``limits``: not at all (tools and tests).
        on_spawned: called with a command's reaper's pid once it is forked (recorded for a
            restarted agent: :mod:`agent.adoption`).
        oom_score_adj: a command's ``oom_score_adj`` (:mod:`runtime.oom`); None: inherited.
        notice: a stop with a grace of its own (a preemption's) for a command or a container:
            SIGTERM at once, the kill its ``grace_s`` after (:class:`agent.supervised.StopNotice`);
            None: only ``stop``. A sleep job does not look at it.

    Returns:
        The result; ``stopped`` tells a stop from a natural end, ``started`` whether a command
        ran at all.

    Raises:
        trio.Cancelled: after having a command's reaper SIGKILL the job (shielded).
    """
    options = run_options or RunOptions()
    supervised = SupervisedRun(
        job_dir=job_dir,
        job_env=job_env or {},
        spawner=spawner,
        on_started=on_started,
        fence_deadline_path=fence_deadline_path,
        stop=stop,
        stop_grace_s=stop_grace_s,
        notice=notice,
    )
    match runtime:
        case SleepRuntime():
            on_started()
            return await _timed(
                lambda inner: run_sleep(runtime, stop=inner, pause=pause), stop, options.timeout_s
            )
        case CommandRuntime():
            return await _run_command(
                runtime,
                supervised,
                job_nice=job_nice,
                run_as=run_as,
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
                lambda inner: run_container(runtime, attrs.evolve(supervised, stop=inner), job=container),
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
    (:func:`job_runner`), or a scripted stand-in in unit tests. The arguments every job is given
    are named here; the ones only some jobs are given (a container, limits, a timeout, a
    command's or container's ``notice``, which a runner given it must honour: see
    :func:`agent.job_task.runner_options`) arrive by name in ``options``."""

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
        **options: Any,
    ) -> JobResult: ...


def job_runner(spawner: Spawner | None) -> JobRunner:
    """:func:`run_job` with command reapers forked on ``spawner`` (None: the calling thread)."""
    return partial(run_job, spawner=spawner)


async def _run_command(
    spec: CommandRuntime,
    run: SupervisedRun,
    *,
    job_nice: int,
    run_as: RunAs | None,
    options: RunOptions,
    resources: JobResources | None,
    limits: JobLimits | None,
    on_spawned: Callable[[int], None] | None = None,
    oom_score_adj: int | None = None,
) -> JobResult:
    job_dir = run.job_dir
    began = trio.current_time()
    if run.stop_asked():
        return run.not_started(began, "stopped before it was started", stopped=True)

    def spawn() -> tuple[subprocess.Popen[bytes], int, ConfinedJob | None]:
        """Make the job's cgroup and start its reaper from the calling thread: the reaper, the
        read end of its start pipe and the job's cgroup, if any.

        Raises:
            _CannotConfine: the job's cgroup could not be made.
            OSError: the folder or the output files cannot be created, or the interpreter cannot
                be executed.
        """
        confined = None
        if resources is not None and limits is not None:
            try:
                confined = resources.confine(job_dir.name, limits)
            except OSError as exc:
                raise _CannotConfine(f"resources_error: cannot make the job's cgroup: {exc}") from exc
        confinement = Confinement() if confined is None else confined.confinement
        try:
            job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            deadman.clear_files(job_dir)
            switch = run_as is not None and run_as.is_other_user
            home = job_dir
            if switch:
                assert run_as is not None
                home = job_dir / WORK_SUBDIR
                home.mkdir(mode=0o700, exist_ok=True)
                chown(home, run_as)
                private_job_dir(job_dir, run_as)
            command = partial(
                reaper.reaper_argv,
                sys.executable,
                parent_pid=os.getpid(),
                stop_grace_s=run.stop_grace_s,
                fence_deadline_path=None if run.fence_deadline_path is None else str(run.fence_deadline_path),
                argv=spec.argv,
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
            proc, started_fd = run.popen(
                lambda started_fd: command(started_fd=started_fd),
                # The job's own PATH or HOME (its spec's env) wins over the defaults.
                env={"PATH": JOB_PATH, "HOME": str(home), **run.job_env},
            )
        except BaseException:
            if confined is not None:
                confined.remove()
            raise
        return proc, started_fd, confined

    try:
        # Shielded inside Spawner.run: the reaper it forks always comes back here, and no
        # checkpoint follows before the try below that kills it when cancelled.
        proc, started_fd, confined = await run.spawn(spawn)
    except _CannotConfine as exc:
        return run.not_started(began, str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        return run.not_started(began, f"cannot start the reaper of {spec.argv[0]!r}: {exc}")
    if on_spawned is not None:
        on_spawned(proc.pid)  # no checkpoint since the fork came back: wait_supervisor owns it next
    try:
        stopped, exec_reported, reaper_code = await run.wait(proc, started_fd)
    finally:
        # Also when cancelled: the cgroup goes with the job (its leftovers are killed first).
        oom_kills = 0 if confined is None else (await release(confined)).oom_kills
    report = deadman.read_report(job_dir)
    result = command_result(
        report, reaper_code, stopped=stopped, exec_reported=exec_reported, began_at=began, paths=run.paths
    )
    return oom_killed(result, oom_kills, limits)


class _CannotConfine(Exception):
    """The job's cgroup could not be made; the message is the job's detail."""
