"""The per-job supervisor ("reaper") of a command job: a small process of its own that starts the
job, outlives the agent, pauses and kills the job at the fence deadlines, forwards stops and
reports the job's end: :func:`reaper_argv` (its command line) and :func:`run` (its entry point).

It imports nothing but the standard library and the agent modules it runs on (deadman.py,
proctree.py, job_exec.py). docs/design.md, "The reaper: a job's deadman switch".
"""

from __future__ import annotations

import os
import sys
import time

from agent import proctree
from agent.deadman import (
    EXIT_AGENT_GONE,
    KILL_SIGNAL,
    NOTICE_SIGNAL,
    POLL_S,
    PR_SET_PDEATHSIG,
    Deadman,
    cannot_start,
    exit_with,
    load_libc,
    refuse_fenced,
    tell_started,
    write_report,
)
from agent.job_exec import CannotConfine, WorkdirDenied, address_space_limit, initial_environ, start_job

try:
    import _signal as signal  # ``signal`` without the enum wrappers: ~4 ms less start cost
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]

_PR_SET_CHILD_SUBREAPER = 36
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
            exits without starting the job.
        fence_deadline_path: the agent's fence-deadline file, or None for no deadman.
        started_fd: the reaper's file descriptor of the write end of the start pipe (the
            caller passes it on), or None for none.
        run_as_uid, run_as_gid: the user and group the job runs as (both or neither, no
            supplementary groups); None: the reaper's.
        job_cwd: the job's working directory: relative, in the job's folder, entered before the
            privilege drop; or absolute, a job's ``workdir``, entered after it (else the report's
            error says ``workdir_not_found`` or ``workdir_denied``); empty: the reaper's.
        timeout_s: once the job has run this long (monotonic clock), the reaper stops it as the
            agent's stop would and reports ``timed_out_after_s``; None: no limit.
        cgroup_procs, address_space_bytes, clone_into: the job's confinement
            (:class:`agent.resources.Confinement`); a failure keeps the job from starting
            (``resources_error``).
        oom_score_adj: the job's ``oom_score_adj`` (-1000..1000, :mod:`runtime.oom`); None: the
            reaper's.

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


def _parse_confine(field: str) -> tuple[tuple[str, ...], int | None, str | None, int | None]:
    """The cgroup.procs files, the address-space limit, the cgroup to be born in and the OOM
    score of a ``CONFINE`` field (:func:`reaper_argv`); a key it does not know is skipped."""
    pairs = [line.partition("=")[::2] for line in field.split("\n")] if field else []
    last = dict(pairs)
    number = {key: int(last[key]) if key in last else None for key in ("as", "oom_score_adj")}
    cgroups = tuple(value for key, value in pairs if key == "cgroup")
    return cgroups, number["as"], last.get("clone_into"), number["oom_score_adj"]


