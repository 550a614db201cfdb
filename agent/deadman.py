"""The deadman switch of a job's supervisor process, and the files it shares with the agent.

A command job's reaper (:mod:`agent.reaper`) and a container job's supervisor
(:mod:`agent.container_supervisor`) keep one protocol with the agent (the fence-deadline file, the
start pipe, :data:`FENCED_AT_FILE` and the report) and run one deadline loop,
:meth:`Deadman.supervise`: docs/design.md, "The reaper: a job's deadman switch".

Imports only the standard library: every reaper process imports it on its way to its job.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # not typing's: the reaper does not import typing (its start cost)
if TYPE_CHECKING:
    from collections.abc import Callable

try:
    import _signal as signal  # ``signal`` without the enum wrappers: ~4 ms less start cost
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]

POLL_S = 0.05
"""Longest time between two reads of the fence-deadline file, in seconds (a supervisor also
wakes exactly at the deadline it read last)."""
FENCED_AT_FILE = "reaper.fenced_at"
"""In the job's folder: the time (``time.monotonic()``) at which the supervisor paused the job,
or killed it, because the fence deadline had passed."""
REPORT_FILE = "reaper.report"
"""In the job's folder: how the job ended, ``key=value`` lines (see :func:`read_report`)."""
STOP_GRACE_FILE = "reaper.stop_grace"
"""In the job's folder: the grace of a stop with a grace of its own (:data:`NOTICE_SIGNAL`), in
seconds; the agent writes it (:func:`write_stop_grace`) before it signals."""
STARTED_BYTE = b"1"
"""What a supervisor writes to its start pipe once the job has started."""
KILL_SIGNAL = signal.SIGUSR1
"""The agent's "kill the job now" (a stop past its grace, a cancel while paused), and the
parent-death signal of a supervisor that dies with its agent."""
NOTICE_SIGNAL = signal.SIGUSR2
"""The agent's "stop the job with the grace in :data:`STOP_GRACE_FILE`" (a preemption's): as
SIGTERM, but the job is killed that long after, not after the supervisor's own grace."""
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
EXIT_CANNOT_START = 127
EXIT_AGENT_GONE = 125


def write_fence_deadline(
    path: str | os.PathLike[str], pause_at_s: float, kill_at_s: float | None = None
) -> None:
    """Atomically replace the fence-deadline file: jobs pause at ``pause_at_s`` and are killed
    at ``kill_at_s`` (both ``time.monotonic()`` seconds; None or not later than ``pause_at_s``:
    killed at ``pause_at_s``, with no pause). Raises OSError when it cannot be written."""
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    kill_at_s = pause_at_s if kill_at_s is None else max(kill_at_s, pause_at_s)
    # The agent's and its (root) reapers' alone, whatever the umask.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    with open(fd, "w", encoding="ascii") as file:
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
    """The supervisor's report in ``job_dir``; empty when there is none (it was killed).

    Keys: ``exit_code`` (int; negative ``-N`` for signal N), ``ended_monotonic_s`` (float,
    ``time.monotonic()``, when the job and everything it started were gone), ``stopped`` (``1``
    when a stop, a kill at the fence deadline included, reached the job before its main process
    exited; ``0`` when it ended on its own, also if a stop came after; without ``exit_code``: a
    stop came while its start was held at the fence deadline, and the job never started),
    ``fenced_monotonic_s`` (float, ``time.monotonic()``, only when the supervisor killed the job
    at the fence deadline; the job was not started when ``exit_code`` is missing),
    ``timed_out_after_s`` (float, only when the reaper stopped the job because its
    ``timeout_s`` ran out), ``error`` (the job could not be started); a container's also
    ``reason``, ``reason_detail`` and ``removed``. Values are strings.
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
    """Remove a previous run's supervisor files from ``job_dir`` (missing ones are fine)."""
    for name in (REPORT_FILE, FENCED_AT_FILE, STOP_GRACE_FILE):
        try:
            os.unlink(os.path.join(job_dir, name))
        except FileNotFoundError:
            pass


