"""The modes of a worker's work folder (:func:`close_work_folder`): a job of another uid may
pass through it to its own folder, and neither list it nor read what names other jobs.
docs/tenancy.md, "What a job can see"."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PASS_THROUGH_MODE = 0o711
"""The work folder and its ``jobs/``: the agent's; every user may enter them (a job reaches its
own folder by path), none but the agent may list them."""
PRIVATE_FILE_MODE = 0o600
"""Every file the agent keeps in the work folder (``agent.jsonl``, ``agent.lock``,
``uid-block``, ``fence_deadline``) and every ``job.record``: the agent's alone."""
JOB_FOLDER_MASK = 0o710
"""The most a job folder keeps of its mode: the agent's, entered by its job's gid (0710, set
when the job starts), never by others."""
JOBS_SUBDIR = "jobs"
"""In the work folder: every job's folder, ``<job>-<assignment>``."""


def create_private(path: str | os.PathLike[str], flags: int) -> int:
    """Open ``path`` with ``flags`` (``O_CREAT`` added), created mode :data:`PRIVATE_FILE_MODE`
    whatever the umask, and made so if it existed with another; returns the descriptor
    (close-on-exec).

    Raises:
        OSError: it cannot be opened or its mode set.
    """
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` (UTF-8), mode :data:`PRIVATE_FILE_MODE`.

    Raises:
        OSError: it cannot be written.
    """
    tmp = path.with_name(f"{path.name}.tmp")
    fd = create_private(tmp, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(tmp, path)


def _narrow(path: str, mask: int) -> None:
    """chmod ``path`` (never a symlink's target) to its mode and ``mask``, if that takes bits."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if not stat.S_ISLNK(info.st_mode) and stat.S_IMODE(info.st_mode) & ~mask:
            os.chmod(path, stat.S_IMODE(info.st_mode) & mask)


def close_work_folder(work_dir: Path, *, record_file: str = "job.record") -> None:
    """Create ``work_dir`` and its ``jobs/`` (mode :data:`PASS_THROUGH_MODE`), and close what
    an earlier agent left open there (one upgraded in place): the files directly in it become
    :data:`PRIVATE_FILE_MODE`, each job folder keeps at most :data:`JOB_FOLDER_MASK` and its
    ``record_file`` :data:`PRIVATE_FILE_MODE`. Blocking: one listing of each folder.

    Raises:
        OSError: ``work_dir`` or ``jobs/`` cannot be created or their modes set.
    """
    jobs_dir = work_dir / JOBS_SUBDIR
    jobs_dir.mkdir(mode=PASS_THROUGH_MODE, parents=True, exist_ok=True)
    for folder in (work_dir, jobs_dir):
        if stat.S_IMODE(folder.stat().st_mode) != PASS_THROUGH_MODE:
            folder.chmod(PASS_THROUGH_MODE)
    with os.scandir(work_dir) as entries:
        files = [entry.path for entry in entries if entry.is_file(follow_symlinks=False)]
    for path in files:
        _narrow(path, PRIVATE_FILE_MODE)
    with os.scandir(jobs_dir) as entries:
        folders = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
    for path in folders:
        _narrow(path, JOB_FOLDER_MASK)
        _narrow(os.path.join(path, record_file), PRIVATE_FILE_MODE)
