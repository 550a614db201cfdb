"""The per-job supervisor ("reaper") of a command job, and the files it shares with the agent.

The agent does not start a command job itself: it starts this module as a small process of its
own (see :func:`reaper_argv`), the leader of a new session and of a process group of its own,
and the reaper starts the job. It exists because the agent alone cannot keep invariant 7
(DESIGN.md) when it dies or freezes:

- **It outlives the agent.** When the agent dies (a crash, SIGKILL, a restart) the reaper keeps
  its job as it keeps it for a frozen agent: the job runs on until the pause deadline of the
  fence-deadline file below (as the dead agent last wrote it), is paused there and killed at
  the kill deadline. So a dead agent's jobs stop by the same deadlines as a frozen one's
  (invariant 7 holds by the same argument), and an agent started again on the same work
  folder within them can take the job over (:mod:`agent.adoption`): it proves the reaper is
  its own (the job folder's record, the reaper's pid and start time, its command line naming
  this work folder's deadline file), watches it through a pidfd, signals it and reads its
  report as its parent would. (Until restarts kept jobs, the reaper's ``PR_SET_PDEATHSIG``
  killed the job the moment the agent died, which made every restart lose its running work.)
  A reaper started with no deadline file (a tool's :func:`agent.runtimes.run_job`, outside an
  agent) has no deadman and no agent to take it over: it still dies with its parent, through
  ``PR_SET_PDEATHSIG`` = SIGUSR1, handled as the agent's kill.
- **It is a deadman switch.** The agent keeps a per-worker fence-deadline file
  (``<work_dir>/fence_deadline``, :func:`write_fence_deadline`, replaced atomically) with two
  ``time.monotonic()`` times (``CLOCK_MONOTONIC``, which every process on the machine shares
  and which runs on while a process is stopped): the *pause* deadline, the send time of the
  last acknowledged heartbeat (or registration) plus ``self_fence_after_s``, and the *kill*
  deadline, that send time plus ``db_outage_grace_s``. The reaper reads it every
  :data:`POLL_S` seconds and exactly at the deadline it waits for. Once the pause deadline has
  passed it SIGSTOPs every process of the job's tree, whatever process group or session each
  moved to (:func:`_descendants`; one the job had stopped itself stays so), and writes the
  pause time (``time.monotonic()``) to :data:`FENCED_AT_FILE` in the job's folder; once
  the kill deadline has passed it SIGKILLs the job, whose stop time stays the pause time (it
  did no work after it). When the agent moves the deadlines on while the job is paused (a
  heartbeat the database acknowledged said the job's assignment is still active) it removes
  that file and SIGCONTs the job, unless a stop from the agent is pending: the agent signals
  the stops of ended assignments before it moves the deadline, and such a job is killed,
  never resumed. With both deadlines equal (``db_outage_grace_s`` = 0) the job is killed at
  the first, as before pausing existed. So a frozen (SIGSTOPped, stalled) agent cannot leave
  its command jobs running: they stop at the deadline whether or not the agent runs. A file
  that cannot be read keeps the values last read; one that cannot be read when the reaper
  starts counts as a passed deadline (fail safe): the job is not started. A reaper that
  starts after the pause deadline but before the kill deadline (the agent forked it just
  before it paused) holds the start as it would hold a running job (:meth:`_Reaper.hold_start`):
  it starts the job once the agent moves the deadlines on, unless a stop came first, and
  refuses it at the kill deadline; refusing at once would end, on a worker whose pause
  resumes, an assignment the control plane still counts as running.
- **It forwards a graceful stop.** SIGTERM to the reaper: SIGTERM to the job's process group,
  then SIGKILL to the group and every descendant after ``stop_grace_s`` (the agent's stop
  semantics, now timed by the reaper, so a freeze of the agent mid-stop does not stretch the
  grace). SIGUSR1 from the agent (or from the agent that took it over): SIGKILL at once.
- **It tells the agent when the start is over.** The agent passes the write end of a pipe
  (``STARTED_FD``, close-on-exec in the reaper, so the job never holds it); the reaper writes
  one byte, :data:`STARTED_BYTE`, once the job has exec'd (the exec-error pipe below read
  EOF), and closes it. A reaper that does not start the job (the fence deadline had passed,
  the exec failed, the agent was already gone) writes nothing; its exit closes the pipe (one
  whose agent died after the start writes into a pipe nobody reads: the error is ignored). The
  agent frees the job's start slot when the pipe is readable (the byte or EOF), so the
  number of command jobs starting at once is bounded by what really is starting, not by a
  timer (see :mod:`agent.starts`).
- **It runs the job at a lower CPU priority.** Between fork and exec the job's process adds
  ``JOB_NICE`` to its nice value (``os.nice``; the kernel caps it at 19; a failure to change
  it is ignored: the job runs at the reaper's priority), so a busy job does not starve the
  agent's heartbeats. The reaper itself keeps the agent's priority: it is the deadman switch.
- **It makes the job the OOM killer's first choice.** Between fork and exec the job's process
  writes the worker's ``job_oom_score_adj`` (1000) to ``/proc/self/oom_score_adj`` (the
  ``oom_score_adj=`` line of ``CONFINE``), while the reaper keeps the agent's (-998, inherited):
  when the whole machine runs out of memory the kernel kills a job before the deadman switch
  or the agent (:mod:`runtime.oom`).
- **It confines the job to its limits.** The agent makes the job's cgroups (one per v1
  hierarchy, one in v2; :mod:`agent.cgroups`) and passes their ``cgroup.procs`` files in
  ``CONFINE``, with the job's ``RLIMIT_AS`` where it has no cgroups (:mod:`agent.resources`).
  The job's process joins them first thing after the fork, before ``setsid``, ``chdir``, the
  privilege drop (the job user may not write there) and the exec, and sets the rlimit; one it
  cannot join keeps the job from starting (``resources_error: ...`` in the report), so
  nothing of the job runs unconfined. In cgroup v2 it is born there instead, where the kernel
  can (``clone3`` with ``CLONE_INTO_CGROUP``, :func:`_fork_into`). The reaper stays outside:
  the deadman switch is not OOM-killed or throttled with its job, and the agent
  removes the cgroups once the reaper has exited.
- **It reports the job's end.** When the job's main process has exited, the reaper SIGKILLs
  whatever is left of its group and of its descendants (as the agent did before: the job owns
  nothing after it ends), waits for them, and writes :data:`REPORT_FILE` (:func:`read_report`)
  with the exit code (negative ``-N`` when signal N killed it, the ``subprocess`` convention),
  the end time (``time.monotonic()``, as every time the reaper writes: never the wall clock,
  which may be stepped while the job runs), whether a stop reached the job before it ended (a
  stop, or the fence deadline, that comes after the job's main process exited on its own changes nothing:
  the job keeps its own end, and the agent its outcome, also when the agent thawed past its
  deadline and asked for the stop late), the fence kill time when it fenced the job, or the
  error that kept the job from starting (``cannot start 'x': [Errno 2] ...``). Its own exit
  status mirrors the job's (``128 + N`` for signal N) for humans; the agent reads the report.

Every descendant: the job runs in a session and process group of its own (``setsid``), so a
group signal never hits the reaper, and the reaper is a child
subreaper (``PR_SET_CHILD_SUBREAPER``): orphaned descendants are re-parented to it, not to
pid 1, even those that left the job's process group or session. After SIGKILLing the group
it kills its own children round by round, each round's victims handing their orphans to it,
until it has none left. What escapes: work a job hands to another service (``systemd-run``,
a container engine), which was never in its tree; and, where ``prctl`` is missing (not
Linux), everything outside the job's group. The job's main process also has
``PR_SET_PDEATHSIG`` = SIGKILL with the reaper as parent, for a reaper that is SIGKILLed
itself (by the agent's last-resort backstop or the OOM killer); its descendants then live on.

Start cost: the reaper is imported from its cached bytecode by a one-line ``-c`` bootstrap
with ``-I -S`` (no ``site``, no environment variables), imports only ``os``, ``sys``,
``time``, ``errno``, ``_signal`` (``signal`` without its enums, ~4 ms less) and ``ctypes``
(for ``prctl``), resolves the PATH before it forks (the child runs almost no Python), and
leaves with ``os._exit``. Measured on the development machine: a command job starts some
8 ms later than when the agent forked it directly (11.5 ms instead of 3.2 ms from
``run_job`` to the job running, medians), a ``true`` job takes 13 ms instead of 4 ms end
to end; each reaper holds about 3.3 MB of its own memory (USS) and uses about 0.1 % of a
core while it waits. The confinement adds little CPU (the agent's mkdir and writes, some
0.4 ms; a few writes in the child), but a *migration* into a cgroup (cgroup v1, or v2 where
``clone3`` cannot be used) waits for an RCU grace period in the kernel (the write side of
``cgroup_threadgroup_rwsem``), about 12 ms on that machine (``python -m
ops.bench.measure_resources``); a v2 job born in its cgroup does not wait. Only the job's start
waits, not the agent.

Command line (built by :func:`reaper_argv`)::

    python -I -S -c BOOTSTRAP PARENT_PID STOP_GRACE_S DEADLINE_FILE JOB_NICE STARTED_FD \
        RUN_AS_UID RUN_AS_GID JOB_CWD TIMEOUT_S CONFINE -- ARGV...

``DEADLINE_FILE`` may be empty (no deadman, for runtimes used outside an agent), and so may
``STARTED_FD`` (nobody waits for the start), ``RUN_AS_UID`` and ``RUN_AS_GID`` (both or
neither: the job runs as the reaper's user) and ``JOB_CWD`` (the job runs in the reaper's
working directory), and ``TIMEOUT_S`` and ``CONFINE`` (one line per item:
``cgroup=<cgroup.procs>``, ``clone_into=<v2 cgroup>``, ``as=<bytes>``,
``oom_score_adj=<-1000..1000>``). The reaper's working
directory is the job's folder; stdin, stdout and
stderr (opened by the agent, so a job that runs as another user writes them through the
descriptors it inherits) and the environment (the agent passes a clean one) are passed on to
the job.

**It runs the job as another user.** With ``RUN_AS_UID``/``RUN_AS_GID`` the job's process
enters ``JOB_CWD``, then drops its supplementary groups, its group and its user, in that order,
just before the exec (:meth:`_Reaper.start`); the reaper itself stays the agent's user, so it
can still signal the job and write its report, and the job cannot signal it.

This module must stay importable with nothing but the standard library: it runs before and
outside the rest of the package (``agent/__init__.py`` is only a docstring).

Why one module of about 500 lines: every command job's reaper process imports it on its way
to :func:`run`, and it imports only the standard library and nothing else of ours, so that its
start cost, part of every job's, stays small; the agent-side helpers that share its files live
here too, so the file formats have one home.
"""