def write_stop_grace(job_dir: str | os.PathLike[str], grace_s: float) -> None:
    """Atomically write the grace of the next :data:`NOTICE_SIGNAL` stop, in seconds, into
    ``job_dir``. Raises OSError when it cannot be written."""
    path = os.path.join(job_dir, STOP_GRACE_FILE)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as file:
        file.write(f"{float(grace_s)!r}\n")
    os.replace(tmp, path)


def read_stop_grace() -> float | None:
    """The grace in :data:`STOP_GRACE_FILE` (in the working directory, the job's folder), in
    seconds; None when it is missing, unreadable, negative or not finite."""
    try:
        with open(STOP_GRACE_FILE, encoding="ascii") as file:
            value = float(file.read())
    except (OSError, ValueError):
        return None
    return value if 0.0 <= value < float("inf") else None


def write_file(name: str, text: str) -> None:
    """Atomically replace the file ``name`` (in the working directory, the job's folder)."""
    tmp = f"{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(tmp, name)


def write_report(**values: object) -> None:
    """Write the report (``key=value`` lines, :func:`read_report`); a value of None is left
    out, newlines in one become spaces."""
    lines = [f"{k}={str(v).replace(chr(10), ' ')}" for k, v in values.items() if v is not None]
    write_file(REPORT_FILE, "\n".join(lines) + "\n")


def cannot_start(error: str) -> int:
    """Report a job that could not be started, saying why; returns the exit status."""
    write_report(error=error, ended_monotonic_s=repr(time.monotonic()))
    return EXIT_CANNOT_START


def refuse_fenced() -> int:
    """Report a job not started because the fence deadline had passed; returns the exit
    status (that of a SIGKILL)."""
    fenced = time.monotonic()
    write_file(FENCED_AT_FILE, f"{fenced!r}\n")
    write_report(fenced_monotonic_s=repr(fenced), ended_monotonic_s=repr(fenced))
    return 128 + signal.SIGKILL


def tell_started(started_fd: int) -> None:
    """Write :data:`STARTED_BYTE` on the start pipe and close it (-1: none); an agent that is
    gone or stopped listening is told nothing."""
    if started_fd >= 0:
        try:
            os.write(started_fd, STARTED_BYTE)
            os.close(started_fd)
        except OSError:
            pass


