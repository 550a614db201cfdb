"""A worker's jobs' output files: capped while the jobs write them, deleted a while after.

:class:`OutputKeeper`, one task per agent, trims the running jobs' output files over
``max_output_mb`` by punching a hole at their head (or truncating where the filesystem cannot:
``<name>.removed`` counts the loss), and deletes the folders of jobs that ended more than
``output_retention_s`` ago. docs/design.md, "Jobs' output: caps and retention".
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import attrs
import trio

from agent import deadman
from agent.runtimes import job_dir_for
from runtime import metrics
from runtime.settings.agent import OutputSettings

OUTPUT_FILES = {"stdout": "stdout.log", "stderr": "stderr.log"}
"""Each output stream's file in a job's folder."""
REMOVED_SUFFIX = ".removed"
"""``<file>.removed``: how many bytes a file lost to truncation (the fallback without hole
punching), a decimal number; missing: none."""
KEEP_FRACTION = 7 / 8
"""How much of the cap a trimmed file keeps: the rest is room for growth before the next trim."""

_SEEK_TRIES = 3
"""How many times :func:`data_start` asks where data begins while the file grows under it."""

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
"""What ``fallocate`` answers where a filesystem cannot punch holes (EINVAL: some that do not
know the flag)."""


def trim_to(size_bytes: int, kept_from: int, cap_bytes: int, block_bytes: int) -> int | None:
    """Where the kept part of a file should begin after a trim, or None when it is within its cap.

    The file holds ``size_bytes``, of which ``[kept_from, size_bytes)`` are kept. Past
    ``cap_bytes`` (> 0), the new start keeps at least :data:`KEEP_FRACTION` of the cap (the newest
    bytes), rounded down to a multiple of ``block_bytes`` (> 0; holes are punched in whole
    blocks); so the kept part is then between 7/8 of the cap and that plus one block.
    """
    if size_bytes - kept_from <= cap_bytes:
        return None
    keep = int(cap_bytes * KEEP_FRACTION)
    new_from = (size_bytes - keep) // block_bytes * block_bytes
    return new_from if new_from > kept_from else None


def next_check_interval_s(
    grew_bytes: int, elapsed_s: float, previous_s: float, cap_bytes: int, settings: OutputSettings
) -> float:
    """The time until the next check of the output sizes, in seconds.

    A file that grew ``grew_bytes`` (the most any watched file grew) over the last ``elapsed_s``
    seconds would, at that rate, pass ``cap_bytes`` by an eighth of it (the room a trim leaves)
    in ``cap / 8 / rate`` seconds: the next check comes then, but at most twice the
    ``previous_s`` interval, so that quiet checks lengthen it step by step, and always between
    ``min_check_interval_s`` and ``check_interval_s``.
    """
    wanted = 2 * previous_s
    if grew_bytes > 0 and elapsed_s > 0:
        wanted = min(wanted, cap_bytes * (1 - KEEP_FRACTION) / (grew_bytes / elapsed_s))
    return min(settings.check_interval_s, max(settings.min_check_interval_s, wanted))


def parse_folder_name(name: str) -> tuple[int, int] | None:
    """``(job_id, assignment_id)`` of a job folder's name ``<job_id>-<assignment_id>``; None for
    any other name."""
    job, sep, assignment = name.partition("-")
    if not (sep and job.isdigit() and assignment.isdigit() and (job + assignment).isascii()):
        return None
    return int(job), int(assignment)


@attrs.frozen(kw_only=True)
class JobFolder:
    """One job folder as a sweep found it."""

    path: Path
    assignment_id: int
    last_change_unix_s: float
    """The newest modification time of the folder and its output and report files."""


def expired(
    folders: Iterable[JobFolder],
    *,
    active: Collection[int],
    now_unix_s: float,
    retention_s: float,
    limit: int,
) -> list[JobFolder]:
    """The folders a sweep deletes: those whose last change is more than ``retention_s`` before
    ``now_unix_s`` and whose assignment is not in ``active`` (jobs this agent still holds),
    oldest first, at most ``limit``."""
    old = [
        f
        for f in folders
        if f.assignment_id not in active and f.last_change_unix_s + retention_s < now_unix_s
    ]
    return sorted(old, key=lambda f: f.last_change_unix_s)[:limit]


def data_start(fd: int, offset: int) -> int:
    """The first offset at or after ``offset`` that holds data (past a punched hole), or the
    file's length when none does. Where the filesystem does not know holes, ``offset``.

    The file may grow meanwhile (its job writes on): "no data" (ENXIO) followed by a length
    past ``offset`` means a write came between the two reads, not a hole, so the seek is asked
    again; only a hole that reaches the end (which a job writing appends cannot leave) is
    skipped to the length. Taking the length as it was read would skip the bytes just written.
    """
    for _ in range(_SEEK_TRIES):
        try:
            return os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return offset
            if exc.errno != errno.ENXIO:
                raise
        # No data at or after offset, when the seek looked.
        size = os.fstat(fd).st_size
        if size <= offset:
            return offset
    return size


_libc: Any = None


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``[offset, offset + length)`` of the file (it reads as NUL bytes after), keeping its
    length (``fallocate`` with ``FALLOC_FL_PUNCH_HOLE``). False when the filesystem cannot
    punch holes; any other failure raises OSError."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        _libc.fallocate.restype = ctypes.c_int
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code))


class OutputFiles:
    """What the keeper and the readers of one agent share about its output files: a lock per
    file, held around a trim and around each read (on worker threads), and how many bytes each
    file lost to truncation (kept in ``<file>.removed`` too, for a later agent)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._removed: dict[str, int] = {}

    def lock(self, path: Path) -> threading.Lock:
        """The lock of the file at ``path``."""
        with self._guard:
            return self._locks.setdefault(str(path), threading.Lock())

    def removed_bytes(self, path: Path) -> int:
        """How many bytes the file at ``path`` lost to truncation (hold its lock)."""
        key = str(path)
        if key not in self._removed:
            try:
                self._removed[key] = int(Path(key + REMOVED_SUFFIX).read_text().strip() or 0)
            except (OSError, ValueError):
                self._removed[key] = 0
        return self._removed[key]

    def add_removed(self, path: Path, count: int) -> None:
        """Record that the file at ``path`` lost ``count`` more bytes to truncation (hold its
        lock); raises OSError when the record cannot be written."""
        total = self.removed_bytes(path) + count
        record = Path(str(path) + REMOVED_SUFFIX)
        scratch = record.with_name(record.name + ".tmp")
        scratch.write_text(f"{total}\n")
        scratch.replace(record)
        self._removed[str(path)] = total

    def forget(self, folder: Path) -> None:
        """Drop what is known of the files in ``folder`` (it was deleted)."""
        prefix = str(folder) + os.sep
        with self._guard:
            for key in [k for k in self._locks if k.startswith(prefix)]:
                del self._locks[key]
            for key in [k for k in self._removed if k.startswith(prefix)]:
                del self._removed[key]


