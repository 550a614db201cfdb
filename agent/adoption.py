"""Restarts that keep jobs: how a restarted agent finds what its predecessor left running and
takes it over: :func:`survey`, :func:`plan_takeover`, :class:`ReaperWatch`.

docs/design.md, "Restarts on the worker: the record, the survey and the takeover".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
from collections.abc import Iterable, Sequence
from enum import StrEnum
from functools import partial
from pathlib import Path

import attrs
import trio

from agent import deadman
from agent.fence import trio_time_of
from agent.job_record import RECORD_FILE, JobRecord, read_record
from agent.job_results import JobResult, OutputPaths, command_result, container_result
from agent.messages import JobState
from agent.supervised import REAPER_SLACK_S, StopNotice, pass_stop_on
from agent.work_folder import create_private
from runtime.errors import LocalFileError
from runtime.jobs import ContainerRuntime, SleepRuntime

LOCK_FILE = "agent.lock"
"""In the work folder: locked (``flock``) by the agent process that runs there, with its pid."""


def lock_work_dir(work_dir: Path) -> int:
    """Lock ``work_dir`` for this agent process (one agent per work folder, or two would take
    over the same jobs); returns the lock's file descriptor (close it to release the lock). The
    ``flock`` goes with the process, also when it is killed; job supervisors never hold it.

    Raises:
        LocalFileError: another live process holds the lock; the message names its pid.
        OSError: the file cannot be opened.
    """
    path = work_dir / LOCK_FILE
    fd = create_private(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise LocalFileError(
            f"work_dir {work_dir} is in use by another agent process (pid {holder}, holding {path}); "
            "stop it, or give this agent a work folder of its own"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@attrs.frozen(kw_only=True)
class ProcessInfo:
    """A process as ``/proc`` shows it."""

    pid: int
    start_ticks: int
    """``/proc/<pid>/stat`` field 22: when it started, in clock ticks since boot."""
    argv: tuple[str, ...]
    cwd: str
    """Its working directory (``/proc/<pid>/cwd``), or empty when it cannot be read."""
    parent_pid: int = 0
    """``/proc/<pid>/stat`` field 4; 0 when unknown."""


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (the start time), or None when the process is gone."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _stat(pid: int) -> tuple[int, int] | None:
    """Fields 4 (the parent's pid) and 22 (the start time, in clock ticks since boot) of
    ``/proc/<pid>/stat``, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            # The command name (field 2) may hold spaces or ")": split after its last ")".
            fields = file.read().rsplit(")", 1)[1].split()
            return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_info(pid: int) -> ProcessInfo | None:
    """What ``/proc`` says of process ``pid``; None when it is gone (or a zombie, whose command
    line is empty)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            raw = file.read()
    except OSError:
        return None
    stat = _stat(pid)
    if stat is None or not raw:
        return None
    parent_pid, ticks = stat
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = ""
    argv = tuple(part.decode("utf-8", "surrogateescape") for part in raw.rstrip(b"\0").split(b"\0"))
    return ProcessInfo(pid=pid, start_ticks=ticks, argv=argv, cwd=cwd, parent_pid=parent_pid)


class Supervisor(StrEnum):
    """Which kind of job supervisor a process is."""

    REAPER = "reaper"
    """A command job's reaper (:mod:`agent.reaper`)."""
    CONTAINER = "container"
    """A container job's supervisor (:mod:`agent.container_supervisor`)."""


def supervisor_of(argv: Sequence[str], deadline_path: str) -> Supervisor | None:
    """Whether a process with command line ``argv`` is a job supervisor of the worker whose
    fence-deadline file is ``deadline_path``, and which kind; None when it is not.

    The bootstrap (``-c``) names the module, and the deadline file (before ``--`` for a reaper,
    in the spec for a container supervisor) this worker's work folder.
    """
    try:
        code = list(argv).index("-c")
    except ValueError:
        return None
    if code + 1 >= len(argv):
        return None
    bootstrap, rest = argv[code + 1], list(argv[code + 2 :])
    if "agent.reaper import run" in bootstrap:
        head = rest[: rest.index("--")] if "--" in rest else rest
        return Supervisor.REAPER if deadline_path in head else None
    if "container_supervisor" in bootstrap and rest:
        try:
            spec = json.loads(rest[0])
        except json.JSONDecodeError:
            return None
        if isinstance(spec, dict) and spec.get("deadline_path") == deadline_path:
            return Supervisor.CONTAINER
    return None


def supervisors(deadline_path: str) -> list[tuple[ProcessInfo, Supervisor]]:
    """Every live job supervisor of the worker whose fence-deadline file is ``deadline_path``
    (:func:`supervisor_of`), from a scan of ``/proc``; none where there is no ``/proc``.

    A process whose parent is a supervisor found here is its child between fork and exec (it
    still shows the supervisor's command line), and is left out."""
    found = []
    marker = os.fsencode(deadline_path)
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                if marker not in file.read():
                    continue  # cheap first: most processes name no deadline file of ours
        except OSError:
            continue
        info = process_info(int(entry))
        if info is None:
            continue
        kind = supervisor_of(info.argv, deadline_path)
        if kind is not None:
            found.append((info, kind))
    pids = {info.pid for info, _ in found}
    return [(info, kind) for info, kind in found if info.parent_pid not in pids]


def supervised_job_folders(deadline_path: str) -> frozenset[str]:
    """The names of the job folders in which a supervisor of the worker whose fence-deadline file
    is ``deadline_path`` still runs: their cgroups stay for the takeover
    (:func:`agent.cgroups.resource_settings`)."""
    return frozenset(os.path.basename(info.cwd) for info, _ in supervisors(deadline_path))


class Verdict(StrEnum):
    """What a restarted agent does with a job its folder records (docs/design.md, "Restarts on
    the worker")."""

    KEEPABLE = "keepable"
    STRAY = "stray"
    ENDED = "ended"
    SLEEP = "sleep"


def judge(
    record: JobRecord, running: ProcessInfo | None, kind: Supervisor | None, *, worker_id: str
) -> tuple[Verdict, str]:
    """The verdict on ``record``, given the supervisor ``running`` in its folder (of ``kind``;
    None: none runs there), and why, for the log. Pure.

    A reaper is kept only when it is of this worker, its pid and its start time are the
    record's (the pid alone could name a process that reused it).
    """
    if isinstance(record.runtime, SleepRuntime):
        if record.worker_id != worker_id:
            return Verdict.ENDED, f"a record of worker {record.worker_id}"
        return Verdict.SLEEP, "a sleep job"
    if running is None:
        return Verdict.ENDED, "its supervisor has exited"
    if record.worker_id != worker_id:
        return Verdict.STRAY, f"a record of worker {record.worker_id}"
    if kind is not Supervisor.REAPER:
        return Verdict.STRAY, "container jobs are not kept across restarts"
    if record.supervisor_pid is None or record.supervisor_start_ticks is None:
        return Verdict.STRAY, "its record names no reaper (the agent died as it forked it)"
    if (record.supervisor_pid, record.supervisor_start_ticks) != (running.pid, running.start_ticks):
        return Verdict.STRAY, (
            f"its record names reaper {record.supervisor_pid} started at tick "
            f"{record.supervisor_start_ticks}, not {running.pid} started at {running.start_ticks}"
        )
    return Verdict.KEEPABLE, "its reaper runs, as recorded"


def fit(
    jobs: Iterable[JobRecord], *, cpu_millis: int, memory_mb: int
) -> tuple[list[JobRecord], list[JobRecord]]:
    """Which of ``jobs`` a worker of ``cpu_millis`` and ``memory_mb`` keeps, and which it stops.

    Oldest start first (ties by assignment id): each is kept if it fits what the kept ones
    before it left, else stopped, and the next ones are still tried. Pure.
    """
    kept: list[JobRecord] = []
    dropped: list[JobRecord] = []
    cpu_left, mem_left = cpu_millis, memory_mb
    for job in sorted(jobs, key=lambda j: (j.started_monotonic_s, j.assignment_id)):
        if job.cpu_millis <= cpu_left and job.memory_mb <= mem_left:
            kept.append(job)
            cpu_left -= job.cpu_millis
            mem_left -= job.memory_mb
        else:
            dropped.append(job)
    return kept, dropped


def sleep_ran_s(record: JobRecord, *, now_s: float, pause_at_s: float | None) -> float:
    """How long the sleep job of ``record`` has run by ``now_s`` (``time.monotonic()``): from its
    start, less its recorded pauses, and not past the file's pause deadline ``pause_at_s``
    (None: none). Pure."""
    until = now_s if pause_at_s is None else min(now_s, pause_at_s)
    return max(0.0, until - record.began_monotonic_s - record.paused_s)


@attrs.frozen(kw_only=True)
class Found:
    """One recorded job of the previous process, judged."""

    job_dir: Path
    record: JobRecord
    verdict: Verdict
    why: str
    running: ProcessInfo | None = None
    """The supervisor running in its folder, if any."""


@attrs.frozen(kw_only=True)
class Survey:
    """What a restarted agent found in its work folder (:func:`survey`)."""

    found: tuple[Found, ...]
    strays: tuple[ProcessInfo, ...]
    """Supervisors of this work folder that run in no recorded folder."""
    deadline: tuple[float, float] | None
    """The fence-deadline file as the previous process left it: (pause at, kill at) in
    ``time.monotonic()`` seconds; None when there is none."""


def survey(jobs_dir: Path, *, worker_id: str, deadline_path: Path) -> Survey:
    """Find what the previous process of this work folder left: every job record under
    ``jobs_dir`` judged against the supervisors running (:func:`judge`), and the strays."""
    running: dict[str, tuple[ProcessInfo, Supervisor]] = {}
    for proc, which in supervisors(str(deadline_path)):
        running[proc.cwd] = (proc, which)
    found: list[Found] = []
    recorded: set[str] = set()
    for path in sorted(jobs_dir.glob(f"*/{RECORD_FILE}")) if jobs_dir.is_dir() else ():
        job_dir = path.parent
        record = read_record(job_dir)
        here = running.get(str(job_dir))
        if record is None or job_dir.name != f"{record.job_id}-{record.assignment_id}":
            continue  # unreadable, or another job's: a supervisor there is a stray (below)
        recorded.add(str(job_dir))
        info, kind = here if here is not None else (None, None)
        verdict, why = judge(record, info, kind, worker_id=worker_id)
        found.append(Found(job_dir=job_dir, record=record, verdict=verdict, why=why, running=info))
    strays = [proc for cwd, (proc, _) in sorted(running.items()) if cwd not in recorded]
    deadline = deadman.read_fence_deadline(deadline_path) if deadline_path.exists() else None
    return Survey(found=tuple(found), strays=tuple(strays), deadline=deadline)


@attrs.frozen(kw_only=True)
class TakeoverPlan:
    """What a restarted agent does with what its previous process left (:func:`plan_takeover`)."""

    settle: tuple[Found, ...]
    """Jobs that ended while no agent watched them: their ``stop`` lines and outcomes are
    written now, before anything is registered."""
    watch: tuple[Found, ...]
    """Jobs still running (their supervisor, or a sleep job's duration): taken over, each kept
    or stopped."""
    keep: tuple[int, ...]
    """The assignment ids of ``watch`` to keep, if the control plane continues ``incarnation``."""
    incarnation: int | None
    """The incarnation to ask to continue; None: keep nothing, register a new one."""
    stop: dict[int, str]
    """The assignment ids of ``watch`` to stop before registering, each with why."""
    strays: tuple[ProcessInfo, ...]
    """Supervisors of this work folder in no recorded folder: killed before registering."""
    kill_at_s: float | None = None
    """The fence-deadline file's kill deadline (``time.monotonic()``): the continuation is
    given up once it is less than ``min_left_s`` ahead (the reapers kill their jobs at it)."""


def plan_takeover(
    found: Survey, *, cpu_millis: int, memory_mb: int, now_s: float, min_left_s: float, pidfds: bool = True
) -> TakeoverPlan:
    """Decide what a restarted agent keeps of ``found``, now ``now_s`` (``time.monotonic()``).
    Pure.

    Nothing is kept when the fence-deadline file's kill deadline is less than ``min_left_s``
    seconds ahead, or when there are no ``pidfds``. Else the keepable jobs and the sleep jobs of
    the newest incarnation among them (an agent runs one incarnation's jobs only) are kept as
    far as they fit ``cpu_millis`` and ``memory_mb`` (:func:`fit`); every other job still
    running is stopped. A sleep job whose duration ran out meanwhile is settled as succeeded.
    """
    pause_at, kill_at = found.deadline if found.deadline is not None else (None, None)
    settle: list[Found] = []
    watch: list[Found] = []
    candidates: list[JobRecord] = []
    for item in found.found:
        if item.verdict is Verdict.ENDED:
            settle.append(item)
            continue
        if item.verdict is Verdict.SLEEP:
            assert isinstance(item.record.runtime, SleepRuntime)
            ran_s = sleep_ran_s(item.record, now_s=now_s, pause_at_s=pause_at)
            if ran_s * 1000 >= item.record.runtime.duration_ms:
                settle.append(item)
                continue
        watch.append(item)
        if item.verdict in (Verdict.KEEPABLE, Verdict.SLEEP):
            candidates.append(item.record)
    stop: dict[int, str] = {
        item.record.assignment_id: item.why for item in watch if item.verdict is Verdict.STRAY
    }
    kept: list[JobRecord] = []
    incarnation: int | None = None
    if kill_at is not None and now_s > kill_at - min_left_s:
        why = "its kill deadline has passed, or is too near to continue its incarnation"
        stop.update({r.assignment_id: why for r in candidates})
    elif not pidfds:
        stop.update({r.assignment_id: "this system has no pidfds to watch it with" for r in candidates})
    else:
        incarnation = max((r.incarnation for r in candidates), default=None)
        same = [r for r in candidates if r.incarnation == incarnation]
        for r in candidates:
            if r.incarnation != incarnation:
                stop[r.assignment_id] = f"it runs in incarnation {r.incarnation}, older than {incarnation}"
        kept, dropped = fit(same, cpu_millis=cpu_millis, memory_mb=memory_mb)
        for r in dropped:
            stop[r.assignment_id] = (
                f"it does not fit the worker's capacity of {cpu_millis} cpu_millis and "
                f"{memory_mb} memory_mb beside the older jobs kept"
            )
    return TakeoverPlan(
        settle=tuple(settle),
        watch=tuple(watch),
        keep=tuple(r.assignment_id for r in kept),
        incarnation=incarnation if kept else None,
        stop=stop,
        strays=found.strays,
        kill_at_s=kill_at,
    )


class ReaperWatch:
    """A supervisor this agent did not fork, held by a pidfd: signalled and waited for. Open with
    :meth:`open`, which checks the process's start time *after* the pidfd exists."""

    def __init__(self, pid: int, pidfd: int | None) -> None:
        self.pid = pid
        self._pidfd = pidfd

    @classmethod
    def open(cls, info: ProcessInfo) -> ReaperWatch | None:
        """A watch of ``info``'s process, or None when it is gone or its pid now names another
        process (its start time changed). Where pidfds are missing the watch signals by pid and
        polls (each signal after its start time is checked again)."""
        try:
            pidfd: int | None = os.pidfd_open(info.pid)
        except (AttributeError, OSError) as exc:
            if isinstance(exc, ProcessLookupError):
                return None
            pidfd = None
        if start_ticks(info.pid) != info.start_ticks:
            if pidfd is not None:
                os.close(pidfd)
            return None
        return cls(info.pid, pidfd)

    def send(self, sig: int, ticks: int | None = None) -> None:
        """Send ``sig``; a process that is gone is fine. Without a pidfd, only if the pid still
        has start time ``ticks``."""
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif ticks is not None and start_ticks(self.pid) == ticks:
                os.kill(self.pid, sig)

    async def wait(self, ticks: int | None = None) -> None:
        """Return once the process has exited."""
        if self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
            return
        while start_ticks(self.pid) == ticks and ticks is not None:  # noqa: ASYNC110 (not our child)
            await trio.sleep(0.05)

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


async def watch_supervisor(
    watch: ReaperWatch,
    *,
    ticks: int,
    stop: trio.Event,
    stop_grace_s: float,
    notice: StopNotice | None = None,
    job_dir: Path | None = None,
) -> bool:
    """Wait until the supervisor held by ``watch`` has exited, passing a stop (or a ``notice``,
    its grace written into ``job_dir``) on as :func:`agent.supervised.wait_supervisor` does
    (also when cancelled: shielded); returns whether a stop was asked for. Closes the watch."""
    stopped = False

    def send(sig: int) -> None:
        nonlocal stopped
        stopped = True
        watch.send(sig, ticks)

    async def stop_when_asked() -> None:
        await pass_stop_on(send, stop=stop, stop_grace_s=stop_grace_s, notice=notice, job_dir=job_dir)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop_when_asked)
            await watch.wait(ticks)
            nursery.cancel_scope.cancel()
    except BaseException:
        with trio.CancelScope(shield=True):
            watch.send(signal.SIGUSR1, ticks)
            with trio.move_on_after(REAPER_SLACK_S):
                await watch.wait(ticks)
            watch.send(signal.SIGKILL, ticks)
        raise
    finally:
        watch.close()
    return stopped


