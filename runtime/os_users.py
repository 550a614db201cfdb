"""System users that this process runs other programs as: the embedded PostgreSQL's
(:mod:`ops.launcher.pg_user`) and the agent's command jobs (:mod:`agent.runtimes`).

When this process is root, such a program runs as a system user of its own, created on first
use (:func:`resolve_user`); else as this process's user.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path
from typing import Any

import attrs

from runtime.errors import PermanentError


@attrs.frozen(kw_only=True)
class RunAs:
    """Who a program runs as."""

    uid: int
    gid: int
    name: str

    @property
    def is_other_user(self) -> bool:
        """True when the program runs as a user other than this process."""
        return self.uid != os.geteuid()

    def subprocess_kwargs(self) -> dict[str, Any]:
        """Extra :func:`subprocess.run` arguments that switch to this user."""
        if not self.is_other_user:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class UserNotCreated(PermanentError):
    """This process is root and the system user a program should run as neither exists nor
    could be created (``useradd`` failed or is missing), or it is root itself; the message
    says why."""


def resolve_user(user: str) -> RunAs:
    """The user a program runs as: the system user ``user`` when we are root (created as a
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


def resolve_unprivileged_user(user: str) -> RunAs:
    """:func:`resolve_user`, refusing a user that is root (uid 0) or in group 0.

    Raises:
        UserNotCreated: we are root and ``user`` could not be created, or it is uid or gid 0.
    """
    run_as = resolve_user(user)
    if os.geteuid() == 0 and (run_as.uid == 0 or run_as.gid == 0):
        raise UserNotCreated(
            f"user {user!r} is uid {run_as.uid} gid {run_as.gid}: jobs never run as root or group 0"
        )
    return run_as


def chown(path: Path, run_as: RunAs) -> None:
    """Give ``path`` (not what a symlink points to) to ``run_as``, if it is not its already."""
    info = path.lstat()
    if (info.st_uid, info.st_gid) != (run_as.uid, run_as.gid):
        os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)


def add_mode(path: Path, bits: int) -> None:
    """chmod ``path`` to add ``bits``, only if some are missing."""
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(stat.S_IMODE(mode) | bits)


def ensure_traversable(directory: Path) -> None:
    """Add g+x,o+x to ``directory`` and each of its parents, up to / (pass through, not list)."""
    for path in (directory, *directory.parents):
        add_mode(path, stat.S_IXGRP | stat.S_IXOTH)
