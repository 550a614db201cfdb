"""What a job's uid leaves behind, and its removal before the uid is given to another job
(:func:`clean_uids`, for a batch of uids at once): processes (a ``/proc`` scan), its job folder
(given back to the agent), files in the world-writable temp folders (:func:`remove_temp_files`,
one walk for the whole batch), SysV IPC objects. Blocking: run it in a thread."""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import signal
import stat
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs

TEMP_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
"""The folders every user may write in by default, where a job's files (POSIX message queues
in /dev/mqueue) outlive it; one that does not exist is passed over."""
KILL_WAIT_S = 5.0
"""How long :func:`kill_processes` waits for a uid's processes to be gone, in seconds."""
_IPC_RMID = 0
_IPC_TABLES = {
    # /proc/sysvipc file: (the id's column, the uid and cuid columns, the *ctl function)
    "shm": (1, (7, 9), "shmctl"),
    "msg": (1, (7, 9), "msgctl"),
    "sem": (1, (4, 6), "semctl"),
}


@attrs.frozen
class UidRanges(Collection[int]):
    """Uids as inclusive ranges, less some: what a worker's pool (or several) holds, tested by
    bisection rather than held as a set of every uid (a block is 65,536 uids, a fleet's pools
    millions)."""

    ranges: tuple[tuple[int, int], ...]
    """(first, last) pairs, sorted and not overlapping."""
    excluded: frozenset[int] = frozenset()
    """Uids of the ranges that are not in the set."""

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]], *, excluded: Iterable[int] = ()) -> UidRanges:
        """The uids of ``ranges`` ((first, last) pairs, in any order, overlapping or not) less
        ``excluded``."""
        merged: list[tuple[int, int]] = []
        for first, last in sorted(ranges):
            if merged and first <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], last))
            else:
                merged.append((first, last))
        return cls(tuple(merged), frozenset(excluded))

    def __contains__(self, uid: object) -> bool:
        if not isinstance(uid, int) or uid in self.excluded:
            return False
        at = bisect.bisect_right(self.ranges, (uid, 2**63)) - 1
        return at >= 0 and self.ranges[at][0] <= uid <= self.ranges[at][1]

    def __iter__(self) -> Iterator[int]:
        for first, last in self.ranges:
            yield from (uid for uid in range(first, last + 1) if uid not in self.excluded)

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges) - len(self.excluded)

    def without(self, uids: Iterable[int]) -> UidRanges:
        """These uids less ``uids``."""
        return UidRanges(self.ranges, self.excluded | {u for u in uids if u in self})