def load_libc() -> object:
    """libc for ``prctl``, or None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, not at the top: the agent imports this module too

    return ctypes.CDLL(None, use_errno=True)


def exit_with(main: Callable[[list[str]], int]) -> None:
    """Run ``main`` on ``sys.argv``, then exit at once with its status: ``os._exit`` skips the
    interpreter's shutdown (~2 ms, and a container supervisor's daemon threads)."""
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Deadman:
    """A job's supervisor's deadlines: the fence's (read from the agent's file), a graceful
    stop's and the job's timeout, applied by one loop (:meth:`supervise`). A subclass says how
    its job is killed, signalled, paused, resumed and reaped."""

    handled: tuple[int, ...] = (signal.SIGTERM, KILL_SIGNAL, NOTICE_SIGNAL)
    """The signals :meth:`supervise` takes (blocked in the process, read with sigtimedwait)."""

    def __init__(self, *, grace_s: float, deadline_path: str) -> None:
        self.grace_s = grace_s
        self.deadline_path = deadline_path
        self.pause_at: float | None = None
        """Monotonic time the job pauses at (the fence deadline); None: no deadman."""
        self.fence_kill_at: float | None = None
        """Monotonic time a paused job is killed at (the end of the outage grace)."""
        self.kill_at: float | None = None
        """Monotonic time of the SIGKILL that ends a graceful stop (a later stop may bring it
        forward, never put it off)."""
        self.killed = False
        self.timeout_at: float | None = None
        """Monotonic time the job's ``timeout_s`` runs out (None: no limit)."""
        self.timed_out = False
        """True once the job was stopped because its timeout ran out."""
        self.stopped = False
        """True once a stop (the agent's, its death's, the fence deadline's) reached the job
        before it had ended."""
        self.paused = False
        """True while the job is held because the fence deadline passed."""
        self.fenced_monotonic_s: float | None = None
        """While paused, and once killed at the fence: when the job stopped doing work
        (the pause, or the kill when there was none), ``time.monotonic()``."""

    def kill(self) -> None:
        """Kill the job now, and set ``killed``."""
        raise NotImplementedError

    def term(self) -> None:
        """Ask the job to stop (SIGTERM)."""
        raise NotImplementedError

    def pause(self) -> None:
        """Hold the job at the fence deadline; set ``paused`` and record the time
        (:meth:`record_fenced`)."""
        raise NotImplementedError

    def unpause(self) -> None:
        """Let the paused job run again."""
        raise NotImplementedError

    def job_exited(self) -> bool:
        """True once the job has ended (on its own or otherwise)."""
        raise NotImplementedError

    def reap(self) -> int | None:
        """The job's wait status once it has ended (and what it left is gone), else None."""
        raise NotImplementedError

    def ended_early(self) -> bool:
        """True when the deadlines are no longer to be watched although :meth:`reap` has not
        run yet (a container whose end another thread saw)."""
        return False

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

    def record_fenced(self) -> None:
        """Note now as the time the job stopped doing work, in :data:`FENCED_AT_FILE` too."""
        self.fenced_monotonic_s = time.monotonic()
        write_file(FENCED_AT_FILE, f"{self.fenced_monotonic_s!r}\n")

    def stop_pending(self) -> bool:
        """True when a stop or a kill is waiting to be read (signalled before a resume)."""
        pending = signal.sigpending()
        return signal.SIGTERM in pending or KILL_SIGNAL in pending or NOTICE_SIGNAL in pending

    def stop_job(self, *, at_once: bool, grace_s: float | None = None) -> None:
        """Stop the job (SIGTERM, then a kill ``grace_s`` seconds later, None: after the
        supervisor's own grace; or a kill ``at_once``, and always at once while it is paused)
        unless it has already ended: then its end stays its own. A job already being stopped
        gets no second SIGTERM; its kill comes at the earlier of the two times."""
        if self.job_exited():
            return
        self.stopped = True
        kill_at = time.monotonic() + (self.grace_s if grace_s is None else grace_s)
        if at_once or self.paused:
            self.kill()
        elif self.kill_at is None:
            self.term()
            self.kill_at = kill_at
        else:
            self.kill_at = min(self.kill_at, kill_at)

    def resume(self) -> None:
        """Let a paused job run again (the agent moved the deadline on). A stop the agent asked
        for before it moved the deadline is still pending here: it wins."""
        if self.stop_pending():
            self.stop_job(at_once=True)
            return
        try:
            os.unlink(FENCED_AT_FILE)
        except FileNotFoundError:
            pass
        self.paused = False
        self.fenced_monotonic_s = None
        self.unpause()

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
                self.record_fenced()
            else:
                self.pause()

    def watch_deadlines(self) -> None:
        """Apply every deadline due now: the fence's, the timeout's, a graceful stop's."""
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

    def next_wait_s(self) -> float:
        """How long to wait for a signal: until the next deadline, at most :data:`POLL_S`."""
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
        return max(timeout, 0.0)

    def supervise(self) -> int:
        """Run until the job has ended; return its wait status (:meth:`reap`)."""
        while True:
            if not self.killed and not self.ended_early():
                self.watch_deadlines()
            status = self.reap()
            if status is not None:
                return status
            info = signal.sigtimedwait(self.handled, self.next_wait_s())
            if info is None:
                continue
            if info.si_signo == signal.SIGTERM and not self.killed:
                self.stop_job(at_once=False)
            elif info.si_signo == NOTICE_SIGNAL and not self.killed:
                self.stop_job(at_once=False, grace_s=read_stop_grace())
            elif info.si_signo == KILL_SIGNAL:
                self.stop_job(at_once=True)