class _Reaper(Deadman):
    handled = (signal.SIGCHLD, signal.SIGTERM, KILL_SIGNAL, NOTICE_SIGNAL)

    def __init__(self, *, grace_s: float, deadline_path: str) -> None:
        super().__init__(grace_s=grace_s, deadline_path=deadline_path)
        self.job_pid = 0
        self.stopped_pids: list[int] = []
        """The processes this pause stopped (and a resume continues)."""

    def kill(self) -> None:
        """SIGKILL the job's group and every descendant now (the job has not been reaped)."""
        proctree.kill_group(self.job_pid, signal.SIGKILL)
        proctree.kill_children()
        self.killed = True

    def term(self) -> None:
        proctree.kill_group(self.job_pid, signal.SIGTERM)

    def job_exited(self) -> bool:
        """True once the job's main process has exited on its own or otherwise (it is not
        reaped here: its id stays this process's child until :meth:`reap`)."""
        try:
            info = os.waitid(os.P_PID, self.job_pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None and info.si_pid == self.job_pid

    def pause(self) -> None:
        """Hold the job: SIGSTOP to every process of its tree, whatever group or session each is
        in, round after round until none of them runs (a process may fork before its stop takes
        effect), and record when. A process the job had stopped itself is left as it is, and
        not resumed later."""
        for _ in range(_PAUSE_ROUNDS):
            running = False
            for pid in proctree.descendants():
                state = proctree.state(pid)
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
        self.record_fenced()

    def unpause(self) -> None:
        for pid in self.stopped_pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        self.stopped_pids = []

    def hold_start(self) -> str:
        """Before the job has started, wait while the pause deadline has passed, as
        :meth:`watch_fence` holds a started one. Returns ``"start"`` once the agent moved the
        deadlines on and asked for no stop (a pending stop wins), ``"fenced"`` at the kill
        deadline (at once when the file could not be read), ``"stopped"`` when a stop (SIGTERM)
        or a kill (SIGUSR1) came first."""
        while self.fence_due():
            if self.kill_due() or self.fence_kill_at is None:
                return "fenced"
            timeout = min(POLL_S, self.fence_kill_at - time.monotonic())
            info = signal.sigtimedwait(self.handled, max(timeout, 0.0))
            if info is not None and info.si_signo in (signal.SIGTERM, KILL_SIGNAL, NOTICE_SIGNAL):
                return "stopped"
        if self.stop_pending():
            return "stopped"
        return "start"

    def reap(self) -> int | None:
        """Reap exited children; once the job's main process has exited, sweep, then reap it and
        return its wait status (else None)."""
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
            proctree.kill_children()
            while True:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    return
                if pid == 0:
                    break
            signal.sigtimedwait((signal.SIGCHLD,), _SWEEP_WAIT_S)


def main(args: list[str]) -> int:
    """Run the reaper (docs/design.md, "The reaper"); returns its exit status."""
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
    signal.pthread_sigmask(signal.SIG_BLOCK, _Reaper.handled)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # never inherit SIG_IGN (auto-reaping)
    libc = load_libc()
    if libc is not None:
        if not deadline_path:
            # No deadman (a tool's run_job, outside an agent): nothing could take the job over,
            # nor stop it later, so it dies with its parent.
            libc.prctl(PR_SET_PDEATHSIG, KILL_SIGNAL, 0, 0, 0)  # type: ignore[attr-defined]
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # type: ignore[attr-defined]
    if os.getppid() != parent_pid:
        # The agent died while it started this reaper: it wrote no record of it, so no agent
        # could take the job over. Start nothing.
        return EXIT_AGENT_GONE
    reaper = _Reaper(grace_s=grace_s, deadline_path=deadline_path)
    reaper.read_deadline()
    held = reaper.hold_start() if reaper.fence_due() else "start"
    if held == "fenced":
        return refuse_fenced()
    if held == "stopped":
        write_report(stopped=1, ended_monotonic_s=repr(time.monotonic()))
        return 128 + signal.SIGTERM
    if os.path.isabs(job_cwd) and not os.path.isdir(job_cwd):
        return cannot_start(f"workdir_not_found: {job_cwd!r} is not a directory on this worker")
    try:
        reaper.job_pid = start_job(
            argv,
            libc,
            nice,
            run_as=run_as,
            cwd=job_cwd,
            env=initial_environ(),
            cgroups=cgroups,
            address_space=None if address_space is None else address_space_limit(address_space),
            clone_into=clone_into,
            oom_score_adj=oom_score_adj,
        )
        if timeout_s is not None:
            reaper.timeout_at = time.monotonic() + timeout_s
    except CannotConfine as exc:
        return cannot_start(
            f"resources_error: cannot confine {argv[0]!r} to its limits: {exc.filename}: "
            f"[Errno {exc.errno}] {exc.strerror}"
        )
    except WorkdirDenied as exc:
        return cannot_start(
            f"workdir_denied: the job's user cannot enter {exc.filename!r} on this worker "
            f"([Errno {exc.errno}] {exc.strerror})"
        )
    except (FileNotFoundError, NotADirectoryError) as exc:
        # The reason no_retry_on and the health judgement read (runtime/jobs.py, FAILURE_REASONS).
        return cannot_start(f"command_not_found: cannot start {argv[0]!r}: {exc}")
    except OSError as exc:
        return cannot_start(f"cannot start {argv[0]!r}: {exc}")
    tell_started(started_fd)
    status = reaper.supervise()
    reaper.sweep()
    code = os.waitstatus_to_exitcode(status)
    write_report(
        exit_code=code,
        ended_monotonic_s=repr(time.monotonic()),
        stopped=int(reaper.stopped),
        timed_out_after_s=repr(timeout_s) if reaper.timed_out else None,
        fenced_monotonic_s=None if reaper.fenced_monotonic_s is None else repr(reaper.fenced_monotonic_s),
    )
    return code if code >= 0 else 128 - code


def run() -> None:
    """The process entry point: :func:`main` on ``sys.argv``, then exit at once."""
    exit_with(main)


if __name__ == "__main__":
    run()