def _process_uids(pid: str) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of process ``pid``; None when it is gone
    or a zombie (it runs nothing and holds its pid until its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as file:
            for line in file:
                if line.startswith(b"State:") and line.split()[1] == b"Z":
                    return None
                if line.startswith(b"Uid:"):
                    return tuple(int(v) for v in line.split()[1:5])
    except (OSError, ValueError):
        return None
    return None


def process_uids() -> dict[int, tuple[int, ...]]:
    """Every process of this machine (pid -> its real, effective, saved and filesystem uids):
    a ``/proc`` scan."""
    found: dict[int, tuple[int, ...]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                held = _process_uids(name)
                if held is not None:
                    found[int(name)] = held
    return found


def processes_of(uids: Collection[int]) -> dict[int, int]:
    """Every process (pid -> its real uid) any of whose uids (real, effective, saved,
    filesystem) is one of ``uids``."""
    return {pid: held[0] for pid, held in process_uids().items() if any(u in uids for u in held)}


def kill_processes(uids: Collection[int], *, wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every process of ``uids`` (:func:`processes_of`) until none is left, or
    ``wait_s`` seconds have passed; the pids still there (empty: none left). A process forked
    between two scans is found by the next one: the uid cannot hide in a new pid."""
    return sorted(_kill(uids, wait_s=wait_s))


def _kill(uids: Collection[int], *, wait_s: float) -> dict[int, set[int]]:
    """:func:`kill_processes`: the processes left, each with which of ``uids`` it has."""
    until = time.monotonic() + wait_s
    while True:
        left = {
            pid: theirs for pid, held in process_uids().items() if (theirs := {u for u in held if u in uids})
        }
        if not left:
            return {}
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= until:
            return left
        time.sleep(0.01)


def _entries(folder: str) -> list[tuple[str, os.stat_result]]:
    """The entries of ``folder`` with their ``lstat`` (none when it cannot be read)."""
    try:
        with os.scandir(folder) as scan:
            listed = list(scan)
    except OSError:
        return []
    found = []
    for entry in listed:
        with contextlib.suppress(OSError):
            found.append((entry.path, entry.stat(follow_symlinks=False)))
    return found


def _tree(top: str) -> list[tuple[str, os.stat_result]]:
    """Everything under the folder ``top`` (not ``top``), each folder before what it holds,
    never following a symlink. Iterative: a job's tree of any depth costs no recursion (a
    path past PATH_MAX cannot be read and is left out; its remover then fails and says so)."""
    found: list[tuple[str, os.stat_result]] = []
    stack = [top]
    while stack:
        for path, info in _entries(stack.pop()):
            found.append((path, info))
            if stat.S_ISDIR(info.st_mode):
                stack.append(path)
    return found


def give_back(folder: Path, uid: int, gid: int) -> None:
    """``chown -R`` ``folder`` to ``uid``:``gid`` without following symlinks (a link the job
    left is changed itself, never what it names); a missing folder is fine.

    Raises:
        OSError: something under it could not be changed.
    """
    if not folder.exists() and not folder.is_symlink():
        return
    os.chown(folder, uid, gid, follow_symlinks=False)
    if folder.is_symlink() or not folder.is_dir():
        return
    for path, info in _tree(str(folder)):
        if (info.st_uid, info.st_gid) != (uid, gid):
            os.chown(path, uid, gid, follow_symlinks=False)


def _remove_tree(top: str) -> None:
    """``rm -rf`` of the folder ``top``, without recursion (deepest first) or following links.

    Raises:
        OSError: something could not be removed.
    """
    for path, info in reversed(_tree(top)):
        if stat.S_ISDIR(info.st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)
    os.rmdir(top)


def _reachable(info: os.stat_result, uids: Collection[int]) -> bool:
    """Whether a job of one of ``uids`` (gid equal to its uid, no other groups) could search
    the folder ``info`` describes (so what is under it may be its)."""
    mode = info.st_mode
    if info.st_uid in uids:
        return bool(mode & stat.S_IXUSR)
    if info.st_gid in uids:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def _owned_under(root: str, uids: Collection[int]) -> list[tuple[str, int]]:
    """What under ``root`` belongs to one of ``uids`` (a folder of theirs once, not what is in
    it), with its owner, descending only into folders such a job could search; iterative, as
    :func:`_tree`."""
    owned = []
    stack = [root]
    while stack:
        for path, info in _entries(stack.pop()):
            if info.st_uid in uids:
                owned.append((path, info.st_uid))
            elif stat.S_ISDIR(info.st_mode) and _reachable(info, uids):
                stack.append(path)
    return owned


def remove_temp_files(
    uids: Collection[int], *, owner: tuple[int, int], folders: Iterable[str] = TEMP_FOLDERS
) -> dict[int, list[str]]:
    """Remove what ``uids`` own in ``folders`` (a folder of theirs with all it holds), in one
    walk of each folder for all of them; what they own deeper, in a folder of someone else's
    they could write to (a results folder an operator shares with jobs), is given to ``owner``
    instead (:func:`give_back`): kept, but no later holder of the uid owns it. Returns what
    could not be removed or given, by the uid that owned it (none: everything went)."""
    failed: dict[int, list[str]] = {}
    for folder in folders:
        for path, uid in _owned_under(folder, uids):
            try:
                if os.path.dirname(path) != folder:
                    give_back(Path(path), *owner)
                elif os.path.isdir(path) and not os.path.islink(path):
                    _remove_tree(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError:
                failed.setdefault(uid, []).append(path)
    return failed


def ipc_objects(uids: Collection[int], sysvipc: str = "/proc/sysvipc") -> list[tuple[str, int]]:
    """The SysV IPC objects (kind ``shm``/``msg``/``sem``, id) owned or created by ``uids``."""
    return [(kind, ident) for kind, ident, _ in _ipc_objects_of(uids, sysvipc)]


def _ipc_objects_of(uids: Collection[int], sysvipc: str = "/proc/sysvipc") -> list[tuple[str, int, int]]:
    """:func:`ipc_objects`, each with the one of ``uids`` that owns (else created) it."""
    found = []
    for kind, (id_at, uid_at, _) in _IPC_TABLES.items():
        try:
            with open(os.path.join(sysvipc, kind)) as file:
                lines = file.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) <= max(uid_at):
                continue
            with contextlib.suppress(ValueError):
                if held := [uid for uid in (int(cols[i]) for i in uid_at) if uid in uids]:
                    found.append((kind, int(cols[id_at]), held[0]))
    return found


def remove_ipc(uids: Collection[int]) -> list[tuple[str, int]]:
    """Remove the SysV IPC objects of ``uids`` (IPC_RMID); returns those that remain."""
    return [(kind, ident) for kind, ident, _ in _remove_ipc_of(uids)]


def _remove_ipc_of(uids: Collection[int]) -> list[tuple[str, int, int]]:
    """:func:`remove_ipc`, each object that remains with its uid."""
    libc = ctypes.CDLL(None, use_errno=True)
    for kind, ident in ipc_objects(uids):
        function = getattr(libc, _IPC_TABLES[kind][2])
        if kind == "sem":
            function(ident, 0, _IPC_RMID)
        else:
            function(ident, _IPC_RMID, None)
    return _ipc_objects_of(uids)


def clean_uids(
    folders: Mapping[int, Sequence[Path]], *, owner: tuple[int, int], wait_s: float = KILL_WAIT_S
) -> dict[int, list[str]]:
    """Remove what the uids that are the keys of ``folders`` left, all at once (one ``/proc``
    scan per round of kills, one walk of each temp folder, one read of the IPC tables, however
    many uids): their processes (waiting ``wait_s`` seconds at most for them to be gone), then,
    for each uid none of whose processes is left, its files in the temp folders and its IPC
    objects; its ``folders`` (its job's folder) are given to ``owner`` (uid, gid: the agent's).

    Returns, by uid, what could not be cleaned, one line each; a uid missing from it has
    nothing left and may be given out again. A uid with a process left is not cleaned further
    (while a process lives it can make new files)."""
    try:
        return _clean(folders, owner=owner, wait_s=wait_s)
    except Exception as exc:  # a bug or an odd file system: the uids are kept out, the agent lives
        return {uid: [f"clean-up failed: {exc!r}"] for uid in folders}


def _clean(
    folders: Mapping[int, Sequence[Path]], *, owner: tuple[int, int], wait_s: float
) -> dict[int, list[str]]:
    """:func:`clean_uids`, raising what it did not foresee."""
    problems: dict[int, list[str]] = {}
    holders: dict[int, list[int]] = {}
    for pid, held in _kill(set(folders), wait_s=wait_s).items():
        for uid in held:
            holders.setdefault(uid, []).append(pid)
    for uid, pids in holders.items():
        problems[uid] = [f"processes still running after SIGKILL: {sorted(pids)[:10]}"]
    clean = set(folders) - set(problems)
    if not clean:
        return problems
    for uid in clean:
        for folder in folders[uid]:
            try:
                give_back(folder, *owner)
            except OSError as exc:
                problems.setdefault(uid, []).append(f"cannot give {folder} back to uid {owner[0]}: {exc}")
    for uid, paths in remove_temp_files(clean, owner=owner).items():
        problems.setdefault(uid, []).extend(f"cannot remove {path}" for path in paths)
    for kind, ident, uid in _remove_ipc_of(clean):
        problems.setdefault(uid, []).append(f"cannot remove SysV {kind} {ident}")
    return problems