def result_from_report(record: JobRecord, job_dir: Path, *, stopped: bool) -> JobResult:
    """How a job whose supervisor this agent did not fork ended, from its report. ``stopped``:
    this agent asked for a stop. A supervisor that left no report was killed: the job failed,
    unless a stop was asked; with no supervisor recorded either, the job did not start."""
    paths = OutputPaths.in_folder(job_dir)
    began = trio_time_of(record.started_monotonic_s)
    report = deadman.read_report(job_dir)
    if not report:
        unstarted = record.supervisor_pid is None and not stopped
        return JobResult(
            state=JobState.NOT_STARTED if unstarted else JobState.CANCELLED if stopped else JobState.FAILED,
            stopped=stopped,
            exit_code=None,
            began_at=began,
            ended_at=trio.current_time(),
            stdout_path=paths.stdout_path,
            stderr_path=paths.stderr_path,
            detail="not started: its agent died before it started the job's supervisor"
            if unstarted
            else "its supervisor ended without a report while its agent was restarting",
            started=not unstarted,
        )
    read = container_result if isinstance(record.runtime, ContainerRuntime) else command_result
    return read(report, 0, stopped=stopped, exec_reported=False, began_at=began, paths=paths)


async def stop_strays(strays: Sequence[ProcessInfo], *, stop_grace_s: float) -> None:
    """Kill every supervisor of ``strays`` at once (SIGUSR1: it kills its job's whole tree, or
    its container) and wait until each has exited (SIGKILL after :data:`REAPER_SLACK_S`)."""
    watches = [(w, info.start_ticks) for info in strays if (w := ReaperWatch.open(info)) is not None]
    stop = trio.Event()
    stop.set()

    async with trio.open_nursery() as nursery:
        for watch, ticks in watches:
            watch.send(signal.SIGUSR1, ticks)
            nursery.start_soon(
                partial(watch_supervisor, watch, ticks=ticks, stop=stop, stop_grace_s=stop_grace_s)
            )