from __future__ import annotations

import errno
import os
import sys
import time

try:
    import _signal as signal  # ``signal`` without the enum wrappers: ~4 ms less start cost
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]

POLL_S = 0.05
"""Longest time between two reads of the fence-deadline file, in seconds (the reaper also
wakes exactly at the deadline it read last)."""
FENCED_AT_FILE = "reaper.fenced_at"
"""In the job's folder: the time (``time.monotonic()``) at which the reaper paused the job, or
SIGKILLed it, because the fence deadline had passed."""
REPORT_FILE = "reaper.report"
"""In the job's folder: how the job ended, ``key=value`` lines (see :func:`read_report`)."""
STARTED_BYTE = b"1"
"""What the reaper writes to ``STARTED_FD`` once the job has exec'd."""

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_KILL_SIGNAL = signal.SIGUSR1
"""The agent's "kill the job now" (a stop past its grace, a cancel while paused)."""
_HANDLED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGUSR1)
_EXIT_CANNOT_START = 127
_EXIT_AGENT_GONE = 125
_EXIT_USAGE = 2
_SWEEP_WAIT_S = 0.01
_PAUSE_ROUNDS = 200
"""Most rounds of SIGSTOPs a pause sends before it settles for what it has stopped."""
_PAUSE_ROUND_S = 0.001
"""Wait between two rounds of a pause, in seconds."""
_BOOTSTRAP = "import sys; sys.path.append({root!r}); from agent.reaper import run; run()"
"""Imports this module from its (cached) bytecode rather than compiling it as a script;
``agent/__init__.py`` is a docstring. The package folder goes last: the standard library
comes first."""


