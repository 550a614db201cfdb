"""Where this process's cgroups are: the cgroup mounts (``/proc/self/mountinfo``), the process's
place in each hierarchy (``/proc/self/cgroup``), and :func:`locate`, which puts both together
(pure); the keyed files the kernel reports in (:func:`parse_keyed`). Used by :mod:`agent.cgroups`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import attrs

CONTROLLERS = ("cpu", "memory", "pids")
"""The controllers a cgroup mode needs."""
ACCOUNTING = "cpuacct"
"""cgroup v1: the controller of CPU time accounting (optional: without it, no ``cpu_s``)."""


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system says; else all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


@attrs.frozen(kw_only=True)
class Host:
    """Where this process's view of its cgroups comes from (tests give a fake tree's)."""

    mountinfo: Path = Path("/proc/self/mountinfo")
    self_cgroup: Path = Path("/proc/self/cgroup")
    pid: int = attrs.field(factory=os.getpid)
    """The process to move into the agent's leaf (cgroup v2): this one."""
    cpus: int = attrs.field(factory=_usable_cpus)
    """The CPUs its jobs may run on (the jobs' group weighs one job-nice task per CPU)."""


@attrs.frozen(kw_only=True)
class Mount:
    """One cgroup file system mount (a line of ``/proc/self/mountinfo``)."""

    mount_point: Path
    root: str
    """The cgroup the mount shows at its mount point (``/`` unless a container's namespace or a
    bind mount shows a part of the hierarchy)."""
    version: int
    """2 for ``cgroup2``, 1 for ``cgroup``."""
    controllers: frozenset[str]
    """cgroup v1: the controllers of the hierarchy (its super options); v2: empty."""


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts of a ``/proc/<pid>/mountinfo`` text, in order (the format is
    ``proc(5)``'s: ``id parent major:minor root mount-point options [optional...] - fstype
    source super-options``); other file systems and malformed lines are left out."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            dash = fields.index("-")
        except ValueError:
            continue
        if dash < 5 or len(fields) < dash + 3:
            continue
        fstype = fields[dash + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        options = set(fields[dash + 3].split(",")) if len(fields) > dash + 3 else set()
        v2 = fstype == "cgroup2"
        controllers = frozenset() if v2 else frozenset(options - {"rw", "ro"})
        root, mount_point = _unescape(fields[3]), Path(_unescape(fields[4]))
        mounts.append(
            Mount(mount_point=mount_point, root=root, version=2 if v2 else 1, controllers=controllers)
        )
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """The cgroup of each controller in a ``/proc/<pid>/cgroup`` text (``hierarchy:controllers:
    path`` lines): ``{"memory": "/a/b", ...}``; the unified hierarchy's (``0::/path``) under the
    key ``""``; named v1 hierarchies (``name=systemd``) under their name."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            found.setdefault(name, path)
    return found


def parse_keyed(text: str) -> dict[str, int]:
    """The integer values of a flat keyed cgroup file (``key value`` lines: ``memory.events``,
    ``memory.oom_control``, ``cpu.stat``); lines that are not that are left out."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                values[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return values


def visible_dir(mount: Mount, cgroup: str) -> Path | None:
    """The folder of ``cgroup`` (a path from ``/proc/self/cgroup``) under ``mount``, or None
    when the mount does not show it."""
    root = mount.root.rstrip("/")
    if cgroup != root and not cgroup.startswith(root + "/"):
        return None
    rest = cgroup[len(root) :].strip("/")
    return mount.mount_point / rest if rest else mount.mount_point


@attrs.frozen(kw_only=True)
class Located:
    """Where this process's cgroups are, per version, or why there are none."""

    v2: Path | None
    """The agent's cgroup in the unified hierarchy."""
    v2_why: str
    v1: Mapping[str, Path]
    """cgroup v1: the agent's cgroup folder in the hierarchy of each controller found (of
    :data:`CONTROLLERS` and :data:`ACCOUNTING`)."""
    v1_why: str


def locate(mountinfo: str, proc_cgroup: str) -> Located:
    """Where this process's cgroups are, from its ``mountinfo`` and ``/proc/self/cgroup``
    texts. Pure; whether they can be used is for :mod:`agent.cgroups` to find out."""
    mounts = parse_mountinfo(mountinfo)
    cgroups = parse_proc_cgroup(proc_cgroup)
    v2: Path | None = None
    v2_why = "no cgroup2 file system is mounted"
    for mount in (m for m in mounts if m.version == 2):
        if "" not in cgroups:
            v2_why = "this process has no cgroup in the unified hierarchy (/proc/self/cgroup)"
            break
        v2 = visible_dir(mount, cgroups[""])
        if v2 is not None:
            v2_why = ""
            break
        v2_why = f"this process's cgroup {cgroups['']} is not under the cgroup2 mount {mount.mount_point}"
    v1: dict[str, Path] = {}
    for controller in (*CONTROLLERS, ACCOUNTING):
        for mount in (m for m in mounts if m.version == 1 and controller in m.controllers):
            if controller in cgroups:
                folder = visible_dir(mount, cgroups[controller])
                if folder is not None:
                    v1[controller] = folder
                    break
    missing = [c for c in CONTROLLERS if c not in v1]
    v1_why = f"no cgroup v1 hierarchy of {', '.join(missing)} is mounted" if missing else ""
    return Located(v2=v2, v2_why=v2_why, v1=v1, v1_why=v1_why)