@attrs.frozen(kw_only=True)
class Trim:
    """What one trim of a file did."""

    path: Path
    dropped_bytes: int
    punched: bool
    """True: a hole was punched; False: the file was truncated (no hole punching there)."""


def trim_file(path: Path, cap_bytes: int, files: OutputFiles) -> tuple[int, Trim | None]:
    """Check one output file and trim it when its kept part is over ``cap_bytes``; returns its
    length (the bytes the job wrote to it, truncated ones included) and the trim, if any. A
    missing file is 0 bytes. Runs on a worker thread; OSError when the file cannot be changed.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return 0, None
    try:
        with files.lock(path):
            stat = os.fstat(fd)
            removed = files.removed_bytes(path)
            kept_from = data_start(fd, 0)
            new_from = trim_to(stat.st_size, kept_from, cap_bytes, max(stat.st_blksize, 512))
            if new_from is None:
                return stat.st_size + removed, None
            if punch_hole(fd, 0, new_from):
                return stat.st_size + removed, Trim(
                    path=path, dropped_bytes=new_from - kept_from, punched=True
                )
            size = os.fstat(fd).st_size
            os.ftruncate(fd, 0)
            files.add_removed(path, size)
            return size + removed, Trim(path=path, dropped_bytes=size - kept_from, punched=False)
    finally:
        os.close(fd)


def last_change_unix_s(folder: Path) -> float | None:
    """The newest modification time of ``folder`` and of its output and report files; None
    when the folder is gone."""
    try:
        newest = folder.stat().st_mtime
    except OSError:
        return None
    for name in (*OUTPUT_FILES.values(), deadman.REPORT_FILE):
        with contextlib.suppress(OSError):
            newest = max(newest, (folder / name).stat().st_mtime)
    return newest


def list_job_folders(jobs_dir: Path) -> list[JobFolder]:
    """Every job folder under ``jobs_dir`` with its last change (runs on a worker thread)."""
    found = []
    try:
        entries = list(os.scandir(jobs_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        ids = parse_folder_name(entry.name)
        if ids is None or not entry.is_dir(follow_symlinks=False):
            continue
        changed = last_change_unix_s(Path(entry.path))
        if changed is not None:
            found.append(JobFolder(path=Path(entry.path), assignment_id=ids[1], last_change_unix_s=changed))
    return found


@attrs.define
class OutputKeeper:
    """Caps the running jobs' output files and deletes old job folders under ``jobs_dir``.

    Args:
        active: ``(job_id, assignment_id)`` of the jobs the agent holds now.
        added: the event set when the agent next holds a new job.
        writing: those of ``active`` that write output files (a sleep job writes none), whose
            files are capped; None: all of ``active``.
    """

    jobs_dir: Path
    settings: OutputSettings
    active: Callable[[], Collection[tuple[int, int]]]
    files: OutputFiles
    logger: Any
    added: Callable[[], trio.Event]
    worker_id: str = ""
    writing: Callable[[], Collection[tuple[int, int]]] | None = None
    _sizes: dict[Path, int] = attrs.field(factory=dict)
    """Length of each watched file at the last check."""
    _warned: set[Path] = attrs.field(factory=set)
    """Files already logged as trimmed."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Cap and sweep until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cap_loop)
            nursery.start_soon(self._sweep_loop)
            task_status.started()

    async def _cap_loop(self) -> None:
        interval_s = self.settings.check_interval_s
        last = trio.current_time()
        added = self.added()
        while True:
            # Until due, or until the agent holds a new job: a job that floods from its first
            # instant is looked at at once, and idle workers cost no wake-ups.
            with trio.move_on_at(last + interval_s):
                await added.wait()
            # Taken before the check: a job added while it runs sets it, so it is not missed.
            added = self.added()
            grew, new_files = await self.check_once()
            now = trio.current_time()
            interval_s = next_check_interval_s(
                grew, now - last, interval_s, self.settings.max_output_bytes, self.settings
            )
            if new_files:
                # A job that just started: how fast it writes is not known yet, so look again soon.
                interval_s = self.settings.min_check_interval_s
            last = now

    async def check_once(self) -> tuple[int, bool]:
        """Check (and trim) the output files of the jobs the agent holds, and once more those of
        jobs that ended since the last check; returns the most any of them grew since the last
        check, in bytes, and whether a job's files were seen for the first time."""
        running = {
            job_dir_for(self.jobs_dir, job_id, aid) / name
            for job_id, aid in (self.writing or self.active)()
            for name in OUTPUT_FILES.values()
        }
        paths = running | set(self._sizes)
        if not paths:
            return 0, False
        new_files = not running <= set(self._sizes)
        checked = await trio.to_thread.run_sync(self._check_paths, sorted(paths))
        grew = 0
        for path, (size, trim) in checked.items():
            grew = max(grew, size - self._sizes.get(path, 0))
            if trim is not None:
                self._trimmed(trim)
            if path in running:
                self._sizes[path] = size
            else:
                self._sizes.pop(path, None)  # its job has ended: that was its last check
                self._warned.discard(path)
        return grew, new_files

    def _check_paths(self, paths: list[Path]) -> dict[Path, tuple[int, Trim | None]]:
        """(worker thread) :func:`trim_file` of each path; one that fails is skipped."""
        checked: dict[Path, tuple[int, Trim | None]] = {}
        for path in paths:
            try:
                checked[path] = trim_file(path, self.settings.max_output_bytes, self.files)
            except OSError as exc:
                self.logger.warning("output not checked", path=str(path), error=str(exc))
        return checked

    def _trimmed(self, trim: Trim) -> None:
        metrics.AGENT_OUTPUT_DROPPED_BYTES.labels(self.worker_id).inc(trim.dropped_bytes)
        if trim.path in self._warned:
            return
        self._warned.add(trim.path)
        if trim.punched:
            say, event = self.logger.info, "output over its cap: dropping its oldest part"
        else:
            say = self.logger.warning
            event = "output over its cap on a filesystem without hole punching: truncated it whole"
        say(
            event,
            path=str(trim.path),
            max_output_mb=self.settings.max_output_mb,
            dropped_bytes=trim.dropped_bytes,
        )

    async def _sweep_loop(self) -> None:
        while True:
            await trio.sleep(self.settings.sweep_interval_s)
            await self.sweep_once()

    async def sweep_once(self) -> int:
        """Delete the folders of jobs that ended more than ``output_retention_s`` ago (at most
        ``max_sweep_deletions``); returns how many were deleted."""
        folders = await trio.to_thread.run_sync(list_job_folders, self.jobs_dir)
        # The agent's jobs are read after the listing: a job accepted meanwhile has a folder
        # newer than any retention, and one that ended meanwhile is kept for the next sweep.
        active = {aid for _, aid in self.active()}
        doomed = expired(
            folders,
            active=active,
            now_unix_s=time.time(),
            retention_s=self.settings.output_retention_s,
            limit=self.settings.max_sweep_deletions,
        )
        if not doomed:
            return 0
        deleted = await trio.to_thread.run_sync(self._delete, doomed)
        self.logger.info(
            "deleted old job folders", folders=deleted, output_retention_s=self.settings.output_retention_s
        )
        return deleted

    def _delete(self, folders: list[JobFolder]) -> int:
        """(worker thread) Delete ``folders``; one that cannot be deleted is logged and left."""
        deleted = 0
        for folder in folders:
            try:
                shutil.rmtree(folder.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.logger.warning("job folder not deleted", path=str(folder.path), error=str(exc))
                continue
            self.files.forget(folder.path)
            deleted += 1
        return deleted