# ---------------------------------------------------------------------------- agent side


def reaper_argv(
    python: str,
    *,
    parent_pid: int,
    stop_grace_s: float,
    fence_deadline_path: str | None,
    argv: tuple[str, ...],
    job_nice: int = 0,
    started_fd: int | None = None,
    run_as_uid: int | None = None,
    run_as_gid: int | None = None,
    job_cwd: str = "",
    timeout_s: float | None = None,
    cgroup_procs: tuple[str, ...] = (),
    address_space_bytes: int | None = None,
    clone_into: str | None = None,
    oom_score_adj: int | None = None,
) -> list[str]:
    """The command line that runs ``argv`` under a reaper.

    Args:
        python: the interpreter (``sys.executable``).
        parent_pid: the agent's process id; a reaper whose parent is already another process
            (the agent died while it started) exits without starting the job.
        stop_grace_s: seconds between SIGTERM and SIGKILL of a graceful stop.
        fence_deadline_path: the agent's fence-deadline file, or None for no deadman.
        argv: the job's command.
        job_nice: added to the job's nice value before it execs (0: unchanged).
        started_fd: the reaper's file descriptor of the write end of the start pipe (the
            caller passes it on, e.g. ``pass_fds``), or None for none.
        run_as_uid: the user the job runs as (the reaper drops to it, and to ``run_as_gid``
            with no supplementary groups, just before the exec), or None: the reaper's.
        run_as_gid: the job's group; given exactly when ``run_as_uid`` is.
        job_cwd: the job's working directory: relative to the reaper's, the job's folder,
            entered before the privilege drop; or absolute, a job's ``workdir``, entered after
            it with the job user's rights, which must be a directory (else the job is not
            started and the report's error says ``workdir_not_found``) the job's user may enter
            (else ``workdir_denied``); empty: the reaper's.
        timeout_s: the job's ``timeout_s``: once it has run this long (by the monotonic clock,
            from its start), the reaper stops it as the agent's stop would (SIGTERM to its group, SIGKILL
            after the grace) and reports ``timed_out=1``; None: no limit.
        cgroup_procs: the ``cgroup.procs`` files of the job's cgroups (made by the agent,
            :mod:`agent.cgroups`): the job's process writes itself into each between fork and
            exec, before the privilege drop; one that cannot be joined keeps the job from
            starting (the report's error says ``resources_error``). Empty: none.
        address_space_bytes: the job's ``RLIMIT_AS`` (soft and hard, at most the reaper's
            hard limit), set in the same place; None: unchanged.
        clone_into: a cgroup v2 folder the job's process is to be born in (``clone3`` with
            ``CLONE_INTO_CGROUP``, which spares the migration's cost), its ``cgroup.procs``
            being the one of ``cgroup_procs``; where the kernel cannot, the process joins it
            after the fork as above. None: fork, then join.
        oom_score_adj: the job's ``/proc/self/oom_score_adj`` (-1000..1000), written by its
            process between fork and exec, before the privilege drop (so a root reaper's job
            cannot lower it again as the job user; :mod:`runtime.oom`); the reaper keeps the
            agent's. None: the job inherits the reaper's.

    Raises:
        ValueError: ``run_as_uid`` without ``run_as_gid`` (or the other way round), or a
            cgroup path with a newline.
    """
    if (run_as_uid is None) != (run_as_gid is None):
        raise ValueError("run_as_uid and run_as_gid go together")
    if any("\n" in path for path in (*cgroup_procs, clone_into or "")):
        raise ValueError(f"a cgroup path cannot hold a newline: {cgroup_procs!r}, {clone_into!r}")
    confine = [f"cgroup={path}" for path in cgroup_procs]
    if clone_into is not None:
        confine.append(f"clone_into={clone_into}")
    if address_space_bytes is not None:
        confine.append(f"as={int(address_space_bytes)}")
    if oom_score_adj is not None:
        confine.append(f"oom_score_adj={int(oom_score_adj)}")
    return [
        python,
        "-I",  # no PYTHON* variables, no user site, no current folder on sys.path
        "-S",  # no site: the reaper needs only the standard library (and this package)
        "-c",
        _BOOTSTRAP.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        str(parent_pid),
        repr(float(stop_grace_s)),
        fence_deadline_path or "",
        str(int(job_nice)),
        "" if started_fd is None else str(started_fd),
        "" if run_as_uid is None else str(run_as_uid),
        "" if run_as_gid is None else str(run_as_gid),
        job_cwd,
        "" if timeout_s is None else repr(float(timeout_s)),
        "\n".join(confine),
        "--",
        *argv,
    ]


