"""Command jobs in cgroups (v2 and v1): a worker's subtree and a job's cgroup in each layout, and
the choice of mode at agent start (:func:`select_resources`, :func:`resource_settings`).

The modes and the numbers: :mod:`agent.resources`; the layouts and leftovers: docs/design.md,
"Job cgroups: layouts and leftovers".
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from agent.cgroup_mounts import ACCOUNTING, CONTROLLERS, Host, Located, locate, parse_keyed
from agent.resources import (
    CPU_PERIOD_US,
    RESOURCES_LABEL,
    ConfinedJob,
    Confinement,
    JobLimits,
    JobResources,
    JobUsage,
    Mode,
    RlimitResources,
    cpu_quota_us,
    job_cpu_shares,
    job_cpu_weight,
    jobs_cpu_shares,
    jobs_cpu_weight,
    memory_limit_bytes,
)
from agent.runtimes import owner_of
from runtime.errors import ResourcesUnavailable
from runtime.settings.agent import AUTO, AgentSettings

AGENT_LEAF = "stockade-agent"
"""cgroup v2: the leaf the agent moves its process into (docs/design.md, "Job cgroups")."""
JOBS_GROUP = "stockade-jobs"
"""cgroup v2: the agent's jobs' cgroup, beside its leaf."""
LEFTOVER_WAIT_S = 2.0
"""How long the agent waits, at start, for the processes of a leftover job cgroup to die."""


def _read(path: Path) -> str:
    with open(path, encoding="ascii") as file:
        return file.read()


def _keyed(path: Path) -> dict[str, int]:
    """The values of the keyed cgroup file at ``path``; none when it cannot be read."""
    try:
        return parse_keyed(_read(path))
    except OSError:
        return {}


def _number(path: Path) -> int | None:
    """The one integer the cgroup file at ``path`` holds; None when it cannot be read."""
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return None


def _mkdir(folder: Path, *, exist_ok: bool = False) -> None:
    """Make the cgroup ``folder`` (a test's fake tree replaces this)."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        if not exist_ok:
            raise


def _make_job_dir(folder: Path, prepare: Callable[[], None]) -> None:
    """Make a job's cgroup ``folder``; its worker's folder too (``prepare``) when that is gone."""
    try:
        _mkdir(folder)
    except FileNotFoundError:
        prepare()
        _mkdir(folder)


def _write(path: Path, text: str) -> None:
    """Write one value to a cgroup file (the kernel takes it in one write, or refuses)."""
    with open(path, "w", encoding="ascii") as file:
        file.write(text)


def _write_if_present(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` when the kernel offers that file; True if written."""
    if not path.exists():
        return False
    _write(path, text)
    return True


def _pids(folder: Path) -> list[int]:
    """The processes in the cgroup ``folder`` (none when it is gone)."""
    try:
        return [int(p) for p in _read(folder / "cgroup.procs").split()]
    except (OSError, ValueError):
        return []


def _kill_members(folder: Path) -> None:
    """SIGKILL every process in the cgroup ``folder``: at once with ``cgroup.kill`` (v2, Linux
    5.14), else one by one (a process forking meanwhile is caught by the next call)."""
    with contextlib.suppress(OSError):
        if _write_if_present(folder / "cgroup.kill", "1"):
            return
    for pid in _pids(folder):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _remove_dir(folder: Path) -> bool:
    """rmdir the cgroup ``folder``; True once it is gone. One that still holds processes has
    them SIGKILLed and is left for now (False); another failure raises OSError."""
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
        _kill_members(folder)
        return False
    return True


def _remove_now(folders: list[Path], wait_s: float) -> list[Path]:
    """Remove every cgroup of ``folders`` (killing what runs there), waiting up to ``wait_s``
    for their processes to die; return those removed."""
    removed: list[Path] = []
    left = list(folders)
    deadline = time.monotonic() + wait_s
    while left:
        for folder in list(left):
            try:
                if _remove_dir(folder):
                    removed.append(folder)
                    left.remove(folder)
            except OSError:
                left.remove(folder)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return removed


def _subdirs(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


@attrs.frozen(kw_only=True)
class Cgroup2Job:
    """One job's cgroup in the unified hierarchy."""

    name: str
    folder: Path

    @property
    def confinement(self) -> Confinement:
        return Confinement(cgroup_procs=(str(self.folder / "cgroup.procs"),), clone_into=str(self.folder))

    def usage(self) -> JobUsage:
        cpu, memory = _keyed(self.folder / "cpu.stat"), _keyed(self.folder / "memory.events")
        usec = cpu.get("usage_usec")
        return JobUsage(
            cpu_s=None if usec is None else usec / 1e6,
            throttled_periods=cpu.get("nr_throttled"),
            oom_kills=memory.get("oom_kill", 0),
            memory_bytes=_number(self.folder / "memory.current"),
        )

    def remove(self) -> bool:
        return _remove_dir(self.folder)


@attrs.frozen(kw_only=True)
class Cgroup2Resources:
    """One worker's jobs in cgroup v2, under ``worker_dir`` (docs/design.md, "Job cgroups")."""

    worker_dir: Path
    pids_max: int
    jobs_weight: int
    """``cpu.weight`` of the jobs' group (``stockade-jobs``)."""
    mode: Mode = Mode.CGROUP2

    @property
    def where(self) -> str:
        return str(self.worker_dir)

    def prepare(self) -> None:
        """Make the jobs' group and the worker's folder, handing the controllers down (again
        should they have been removed meanwhile); OSError when they cannot be made or written."""
        jobs = self.worker_dir.parent
        _mkdir(jobs, exist_ok=True)
        _write(jobs / "cpu.weight", str(self.jobs_weight))
        _write(jobs / "cgroup.subtree_control", _ENABLE)
        _mkdir(self.worker_dir, exist_ok=True)
        _write(self.worker_dir / "cgroup.subtree_control", _ENABLE)

    def confine(self, name: str, limits: JobLimits) -> ConfinedJob:
        folder = self.worker_dir / name
        _remove_now([folder], LEFTOVER_WAIT_S)  # a name is never reused; a leftover would be stale
        _make_job_dir(folder, self.prepare)
        try:
            _write(folder / "cpu.max", f"{cpu_quota_us(limits.cpu_millis)} {CPU_PERIOD_US}")
            _write(folder / "cpu.weight", str(job_cpu_weight(limits.cpu_millis)))
            _write(folder / "memory.max", str(memory_limit_bytes(limits.memory_mb)))
            # Not every kernel has them: swap accounting can be off (no swap limit then, and
            # the job may swap), and memory.oom.group came in 4.19.
            _write_if_present(folder / "memory.swap.max", "0")
            _write_if_present(folder / "memory.oom.group", "1")
            _write(folder / "pids.max", str(self.pids_max))
        except BaseException:
            _remove_now([folder], 0.0)
            raise
        return Cgroup2Job(name=name, folder=folder)

    def find(self, name: str) -> ConfinedJob | None:
        folder = self.worker_dir / name
        return Cgroup2Job(name=name, folder=folder) if folder.is_dir() else None

    def jobs_usage(self) -> JobUsage:
        return Cgroup2Job(name="", folder=self.worker_dir).usage()

    def remove_leftovers(self, keep: Collection[str] = ()) -> list[str]:
        found = [sub for sub in _subdirs(self.worker_dir) if sub.name not in keep]
        return [str(p) for p in _remove_now(found, LEFTOVER_WAIT_S)]

    def close(self) -> None:
        _remove_now([self.worker_dir], 0.0)


_ENABLE = "+cpu +memory +pids"


def open_cgroup2(
    own: Path, *, pid: int, worker_key: str, job_nice: int, pids_max: int, cpus: int = 1
) -> Cgroup2Resources:
    """Set up the v2 layout from the agent's cgroup folder ``own``: move process ``pid`` into
    the leaf unless it is there already, hand the controllers down to ``stockade-jobs/<worker_key>``.

    Raises:
        ResourcesUnavailable: the cgroup lacks a controller, holds other processes, or cannot
            be written; the message says which and where.
    """
    base = own
    if own.name == AGENT_LEAF:
        base = own.parent  # in our leaf already: a fleet's next worker, or put there at start
    try:
        offered = _read(base / "cgroup.controllers").split()
    except OSError as exc:
        raise ResourcesUnavailable(f"cannot read {base / 'cgroup.controllers'}: {exc}") from exc
    missing = [c for c in CONTROLLERS if c not in offered]
    if missing:
        raise ResourcesUnavailable(
            f"the cgroup {base} offers the controllers {' '.join(offered) or '(none)'}, not "
            f"{' '.join(missing)} (they are on cgroup v1 hierarchies, or not delegated to it: "
            "systemd's Delegate=yes)"
        )
    resources = Cgroup2Resources(
        worker_dir=base / JOBS_GROUP / worker_key,
        pids_max=pids_max,
        jobs_weight=jobs_cpu_weight(job_nice, cpus),
    )
    try:
        if base == own and (base / "cgroup.type").exists():
            others = [p for p in _pids(base) if p != pid]
            if others:
                raise ResourcesUnavailable(
                    f"the cgroup {base} holds {len(others)} other processes besides the agent "
                    f"(e.g. {others[0]}): run the agent in a cgroup of its own (systemd: Delegate=yes)"
                )
            leaf = base / AGENT_LEAF
            _mkdir(leaf, exist_ok=True)
            _write(leaf / "cgroup.procs", str(pid))
        _write(base / "cgroup.subtree_control", _ENABLE)
        resources.prepare()
    except OSError as exc:
        raise ResourcesUnavailable(f"cannot set up job cgroups under {base}: {exc}") from exc
    return resources


@attrs.frozen(kw_only=True)
class Cgroup1Job:
    """One job's cgroups in the v1 hierarchies (one folder per hierarchy)."""

    name: str
    folders: Mapping[str, Path]
    """The job's folder in the hierarchy of each controller (comounted ones share one)."""

    @property
    def confinement(self) -> Confinement:
        return Confinement(cgroup_procs=tuple(str(f / "cgroup.procs") for f in _distinct(self.folders)))

    def usage(self) -> JobUsage:
        nanoseconds = _number(self.folders[ACCOUNTING] / "cpuacct.usage")
        return JobUsage(
            cpu_s=None if nanoseconds is None else nanoseconds / 1e9,
            throttled_periods=_keyed(self.folders["cpu"] / "cpu.stat").get("nr_throttled"),
            oom_kills=_keyed(self.folders["memory"] / "memory.oom_control").get("oom_kill", 0),
            memory_bytes=_number(self.folders["memory"] / "memory.usage_in_bytes"),
        )

    def remove(self) -> bool:
        gone = True
        for folder in _distinct(self.folders):
            gone = _remove_dir(folder) and gone
        return gone


def _distinct(folders: Mapping[str, Path]) -> list[Path]:
    """The folders of ``folders``, each once, in order (comounted controllers share one)."""
    return list(dict.fromkeys(folders.values()))


@attrs.frozen(kw_only=True)
class Cgroup1Resources:
    """One worker's jobs in cgroup v1, under ``worker_dirs`` (docs/design.md, "Job cgroups")."""

    worker_dirs: Mapping[str, Path]
    """The worker's folder in the hierarchy of each controller."""
    pids_max: int
    jobs_shares: int
    """``cpu.shares`` of the worker's folder in the ``cpu`` hierarchy."""
    mode: Mode = Mode.CGROUP1

    @property
    def where(self) -> str:
        return " ".join(str(p) for p in _distinct(self.worker_dirs))

    def prepare(self) -> None:
        """Make the worker's folder in every hierarchy (again should they have been removed);
        OSError when they cannot be made or written."""
        for folder in _distinct(self.worker_dirs):
            _mkdir(folder, exist_ok=True)
        _write(self.worker_dirs["cpu"] / "cpu.shares", str(self.jobs_shares))

    def confine(self, name: str, limits: JobLimits) -> ConfinedJob:
        folders = {c: w / name for c, w in self.worker_dirs.items()}
        _remove_now(_distinct(folders), LEFTOVER_WAIT_S)  # a name is never reused: stale
        made: list[Path] = []
        try:
            for folder in _distinct(folders):
                _make_job_dir(folder, self.prepare)
                made.append(folder)
            cpu, memory = folders["cpu"], folders["memory"]
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(cpu_quota_us(limits.cpu_millis)))
            _write(cpu / "cpu.shares", str(job_cpu_shares(limits.cpu_millis)))
            limit = str(memory_limit_bytes(limits.memory_mb))
            _write(memory / "memory.limit_in_bytes", limit)  # first: memsw may not go below it
            if not _write_if_present(memory / "memory.memsw.limit_in_bytes", limit):
                # Without swap accounting the job's swap cannot be limited; this asks the
                # kernel not to swap its pages out at all (a hint, not a limit).
                with contextlib.suppress(OSError):
                    _write_if_present(memory / "memory.swappiness", "0")
            _write(folders["pids"] / "pids.max", str(self.pids_max))
        except BaseException:
            _remove_now(made, 0.0)
            raise
        return Cgroup1Job(name=name, folders=folders)

    def find(self, name: str) -> ConfinedJob | None:
        folders = {c: w / name for c, w in self.worker_dirs.items()}
        return Cgroup1Job(name=name, folders=folders) if folders["memory"].is_dir() else None

    def jobs_usage(self) -> JobUsage:
        return Cgroup1Job(name="", folders=self.worker_dirs).usage()

    def remove_leftovers(self, keep: Collection[str] = ()) -> list[str]:
        found = [
            sub for worker in _distinct(self.worker_dirs) for sub in _subdirs(worker) if sub.name not in keep
        ]
        return [str(p) for p in _remove_now(found, LEFTOVER_WAIT_S)]

    def close(self) -> None:
        _remove_now(_distinct(self.worker_dirs), 0.0)


def open_cgroup1(
    own: Mapping[str, Path], *, worker_key: str, job_nice: int, pids_max: int, cpus: int = 1
) -> Cgroup1Resources:
    """Set up the v1 layout under the agent's cgroup folder of each controller in ``own``: the
    worker's folder ``stockade-<worker_key>`` in each hierarchy, its ``cpu.shares`` those of one
    task at ``job_nice`` per CPU of ``cpus``.

    Raises:
        ResourcesUnavailable: a hierarchy is missing or cannot be written; the message says
            which and where.
    """
    missing = [c for c in CONTROLLERS if c not in own]
    if missing:
        raise ResourcesUnavailable(f"no cgroup v1 hierarchy of {', '.join(missing)} is mounted")
    resources = Cgroup1Resources(
        worker_dirs={c: folder / f"stockade-{worker_key}" for c, folder in own.items()},
        pids_max=pids_max,
        jobs_shares=jobs_cpu_shares(job_nice, cpus),
    )
    try:
        resources.prepare()
    except OSError as exc:
        raise ResourcesUnavailable(f"cannot set up job cgroups: {exc}") from exc
    return resources


def select_resources(
    choice: str, *, worker_key: str, job_nice: int, pids_max: int, host: Host | None = None
) -> tuple[JobResources, list[str]]:
    """The worker's :class:`agent.resources.JobResources` for the ``job_resources`` setting
    ``choice``: ``auto`` takes the first of cgroup2, cgroup1, rlimit that can be set up here;
    a mode named is that one or an error. Blocking (file system calls): run it in a thread.

    Returns the resources, and why each better mode was not taken (``"cgroup2: ..."``).

    Raises:
        ResourcesUnavailable: ``choice`` names a mode that cannot be used here.
    """
    host = host or Host()
    try:
        located = locate(_read(host.mountinfo), _read(host.self_cgroup))
    except OSError as exc:
        located = Located(
            v2=None, v2_why=f"cannot read {exc.filename}", v1={}, v1_why=f"cannot read {exc.filename}"
        )
    order = list(Mode) if choice == AUTO else [Mode(choice)]
    skipped: list[str] = []
    common: dict[str, Any] = {
        "worker_key": worker_key,
        "job_nice": job_nice,
        "pids_max": pids_max,
        "cpus": host.cpus,
    }
    for mode in order:
        try:
            resources: JobResources
            match mode:
                case Mode.CGROUP2:
                    if located.v2 is None:
                        raise ResourcesUnavailable(located.v2_why)
                    resources = open_cgroup2(located.v2, pid=host.pid, **common)
                case Mode.CGROUP1:
                    if located.v1_why:
                        raise ResourcesUnavailable(located.v1_why)
                    resources = open_cgroup1(located.v1, **common)
                case Mode.RLIMIT:
                    resources = RlimitResources()
            return resources, skipped
        except ResourcesUnavailable as exc:
            if choice != AUTO:
                raise ResourcesUnavailable(f"job_resources {choice} cannot be used here: {exc}") from exc
            skipped.append(f"{mode.value}: {exc}")
    raise AssertionError("rlimit is always available")  # pragma: no cover


def worker_key(settings: AgentSettings) -> str:
    """``<worker_id>-<owner>``: the name of one worker's cgroups (docs/design.md, "Job cgroups")."""
    return f"{settings.worker_id}-{owner_of(settings.work_dir)}"


async def resource_settings(
    settings: AgentSettings, logger: Any, *, host: Host | None = None, keep: Collection[str] = ()
) -> tuple[AgentSettings, JobResources]:
    """The worker's job resources (:func:`select_resources`), once the job cgroups an earlier
    life of this worker left are removed but those named in ``keep`` (jobs whose supervisors still
    run: :mod:`agent.adoption`), with ``settings`` given the label ``resources=<mode>``; the mode,
    where, and why a better one was not taken are logged.

    Raises:
        ResourcesUnavailable: ``settings.job_resources`` names a mode that cannot be used here.
    """
    resources, skipped = await trio.to_thread.run_sync(
        partial(
            select_resources,
            settings.job_resources,
            worker_key=worker_key(settings),
            job_nice=settings.job_nice,
            pids_max=settings.job_pids_max,
            host=host,
        )
    )
    removed = await trio.to_thread.run_sync(resources.remove_leftovers, frozenset(keep))
    if removed:
        logger.warning(
            "removed job cgroups left by an earlier life of this worker", count=len(removed), cgroups=removed
        )
    label = f"{RESOURCES_LABEL}={resources.mode.value}"
    if resources.mode is Mode.RLIMIT:
        logger.warning(
            "job resources: rlimit only, no cgroups: memory_mb is each process's address space "
            "(RLIMIT_AS); cpu_millis and the pids limit are not enforced",
            label=label,
            not_taken=skipped,
        )
    else:
        logger.info(
            f"job resources: {resources.mode.value}: cpu_millis a hard quota, memory_mb a hard limit "
            f"without swap, at most {settings.job_pids_max} processes per job",
            label=label,
            where=resources.where,
            not_taken=skipped,
        )
    return attrs.evolve(
        settings, labels={**settings.labels, RESOURCES_LABEL: resources.mode.value}
    ), resources
