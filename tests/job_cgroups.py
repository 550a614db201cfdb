"""The job cgroups this machine's agents made, for the suite to clear up after itself.

An agent that is SIGKILLed leaves its worker's cgroup folders behind (empty: its reapers kill
their jobs as it dies), and so may the jobs' own folders; the next start of that worker on the
same work folder removes them, but every test's work folder is new. :func:`worker_folders`
lists them, :func:`owned_by` keeps those of workers whose work folders lie under a folder of the
session's own (a worker's cgroups are named ``<worker>-<owner>``, the owner a hash of its work
folder: :func:`agent.cgroups.worker_key`), so that another pytest session running beside this one
keeps its own, and :func:`remove_empty` removes them, deepest first, where nothing runs in them
any more (rmdir refuses a cgroup that holds processes or children).
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.cgroup_mounts import locate
from agent.cgroups import AGENT_LEAF, JOBS_GROUP
from agent.runtimes import owner_of


def worker_folders() -> set[Path]:
    """Every worker folder of job cgroups under this process's cgroups (v1: ``stockade-*``
    in each hierarchy; v2: the folders under ``stockade-jobs``)."""
    try:
        located = locate(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    except OSError:
        return set()
    found: set[Path] = set()
    for folder in set(located.v1.values()):
        found.update(p for p in folder.glob("stockade-*") if p.is_dir())
    if located.v2 is not None:
        base = located.v2.parent if located.v2.name == AGENT_LEAF else located.v2
        found.update(p for p in (base / JOBS_GROUP).glob("*") if p.is_dir())
    return found


def owned_by(folders: set[Path], root: Path) -> set[Path]:
    """Those of ``folders`` (worker folders of job cgroups) whose worker's work folder is ``root``
    or a folder under it: their names end with ``-<owner>`` of such a work folder."""
    owners = {owner_of(str(root))}
    for parent, children, _ in os.walk(root):
        owners.update(owner_of(os.path.join(parent, child)) for child in children)
    return {f for f in folders if f.name.rpartition("-")[2] in owners}


def remove_empty(folders: set[Path]) -> None:
    """rmdir each of ``folders`` and the job folders in it, where nothing runs any more."""
    for folder in folders:
        for job in (p for p in folder.iterdir() if p.is_dir()):
            try:
                job.rmdir()
            except OSError:
                pass
        try:
            folder.rmdir()
        except OSError:
            pass