def write_fence_deadline(
    path: str | os.PathLike[str], pause_at_s: float, kill_at_s: float | None = None
) -> None:
    """Atomically replace the fence-deadline file: jobs pause at ``pause_at_s`` and are killed
    at ``kill_at_s`` (both ``time.monotonic()`` seconds; None or not later than ``pause_at_s``:
    killed at ``pause_at_s``, with no pause).

    Raises:
        OSError: the file cannot be written.
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    kill_at_s = pause_at_s if kill_at_s is None else max(kill_at_s, pause_at_s)
    with open(tmp, "w", encoding="ascii") as file:
        file.write(f"{pause_at_s!r} {kill_at_s!r}\n")
    os.replace(tmp, path)


def read_fence_deadline(path: str | os.PathLike[str]) -> tuple[float, float] | None:
    """The (pause at, kill at) deadlines in the file (``time.monotonic()`` seconds), or None
    when it is unreadable. A file with one number kills at it (no pause)."""
    try:
        with open(path, encoding="ascii") as file:
            values = [float(v) for v in file.read().split()]
    except (OSError, ValueError):
        return None
    if len(values) == 1:
        return values[0], values[0]
    if len(values) == 2:
        return values[0], max(values)
    return None


def read_report(job_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The reaper's report in ``job_dir``; empty when there is none (the reaper was killed).

    Keys: ``exit_code`` (int; negative ``-N`` for signal N), ``ended_monotonic_s`` (float,
    ``time.monotonic()``, when the job and everything it started were gone), ``stopped`` (``1``
    when a stop, a kill at the fence deadline included, reached the job before its main process
    exited; ``0`` when it ended on its own, also if a stop came after; without ``exit_code``: a
    stop came while its start was held at the fence deadline, and the job never started),
    ``fenced_monotonic_s`` (float, ``time.monotonic()``, only when the reaper SIGKILLed the job
    at the fence deadline; the job was not started when ``exit_code`` is missing),
    ``timed_out_after_s`` (float, only when the reaper stopped the job because its
    ``timeout_s`` ran out), ``error`` (the job could not be started). Values are strings.
    """
    report: dict[str, str] = {}
    try:
        with open(os.path.join(job_dir, REPORT_FILE), encoding="utf-8") as file:
            for line in file:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep:
                    report[key] = value
    except OSError:
        return {}
    return report


def clear_files(job_dir: str | os.PathLike[str]) -> None:
    """Remove a previous run's reaper files from ``job_dir`` (missing ones are fine)."""
    for name in (REPORT_FILE, FENCED_AT_FILE):
        try:
            os.unlink(os.path.join(job_dir, name))
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------------- reaper side


def _write_file(name: str, text: str) -> None:
    tmp = f"{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(tmp, name)


def _children() -> list[int]:
    """This process's children (the reaper is single-threaded)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", encoding="ascii") as file:
            return [int(p) for p in file.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: scan every process
        return _children_by_parent().get(me, [])


def _descendants() -> list[int]:
    """Every descendant of this process, parents before their children: the job's whole tree,
    whatever process group or session its members moved to (this process is a subreaper, so
    orphans stay in its tree). Read from ``/proc/<pid>/task/<tid>/children``, or by scanning
    every process where the kernel lacks that file. A process that exits meanwhile is left out,
    and one created meanwhile may be: callers repeat until the tree is stable."""
    me = os.getpid()
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return _descendants_by_scan(me)
    found: list[int] = []
    frontier = [me]
    while frontier:
        pid = frontier.pop(0)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as file:
                    kids = [int(p) for p in file.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            frontier.extend(kids)
    return found


def _children_by_parent() -> dict[int, list[int]]:
    """Every process's children, from scanning ``/proc/*/stat`` (for kernels without
    ``/proc/<pid>/task/<tid>/children``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    return parents


