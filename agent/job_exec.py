"""A command job's process between the reaper's fork and the job's exec: its cgroups, rlimit, OOM
score, session, working directory and user, then the exec (:func:`start_job`). Imports only the
standard library (the reaper's start cost)."""

from __future__ import annotations

import errno
import os

from agent.deadman import EXIT_AGENT_GONE, EXIT_CANNOT_START, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG

try:
    import _signal as signal  # ``signal`` without the enum wrappers: ~4 ms less start cost
except ImportError:  # pragma: no cover - not CPython
    import signal  # type: ignore[no-redef]


class WorkdirDenied(OSError):
    """The job's user could not enter its ``workdir`` (``filename``), which exists: the
    directory is entered after the privilege drop, so the job gets no access its user lacks."""


class CannotConfine(OSError):
    """The job's process could not join one of its cgroups (``filename``: its ``cgroup.procs``)
    or set its rlimit (``filename``: ``RLIMIT_AS``)."""


def address_space_limit(value: int) -> tuple[int, int, int]:
    """(resource, soft, hard) for ``RLIMIT_AS`` = ``value`` bytes, at most this process's hard
    limit (which only root may raise)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = value if hard == resource.RLIM_INFINITY else min(value, hard)
    return resource.RLIMIT_AS, limit, limit


_CLONE_INTO_CGROUP = 0x200000000
_SYS_CLONE3 = {"x86_64": 435, "aarch64": 435}
"""``clone3``'s number where this module uses it (the generic table's; other machines fork)."""


def fork_into(cgroup_dir: str) -> int | None:
    """``os.fork()``, the child born in the cgroup v2 folder ``cgroup_dir``: ``clone3`` with
    ``CLONE_INTO_CGROUP`` (Linux 5.7), wrapped as ``os.fork`` wraps ``fork``. Returns the
    child's id in the parent and 0 in the child, or None when the kernel cannot: the caller
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


def initial_environ() -> dict[bytes, bytes] | None:
    """The environment this process was started with, as the agent passed it, or None where
    ``/proc`` cannot say (the job then gets :data:`os.environ`, to which the interpreter adds
    ``LC_CTYPE=C.UTF-8`` when it starts with no locale: PEP 538)."""
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


def _write_once(path: str, data: bytes) -> None:
    """Write ``data`` to the kernel file ``path`` in one ``write``."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def start_job(
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
) -> int:
    """Fork and exec the job in a session and process group of its own, ``nice`` lower in
    priority, in ``cwd`` (empty: the reaper's), as ``run_as`` (uid, gid; None: the reaper's
    user), in the cgroups whose ``cgroup.procs`` files ``cgroups`` lists, with the rlimit
    ``address_space`` (resource, soft, hard; None: none), with ``oom_score_adj`` (None:
    the reaper's).

    The job's process joins its cgroups first of all, while it still has the reaper's rights,
    and sets the rlimit; a failure there keeps the job from starting (it never runs
    unconfined). With ``clone_into`` (cgroup v2) the process is born in that cgroup instead
    (:func:`fork_into`), where the kernel can: a migration waits for an RCU grace period (some
    13 ms on the development machine), a birth there does not.

    The privilege drop happens in the child, after ``chdir`` into a relative ``cwd`` and before
    the exec: ``setgroups([])``, ``setgid``, ``setuid``; an absolute ``cwd`` (the job's
    ``workdir``) is entered after it, with the job user's rights. The parent-death signal is set
    after it (a change of credentials clears it), and with ``run_as`` no_new_privs (exec gains
    no rights: setuid and setgid files and file capabilities do nothing). Any failure there
    keeps the job from starting. The job gets ``env`` (None: this process's environment).
    Returns its process id.

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
    forked = None if clone_into is None else fork_into(clone_into)
    born_inside = forked is not None
    pid = os.fork() if forked is None else forked
    if pid == 0:  # the job; nothing here may return
        try:
            os.close(errors_r)
            for index, procs in enumerate(() if born_inside else cgroups):
                try:
                    _write_once(procs, b"0")  # 0: the writing process
                except OSError as exc:
                    os.write(errors_w, f"C{index}:{exc.errno or 0}".encode())
                    os._exit(EXIT_CANNOT_START)
            if address_space is not None:
                try:
                    assert setrlimit is not None
                    setrlimit(address_space[0], address_space[1:])
                except (OSError, ValueError) as exc:
                    os.write(errors_w, f"R:{getattr(exc, 'errno', 0) or 0}".encode())
                    os._exit(EXIT_CANNOT_START)
            if oom_score_adj is not None:
                # Before the privilege drop: a root reaper's write also sets the job's
                # oom_score_adj_min, so the job user cannot lower it again. Raising never
                # needs a right; where /proc lacks the file the job keeps the reaper's.
                try:
                    _write_once("/proc/self/oom_score_adj", str(oom_score_adj).encode())
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
                    os._exit(EXIT_CANNOT_START)
                if enter_as_job_user:  # a workdir the user named: with the job user's rights
                    try:
                        os.chdir(cwd)
                    except OSError as exc:
                        os.write(errors_w, f"W:{exc.errno or 0}".encode())
                        os._exit(EXIT_CANNOT_START)
            if libc is not None:
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # type: ignore[attr-defined]
                # A job of a user of its own gains no rights by exec: a setuid or setgid file
                # (one a job of the same uid left earlier) or file capabilities do nothing.
                if run_as is not None and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # type: ignore[attr-defined]
                    os._exit(EXIT_CANNOT_START)
            if os.getppid() != reaper_pid:
                os._exit(EXIT_AGENT_GONE)
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
            os._exit(EXIT_CANNOT_START)
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
    return pid
