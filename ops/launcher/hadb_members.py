"""The HA PostgreSQL pair's members from outside (:mod:`ops.launcher.hadb`): its errors, what
Patroni's REST API says of them (:class:`Member`, :func:`members_of`), whether a server takes
writes, what the pair needs installed (:func:`missing_tools`), and processes waited out."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil

from ops.launcher.hadb_config import PgMember
from ops.launcher.pg_secrets import PG_SUPERUSER
from ops.launcher.pg_tools import ask
from ops.launcher.state import LISTEN_HOST
from runtime.errors import PermanentError, TemporaryError

__all__ = [
    "INSTALL_HINT",
    "HaDatabaseError",
    "HaStartError",
    "HaTimeout",
    "HaUnavailable",
    "Killed",
    "Member",
    "NotRunning",
    "Promoted",
    "accepts_read_write",
    "members_of",
    "missing_tools",
    "rest_get_any",
    "rest_status",
    "wait_gone",
]

HTTP_TIMEOUT_S = 1.0

INSTALL_HINT = (
    "install etcd with `apt-get install -y etcd-server` and Patroni with "
    "`pip install -e '.[ha]'` (patroni[etcd3] and psycopg[binary])"
)


class HaDatabaseError(PermanentError):
    """Base class for errors of the HA PostgreSQL pair."""


class HaUnavailable(HaDatabaseError):
    """What the pair runs is not installed; the message says what and how to install it."""


class HaStartError(HaDatabaseError):
    """A process of the pair could not be started, or the pair was not ready in time; the
    message names the process and ends with the last lines of its log."""


class HaTimeout(HaDatabaseError):
    """A wait (for a new primary, for a member to rejoin) ran out; the message says what was
    seen last."""


class NotRunning(TemporaryError):
    """No Patroni REST API answered."""


@attrs.frozen(kw_only=True)
class Member:
    """One Patroni member as its REST API's ``GET /cluster`` shows it."""

    name: str
    port: int
    """Its PostgreSQL port on 127.0.0.1."""
    role: str
    """Patroni's role: ``leader`` (the primary), ``sync_standby``, ``replica``..."""
    state: str
    """Patroni's state: ``running``, ``streaming``, ``starting``, ``stopped``..."""
    lag_bytes: int | None
    """Replication lag in bytes behind the primary; None for the primary or when unknown."""


@attrs.frozen(kw_only=True)
class Killed:
    """What :meth:`HaPostgres.kill_primary` killed."""

    name: str
    """The member that was the primary."""
    pids: tuple[int, ...]
    at_monotonic_s: float
    """:func:`time.monotonic` just after the kill."""


@attrs.frozen(kw_only=True)
class Promoted:
    """What :meth:`HaPostgres.wait_for_new_primary` saw."""

    name: str
    port: int
    after_s: float
    """Seconds from the kill to the new primary answering Patroni's ``GET /primary`` with 200."""


def missing_tools() -> list[str]:
    """What the pair needs and this machine lacks: etcd, Patroni, its PostgreSQL driver and
    its etcd client."""
    missing = []
    if etcd_binary() is None:
        missing.append("etcd (the etcd-server package)")
    if importlib.util.find_spec("patroni") is None:
        missing.append("patroni")
    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is None:
        missing.append("a PostgreSQL driver for Patroni (psycopg[binary] or psycopg2-binary)")
    if importlib.util.find_spec("etcd") is None:
        missing.append("Patroni's etcd client (python-etcd, from patroni[etcd3])")
    return missing


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next(
        (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None
    )


def members_of(body: dict[str, Any]) -> list[Member]:
    """The members a Patroni REST API's ``GET /cluster`` lists."""
    return [
        Member(
            name=str(entry.get("name")),
            port=int(entry.get("port", 0)),
            role=str(entry.get("role")),
            state=str(entry.get("state")),
            lag_bytes=lag if isinstance(lag := entry.get("lag"), int) else None,
        )
        for entry in body.get("members", [])
    ]


def rest_get_any(members: Sequence[PgMember], path: str) -> dict[str, Any]:
    """The JSON body of ``GET path`` from the first REST API of ``members`` that answers;
    NotRunning where none does."""
    errors = []
    for member in members:
        url = f"http://{LISTEN_HOST}:{member.rest_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                body: dict[str, Any] = json.loads(response.read())
                return body
        except (OSError, ValueError) as exc:
            errors.append(f"{member.name}: {exc}")
    raise NotRunning("; ".join(errors) or "no members")


def rest_status(member: PgMember, path: str) -> int | None:
    """The HTTP status of ``GET path`` on ``member``'s REST API, or None without an answer."""
    url = f"http://{LISTEN_HOST}:{member.rest_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def accepts_read_write(member: PgMember, *, bin_path: Path, password_file: Path) -> bool:
    """Whether ``member``'s server accepts a client that wants a read-write session."""
    conninfo = (
        f"host={LISTEN_HOST} port={member.pg_port} dbname=postgres user={PG_SUPERUSER} "
        f"passfile={password_file} target_session_attrs=read-write connect_timeout=2"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    completed = ask(
        [str(bin_path / "psql"), "-X", "-A", "-t", "-c", "select 1", conninfo], timeout_s=5, env=env
    )
    return completed is not None and completed.returncode == 0


def wait_gone(processes: Sequence[psutil.Process], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``processes`` to be gone; whether they all are. A
    zombie counts as gone (another process may be its parent, which :func:`psutil.wait_procs`
    would wait for in vain)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = []
        for process in processes:
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