def _descendants_by_scan(root: int) -> list[int]:
    parents = _children_by_parent()
    found: list[int] = []
    frontier = [root]
    while frontier:
        kids = parents.get(frontier.pop(0), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def _state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie ...), or
    None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            return file.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_children() -> None:
    # Safe from pid reuse: a child stays ours (at worst a zombie) until this process reaps it.
    for pid in _children():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class _Reaper:
    def __init__(self, *, grace_s: float, deadline_path: str) -> None:
        self.grace_s = grace_s
        self.deadline_path = deadline_path
        self.pause_at: float | None = None
        """Monotonic time the job pauses at (the fence deadline); None: no deadman."""
        self.fence_kill_at: float | None = None
        """Monotonic time a paused job is killed at (the end of the outage grace)."""
        self.job_pid = 0
        self.kill_at: float | None = None
        """Monotonic time of the SIGKILL that ends a graceful stop."""
        self.killed = False
        self.timeout_at: float | None = None
        """Monotonic time the job's ``timeout_s`` runs out (None: no limit)."""
        self.timed_out = False
        """True once this reaper stopped the job because its timeout ran out."""
        self.stopped = False
        """True once a stop (the agent's, its death's, the fence deadline's) reached the job
        before its main process had exited."""
        self.paused = False
        """True while the job is held with SIGSTOP because the fence deadline passed."""
        self.stopped_pids: list[int] = []
        """The processes this pause stopped (and a resume continues)."""
        self.fenced_monotonic_s: float | None = None
        """While paused, and once killed at the fence: when the job stopped doing work
        (the pause, or the kill when there was none), ``time.monotonic()``."""

    def read_deadline(self) -> None:
        if self.deadline_path:
            value = read_fence_deadline(self.deadline_path)
            if value is not None:
                self.pause_at, self.fence_kill_at = value
            elif self.pause_at is None:
                self.pause_at = self.fence_kill_at = float("-inf")  # unreadable from the start: fail safe

    def fence_due(self) -> bool:
        """True once the pause deadline has passed; reads the file anew (some 15 µs)."""
        self.read_deadline()
        return self.pause_at is not None and time.monotonic() >= self.pause_at

    def kill_due(self) -> bool:
        """True once the kill deadline has passed (as last read)."""
        return self.fence_kill_at is not None and time.monotonic() >= self.fence_kill_at

    def kill(self) -> None:
        """SIGKILL the job's group and every descendant now (the job has not been reaped)."""
        _kill_group(self.job_pid, signal.SIGKILL)
        _kill_children()
        self.killed = True

    def job_exited(self) -> bool:
        """True once the job's main process has exited on its own or otherwise (it is not
        reaped here: its id stays this process's child until :meth:`reap`)."""
        try:
            info = os.waitid(os.P_PID, self.job_pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None and info.si_pid == self.job_pid

    def stop_job(self, *, at_once: bool) -> None:
        """Stop the job (SIGTERM, then SIGKILL after the grace; or SIGKILL ``at_once``, and
        always at once while it is paused: a graceful stop would let it run again) unless
        its main process has already exited: a stop that comes after the job ended on its own
        changes nothing, and the job's end stays its own (``stopped`` is not set)."""
        if self.job_exited():
            return
        self.stopped = True
        if at_once or self.paused:
            self.kill()
        elif self.kill_at is None:
            _kill_group(self.job_pid, signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace_s

    def pause(self) -> None:
        """Hold the job: SIGSTOP to every process of its tree (:func:`_descendants`, whatever
        group or session each is in), round after round until none of them runs (a process
        may fork before its stop takes effect; a stopped one cannot), and record when, in
        :data:`FENCED_AT_FILE`: a job killed later, while still paused, did no work after
        this. A process the job had stopped itself is left as it is, and not resumed later."""
        for _ in range(_PAUSE_ROUNDS):
            running = False
            for pid in _descendants():
                state = _state(pid)
                if state is None or state in "ZX":
                    continue
                if pid not in self.stopped_pids:
                    if state in "Tt":
                        continue  # stopped by the job itself
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except (ProcessLookupError, PermissionError):
                        continue
                    self.stopped_pids.append(pid)
                    running = True
                elif state not in "Tt":
                    running = True  # its stop has not taken effect yet
            if not running:
                break
            time.sleep(_PAUSE_ROUND_S)
        self.paused = True
        self.fenced_monotonic_s = time.monotonic()
        _write_file(FENCED_AT_FILE, f"{self.fenced_monotonic_s!r}\n")

    def resume(self) -> None:
        """Let a paused job run again (the agent moved the deadline on, after a heartbeat the
        database acknowledged). A stop the agent asked for before it moved the deadline is
        still pending here (it signals before it writes): it wins, and the job never runs
        again."""
        pending = signal.sigpending()
        if signal.SIGTERM in pending or _KILL_SIGNAL in pending:
            self.stop_job(at_once=True)
            return
        try:
            os.unlink(FENCED_AT_FILE)
        except FileNotFoundError:
            pass
        self.paused = False
        self.fenced_monotonic_s = None
        for pid in self.stopped_pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        self.stopped_pids = []

    def watch_fence(self) -> None:
        """Apply the fence deadlines (re-read from the file): pause at the first, kill at the
        second, resume when the agent moved them on."""
        due = self.fence_due()
        if self.paused:
            if self.kill_due():
                self.stopped = True
                self.kill()
            elif not due:
                self.resume()
        elif due and not self.job_exited():  # one that ended before its deadline ended so
            if self.kill_due():
                self.stop_job(at_once=True)
                self.fenced_monotonic_s = time.monotonic()
                _write_file(FENCED_AT_FILE, f"{self.fenced_monotonic_s!r}\n")
            else:
                self.pause()

    def hold_start(self) -> str:
        """Before the job has started, wait while the pause deadline has passed (the agent's
        jobs are paused, this one is held before its start), as :meth:`watch_fence` holds a
        started one. Returns ``"start"`` once the agent moved the deadlines on and asked for no
        stop (a stop it signalled before it moved them is still pending here and wins),
        ``"fenced"`` at the kill deadline (also at once when the file could not be read: both
        deadlines count as passed), ``"stopped"`` when a stop (SIGTERM) or a kill (SIGUSR1)
        came first."""
        while self.fence_due():
            if self.kill_due() or self.fence_kill_at is None:
                return "fenced"
            timeout = min(POLL_S, self.fence_kill_at - time.monotonic())
            info = signal.sigtimedwait(_HANDLED, max(timeout, 0.0))
            if info is not None and info.si_signo in (signal.SIGTERM, _KILL_SIGNAL):
                return "stopped"
        pending = signal.sigpending()
        if signal.SIGTERM in pending or _KILL_SIGNAL in pending:
            return "stopped"
        return "start"

    def start(
        self,
        argv: list[str],
        libc: object,
        nice: int,
        *,
        run_as: tuple[int, int] | None = None,
        cwd: str = "",
        env: dict[bytes, bytes] | None = None,
        cgroups: tuple[str, ...] = (),
        address_space: tuple[int, int, int] | None = None,
        clone_into: str | None = None,
        oom_score_adj: int | None = None,
    ) -> None:
        """Fork and exec the job in a session and process group of its own, ``nice`` lower in
        priority, in ``cwd`` (empty: the reaper's), as ``run_as`` (uid, gid; None: the reaper's
        user), in the cgroups whose ``cgroup.procs`` files ``cgroups`` lists, with the rlimit
        ``address_space`` (resource, soft, hard; None: none), with ``oom_score_adj`` (None:
        the reaper's).

        The job's process joins its cgroups first of all, before it runs anything of its own
        and while it still has the reaper's rights (the job user may not write there), and
        sets the rlimit; a failure there keeps the job from starting (it never runs
        unconfined). The reaper stays where it is, outside the job's cgroups. With
        ``clone_into`` (cgroup v2) the process is born in that cgroup instead
        (:func:`_fork_into`), where the kernel can do it: a migration waits for an RCU grace
        period (the kernel's cgroup_threadgroup_rwsem), some 13 ms on the development
        machine, a birth there does not.

        The privilege drop happens in the child, after ``chdir`` into the job's own folder (a
        relative ``cwd``) and before the exec, in the order that cannot be undone halfway:
        ``setgroups([])``, ``setgid``, ``setuid``; an absolute ``cwd`` (the job's ``workdir``)
        is entered after it, with the job user's rights. The
        parent-death signal is set after it (a change of credentials clears it). Any failure
        there keeps the job from starting (it never runs as the reaper's user instead). The
        job gets ``env`` (None: this process's environment).

        Raises:
            CannotConfine: a cgroup could not be joined, or the rlimit set.
            WorkdirDenied: the job's user cannot enter its absolute ``cwd``.
            OSError: the command cannot be executed (errno and file name, as ``execvp``).
        """
        reaper_pid = os.getpid()
        # The PATH search of execvp, done before the fork: the child runs as little Python
        # as it can (each step there copies pages of this interpreter; ~1 ms saved).
        if os.path.dirname(argv[0]):
            candidates = [argv[0]]
        else:
            candidates = [os.path.join(folder, argv[0]) for folder in os.get_exec_path()]
        setrlimit = None
        if address_space is not None:
            import resource  # here: only a reaper that sets an rlimit pays for the import

            setrlimit = resource.setrlimit
        errors_r, errors_w = os.pipe()  # both close-on-exec: EOF means exec succeeded
        forked = None if clone_into is None else _fork_into(clone_into)
        born_inside = forked is not None
        pid = os.fork() if forked is None else forked
        if pid == 0:  # the job; nothing here may return
            try:
                os.close(errors_r)
                for index, procs in enumerate(() if born_inside else cgroups):
                    try:
                        fd = os.open(procs, os.O_WRONLY)
                        try:
                            os.write(fd, b"0")  # 0: the writing process
                        finally:
                            os.close(fd)
                    except OSError as exc:
                        os.write(errors_w, f"C{index}:{exc.errno or 0}".encode())
                        os._exit(_EXIT_CANNOT_START)
                if address_space is not None:
                    try:
                        assert setrlimit is not None
                        setrlimit(address_space[0], address_space[1:])
                    except (OSError, ValueError) as exc:
                        os.write(errors_w, f"R:{getattr(exc, 'errno', 0) or 0}".encode())
                        os._exit(_EXIT_CANNOT_START)
                if oom_score_adj is not None:
                    # Before the privilege drop: a root reaper's write also sets the job's
                    # oom_score_adj_min, so the job user cannot lower it again. Raising never
                    # needs a right; where /proc lacks the file the job keeps the reaper's.
                    try:
                        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                        try:
                            os.write(fd, str(oom_score_adj).encode())
                        finally:
                            os.close(fd)
                    except OSError:
                        pass
                os.setsid()  # a session (and process group) of its own
                if cwd and not (enter_as_job_user := run_as is not None and os.path.isabs(cwd)):
                    os.chdir(cwd)  # the job's own folder, which the job user may not search
                if run_as is not None:
                    os.setgroups([])
                    os.setgid(run_as[1])
                    os.setuid(run_as[0])
                    if os.getuid() != run_as[0] or os.geteuid() != run_as[0] or os.getegid() != run_as[1]:
                        os._exit(_EXIT_CANNOT_START)
                    if enter_as_job_user:  # a workdir the user named: with the job user's rights
                        try:
                            os.chdir(cwd)
                        except OSError as exc:
                            os.write(errors_w, f"W:{exc.errno or 0}".encode())
                            os._exit(_EXIT_CANNOT_START)
                if libc is not None:
                    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # type: ignore[attr-defined]
                if os.getppid() != reaper_pid:
                    os._exit(_EXIT_AGENT_GONE)
                if nice:
                    try:
                        os.nice(nice)
                    except OSError:
                        pass  # runs at the reaper's priority rather than not at all
                # Python ignores these; the job gets the defaults. Handled ones reset on exec.
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, ())
                exec_error: OSError | None = None
                for path in candidates:
                    try:
                        if env is None:
                            os.execv(path, argv)
                        else:
                            os.execve(path, argv, env)
                    except OSError as exc:  # as execvp: the first error other than "not here"
                        if exec_error is None or exec_error.errno in (errno.ENOENT, errno.ENOTDIR):
                            exec_error = exc
                os.write(errors_w, str(exec_error.errno if exec_error else errno.ENOENT).encode())
            except OSError as exc:
                os.write(errors_w, str(exc.errno or 0).encode())
            finally:
                os._exit(_EXIT_CANNOT_START)
        os.close(errors_w)
        # No setpgid here (it would race the child's setsid): nothing signals the job's group
        # before the exec-error pipe below has read EOF, when the child has run setsid.
        with os.fdopen(errors_r, "rb") as errors:
            failure = errors.read()
        if failure:
            os.waitpid(pid, 0)
            if failure[:1] in (b"C", b"R"):
                where, _, number = failure[1:].decode().partition(":")
                code = int(number)
                what = "RLIMIT_AS" if failure[:1] == b"R" else cgroups[int(where)]
                raise CannotConfine(code, os.strerror(code), what)
            if failure[:1] == b"W":
                code = int(failure[2:])
                raise WorkdirDenied(code, os.strerror(code), cwd)
            code = int(failure)
            raise OSError(code, os.strerror(code), argv[0])
        self.job_pid = pid

    def supervise(self) -> int:
        """Run until the job's main process has exited; return its wait status."""
        while True:
            if not self.killed:
                self.watch_fence()
                if (
                    self.timeout_at is not None
                    and not self.timed_out
                    and not self.stopped
                    and time.monotonic() >= self.timeout_at
                    and not self.job_exited()
                ):
                    self.timed_out = True
                    self.stop_job(at_once=False)
                if not self.killed and self.kill_at is not None and time.monotonic() >= self.kill_at:
                    self.kill()
            status = self.reap()
            if status is not None:
                return status
            timeout = POLL_S
            now = time.monotonic()
            if not self.killed:
                if self.pause_at is not None and not self.paused:
                    timeout = min(timeout, self.pause_at - now)
                if self.fence_kill_at is not None and self.paused:
                    timeout = min(timeout, self.fence_kill_at - now)
                if self.kill_at is not None:
                    timeout = min(timeout, self.kill_at - now)
                if self.timeout_at is not None and not self.timed_out:
                    timeout = min(timeout, self.timeout_at - now)
            info = signal.sigtimedwait(_HANDLED, max(timeout, 0.0))
            if info is None:
                continue
            if info.si_signo == signal.SIGTERM and not self.killed:
                self.stop_job(at_once=False)
            elif info.si_signo == _KILL_SIGNAL:
                self.stop_job(at_once=True)

    def reap(self) -> int | None:
        """Reap exited children; once the job's main process has exited, sweep, then reap it.

        Returns the main process's wait status once it has been reaped, else None.
        """
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None or info.si_pid == 0:
                return None
            if info.si_pid == self.job_pid:
                # Unreaped, its id still names the group: sweep what is left of the job first.
                self.kill()
                return os.waitpid(self.job_pid, 0)[1]
            os.waitpid(info.si_pid, 0)  # an orphan re-parented to this subreaper

    def sweep(self) -> None:
        """Kill and reap every remaining descendant, round by round, until none is left."""
        while True:
            _kill_children()
            while True:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    break
            signal.sigtimedwait((signal.SIGCHLD,), _SWEEP_WAIT_S)


class WorkdirDenied(OSError):
    """The job's user could not enter its ``workdir`` (``filename``), which exists: the
    directory is entered after the privilege drop, so the job gets no access its user lacks."""


class CannotConfine(OSError):
    """The job's process could not join one of its cgroups (``filename``: its ``cgroup.procs``)
    or set its rlimit (``filename``: ``RLIMIT_AS``)."""


def _address_space(value: int) -> tuple[int, int, int]:
    """(resource, soft, hard) for ``RLIMIT_AS`` = ``value`` bytes, at most this process's hard
    limit (which only root may raise)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = value if hard == resource.RLIM_INFINITY else min(value, hard)
    return resource.RLIMIT_AS, limit, limit


def _parse_confine(field: str) -> tuple[tuple[str, ...], int | None, str | None, int | None]:
    """The cgroup.procs files, the address-space limit, the cgroup to be born in and the OOM
    score of a ``CONFINE`` field (:func:`reaper_argv`); a key it does not know is skipped."""
    cgroups: list[str] = []
    address_space: int | None = None
    clone_into: str | None = None
    oom_score_adj: int | None = None
    for line in field.split("\n") if field else ():
        key, _, value = line.partition("=")
        if key == "cgroup":
            cgroups.append(value)
        elif key == "as":
            address_space = int(value)
        elif key == "clone_into":
            clone_into = value
        elif key == "oom_score_adj":
            oom_score_adj = int(value)
    return tuple(cgroups), address_space, clone_into, oom_score_adj


_CLONE_INTO_CGROUP = 0x200000000
_SYS_CLONE3 = {"x86_64": 435, "aarch64": 435}
"""``clone3``'s number where this module uses it (the generic table's; other machines fork)."""


def _fork_into(cgroup_dir: str) -> int | None:
    """``os.fork()``, the child born in the cgroup v2 folder ``cgroup_dir``: ``clone3`` with
    ``CLONE_INTO_CGROUP`` (Linux 5.7; ``clone3(2)``), wrapped as ``os.fork`` wraps ``fork``
    (``PyOS_BeforeFork``, then ``PyOS_AfterFork_Child`` or ``_Parent``, the interpreter's lock
    held throughout). Returns the child's id in the parent and 0 in the child, or None when the
    kernel cannot (an older one, another machine, a folder that cannot be opened): the caller
    forks and the child joins the cgroup itself."""
    number = _SYS_CLONE3.get(os.uname().machine)
    if number is None:
        return None
    import ctypes  # loaded already for prctl

    try:
        fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        # struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack,
        # stack_size, tls, set_tid, set_tid_size, cgroup (all u64).
        args = (ctypes.c_uint64 * 11)(_CLONE_INTO_CGROUP, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, fd)
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held, as os.fork keeps it
        libc.syscall.restype = ctypes.c_long
        ctypes.pythonapi.PyOS_BeforeFork()
        pid = libc.syscall(number, args, ctypes.c_size_t(ctypes.sizeof(args)))
        if pid == 0:
            ctypes.pythonapi.PyOS_AfterFork_Child()
            return 0
        ctypes.pythonapi.PyOS_AfterFork_Parent()
        return pid if pid > 0 else None
    finally:
        os.close(fd)  # in both: the child has no use for it


def _initial_environ() -> dict[bytes, bytes] | None:
    """The environment this process was started with, as the agent passed it, or None where
    ``/proc`` cannot say (the job then gets :data:`os.environ`).

    Not :data:`os.environ`: the interpreter adds ``LC_CTYPE=C.UTF-8`` to it when it starts
    with no locale (PEP 538), which a clean environment has not; ``/proc/self/environ`` keeps
    the environment as it was at the exec.
    """
    try:
        with open("/proc/self/environ", "rb") as file:
            raw = file.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key] = value
    return env


def _load_libc() -> object:
    """libc for ``prctl``, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, not at the top: the agent imports this module too

    return ctypes.CDLL(None, use_errno=True)


