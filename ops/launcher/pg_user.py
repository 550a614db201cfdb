"""The operating-system side of running the embedded PostgreSQL (:mod:`ops.launcher.pg`) as another user.

PostgreSQL refuses to run as root. When this process is root, :mod:`ops.launcher.pg` runs the server's
binaries as a system user of their own (:func:`resolve_user`, which creates it on first use)
that owns the server's files (:func:`chown`); the directories above them and the wheel's
install tree are opened to other users just enough for that user to reach them
(:func:`ensure_traversable`, :func:`ensure_install_readable`). When this process is not root,
the binaries run as it, and none of this changes anything on disk.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

from runtime.os_users import RunAs, UserNotCreated, chown, ensure_traversable, resolve_user
from runtime.os_users import add_mode as _add_mode

__all__ = [
    "RunAs",
    "UserNotCreated",
    "chown",
    "ensure_install_readable",
    "ensure_traversable",
    "resolve_user",
]


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