def main(args: list[str]) -> int:
    """Run the reaper (see the module docstring); returns its exit status."""
    if len(args) < 13 or args[11] != "--" or bool(args[6]) != bool(args[7]):
        print(
            "usage: reaper.py PARENT_PID STOP_GRACE_S DEADLINE_FILE JOB_NICE STARTED_FD"
            " RUN_AS_UID RUN_AS_GID JOB_CWD TIMEOUT_S CONFINE -- ARGV...",
            file=sys.stderr,
        )
        return _EXIT_USAGE
    parent_pid, grace_s, deadline_path, argv = int(args[1]), float(args[2]), args[3], args[12:]
    cgroups, address_space, clone_into, oom_score_adj = _parse_confine(args[10])
    timeout_s = float(args[9]) if args[9] else None
    nice = int(args[4])
    started_fd = int(args[5]) if args[5] else -1
    run_as = (int(args[6]), int(args[7])) if args[6] else None
    job_cwd = args[8]
    if started_fd >= 0:
        os.set_inheritable(started_fd, False)  # the job must not hold it (it would look unstarted)
    # Blocked, then taken with sigtimedwait: no handler can run between fork and exec.
    signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # never inherit SIG_IGN (auto-reaping)
    libc = _load_libc()
    if libc is not None:
        if not deadline_path:
            # No deadman (a tool's run_job, outside an agent): nothing could take the job over,
            # nor stop it later, so it dies with its parent, as every job did before restarts
            # kept them (the parent-death signal fires when the forking thread ends).
            libc.prctl(_PR_SET_PDEATHSIG, _KILL_SIGNAL, 0, 0, 0)  # type: ignore[attr-defined]
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # type: ignore[attr-defined]
    if os.getppid() != parent_pid:
        # The agent died while it started this reaper: it wrote no record of it, so no agent
        # could take the job over. Start nothing.
        return _EXIT_AGENT_GONE
    reaper = _Reaper(grace_s=grace_s, deadline_path=deadline_path)
    reaper.read_deadline()
    held = reaper.hold_start() if reaper.fence_due() else "start"
    if held == "fenced":
        fenced = time.monotonic()
        _write_file(FENCED_AT_FILE, f"{fenced!r}\n")
        _write_file(REPORT_FILE, f"fenced_monotonic_s={fenced!r}\nended_monotonic_s={fenced!r}\n")
        return 128 + signal.SIGKILL
    if held == "stopped":
        _write_file(REPORT_FILE, f"stopped=1\nended_monotonic_s={time.monotonic()!r}\n")
        return 128 + signal.SIGTERM
    if os.path.isabs(job_cwd) and not os.path.isdir(job_cwd):
        _write_file(
            REPORT_FILE,
            f"error=workdir_not_found: {job_cwd!r} is not a directory on this worker\n"
            f"ended_monotonic_s={time.monotonic()!r}\n",
        )
        return _EXIT_CANNOT_START
    try:
        reaper.start(
            argv,
            libc,
            nice,
            run_as=run_as,
            cwd=job_cwd,
            env=_initial_environ(),
            cgroups=cgroups,
            address_space=None if address_space is None else _address_space(address_space),
            clone_into=clone_into,
            oom_score_adj=oom_score_adj,
        )
        if timeout_s is not None:
            reaper.timeout_at = time.monotonic() + timeout_s
    except CannotConfine as exc:
        _write_file(
            REPORT_FILE,
            f"error=resources_error: cannot confine {argv[0]!r} to its limits: {exc.filename}: "
            f"[Errno {exc.errno}] {exc.strerror}\nended_monotonic_s={time.monotonic()!r}\n",
        )
        return _EXIT_CANNOT_START
    except WorkdirDenied as exc:
        _write_file(
            REPORT_FILE,
            f"error=workdir_denied: the job's user cannot enter {exc.filename!r} on this worker "
            f"([Errno {exc.errno}] {exc.strerror})\nended_monotonic_s={time.monotonic()!r}\n",
        )
        return _EXIT_CANNOT_START
    except OSError as exc:
        _write_file(
            REPORT_FILE, f"error=cannot start {argv[0]!r}: {exc}\nended_monotonic_s={time.monotonic()!r}\n"
        )
        return _EXIT_CANNOT_START
    if started_fd >= 0:
        try:
            os.write(started_fd, STARTED_BYTE)
            os.close(started_fd)
        except OSError:
            pass  # the agent is gone or stopped listening: nothing to tell
    status = reaper.supervise()
    reaper.sweep()
    code = os.waitstatus_to_exitcode(status)
    lines = [f"exit_code={code}", f"ended_monotonic_s={time.monotonic()!r}", f"stopped={int(reaper.stopped)}"]
    if reaper.timed_out:
        lines.append(f"timed_out_after_s={timeout_s!r}")
    if reaper.fenced_monotonic_s is not None:
        lines.append(f"fenced_monotonic_s={reaper.fenced_monotonic_s!r}")
    _write_file(REPORT_FILE, "\n".join(lines) + "\n")
    return code if code >= 0 else 128 - code


def run() -> None:
    """The process entry point: :func:`main` on ``sys.argv``, then exit at once.

    ``os._exit`` skips the interpreter's shutdown (~2 ms): the report is written and closed,
    and nothing else needs finalizing.
    """
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
