"""Enforced resources for command jobs: the modes (:class:`Mode`, chosen at agent start by
:func:`agent.cgroups.select_resources`), the arithmetic both cgroup versions apply, a job's
confinement (:class:`JobResources`, :class:`ConfinedJob`, :func:`release`) and the detail of a job
the OOM killer hit. docs/design.md, "Job runtimes", says what each mode enforces.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Protocol

import attrs
import trio

from runtime import log

RESOURCES_LABEL = "resources"
"""The worker label that says how its command jobs' resources are enforced (a :class:`Mode`)."""

CPU_PERIOD_US = 100_000
"""The CFS bandwidth period of every job, in microseconds (100 ms, the kernel's default)."""
MIN_CPU_QUOTA_US = 1_000
"""The smallest CFS quota the kernel takes, in microseconds (``min_cfs_quota_period``, 1 ms,
in ``kernel/sched/core.c``): a job under 10 millicores gets 10."""

NICE_TO_WEIGHT = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
"""The CFS weight of a task at nice 0..19 (``sched_prio_to_weight`` in ``kernel/sched/core.c``;
nice 0 = 1024, each step about 1.25 times less)."""
CGROUP2_DEFAULT_WEIGHT = 100
"""``cpu.weight`` of a cgroup nobody set (cgroup v2), the equivalent of 1024 (nice 0)."""


class Mode(enum.StrEnum):
    """How a worker enforces its command jobs' resources (the worker label ``resources``)."""

    CGROUP2 = "cgroup2"
    CGROUP1 = "cgroup1"
    RLIMIT = "rlimit"


@attrs.frozen(kw_only=True)
class JobLimits:
    """What one command job asked for."""

    cpu_millis: int
    """CPU, in millicores (1000 = one core)."""
    memory_mb: int
    """Memory, in MiB."""


def cpu_quota_us(cpu_millis: int) -> int:
    """The CFS quota per :data:`CPU_PERIOD_US` of a job of ``cpu_millis``, in microseconds:
    ``cpu_millis * 100`` (1000 millicores = the whole period = one core), at least
    :data:`MIN_CPU_QUOTA_US`."""
    return max(MIN_CPU_QUOTA_US, cpu_millis * CPU_PERIOD_US // 1000)


def memory_limit_bytes(memory_mb: int) -> int:
    """A job's memory limit in bytes: ``memory_mb`` MiB."""
    return memory_mb * 2**20


def jobs_cpu_shares(job_nice: int, cpus: int = 1) -> int:
    """``cpu.shares`` (cgroup v1) of the group that holds a worker's jobs: what one task at
    ``job_nice`` weighs (:data:`NICE_TO_WEIGHT`) per CPU of ``cpus``, 2..262144 (the kernel's
    range): on each CPU the jobs together weigh about one such task, however many they are."""
    weight = NICE_TO_WEIGHT[min(max(job_nice, 0), len(NICE_TO_WEIGHT) - 1)]
    return min(262_144, max(2, weight * max(1, cpus)))


def jobs_cpu_weight(job_nice: int, cpus: int = 1) -> int:
    """``cpu.weight`` (cgroup v2) of the group that holds the agent's jobs, beside the agent's
    own cgroup (weight 100): :func:`jobs_cpu_shares` on the v2 scale (1024 -> 100, rounded to
    the closest, as the kernel converts ``cpu.weight.nice``), 1..10000."""
    return min(10_000, max(1, round(jobs_cpu_shares(job_nice, cpus) * CGROUP2_DEFAULT_WEIGHT / 1024)))


def job_cpu_shares(cpu_millis: int) -> int:
    """``cpu.shares`` (cgroup v1) of one job among the worker's others: 1024 per core asked
    for (Kubernetes' rule for requests), at least 2 and at most 262144 (the kernel's range)."""
    return min(262_144, max(2, cpu_millis * 1024 // 1000))


def job_cpu_weight(cpu_millis: int) -> int:
    """``cpu.weight`` (cgroup v2) of one job among the worker's others: 100 (the default) per
    core asked for, 1..10000."""
    return min(10_000, max(1, cpu_millis * CGROUP2_DEFAULT_WEIGHT // 1000))


def oom_detail(memory_mb: int, exit_detail: str) -> str:
    """The detail of a job the kernel's OOM killer hit in its cgroup; its prefix ``oom_killed``
    is the reason the control plane records (``record_outcomes`` in ``schema.sql``)."""
    return (
        f"oom_killed: the kernel killed it: it used more than its memory_mb of {memory_mb} "
        f"(no swap) ({exit_detail})"
    )


@attrs.frozen(kw_only=True)
class Confinement:
    """What a job's own process applies to itself between fork and exec (see
    :func:`agent.reaper.reaper_argv`)."""

    cgroup_procs: tuple[str, ...] = ()
    """The ``cgroup.procs`` files it writes itself into (one per v1 hierarchy; one in v2)."""
    address_space_bytes: int | None = None
    """``RLIMIT_AS`` (soft and hard), or None: unchanged."""
    clone_into: str | None = None
    """cgroup v2: the job's cgroup folder, for its process to be born in (``clone3`` with
    ``CLONE_INTO_CGROUP``); None: fork, then join :attr:`cgroup_procs`."""


@attrs.frozen(kw_only=True)
class JobUsage:
    """What a job's cgroup counted (None where the mode or the kernel does not count it)."""

    cpu_s: float | None = None
    """CPU time used, in seconds."""
    throttled_periods: int | None = None
    """CFS periods in which the quota held the job back."""
    oom_kills: int = 0
    """Processes of the job the kernel's OOM killer killed."""
    memory_bytes: int | None = None
    """Memory it holds now (``memory.current``; v1: ``memory.usage_in_bytes``), in bytes."""


class ConfinedJob(Protocol):
    """One job's confinement, from before its start until removed."""

    @property
    def confinement(self) -> Confinement:
        """What the job's process applies to itself."""

    @property
    def name(self) -> str:
        """The job's name among its worker's (``<job_id>-<assignment_id>``)."""

    def usage(self) -> JobUsage:
        """What its cgroup counted so far (zeros and Nones without one)."""

    def remove(self) -> bool:
        """Remove its cgroup; True once it is gone. One that still holds processes has them
        SIGKILLed and stays for now: call again a little later."""


class JobResources(Protocol):
    """One worker's way of enforcing its command jobs' resources, chosen at agent start."""

    @property
    def mode(self) -> Mode:
        """Which mode (the worker label ``resources``)."""

    @property
    def where(self) -> str:
        """Where its jobs' cgroups are (empty without cgroups), for the log line."""

    def confine(self, name: str, limits: JobLimits) -> ConfinedJob:
        """Make a job's confinement (its cgroup, with the limits written) before it starts;
        raises OSError when the cgroup cannot be created or its limits written."""

    def find(self, name: str) -> ConfinedJob | None:
        """The confinement of a running job ``name``, or None (for measurements and tests)."""

    def jobs_usage(self) -> JobUsage:
        """What the worker's jobs' cgroups counted together, those that ended included (the
        worker's own folder's counters); zeros and Nones without cgroups."""

    def remove_leftovers(self, keep: Collection[str] = ()) -> list[str]:
        """Remove the job cgroups an earlier life of this worker left (killing what still
        runs in them), but those named in ``keep``; return their paths."""

    def close(self) -> None:
        """Remove what the worker's jobs shared (once every job has ended); errors are ignored."""


@attrs.frozen(kw_only=True)
class UncountedJob:
    """A job with no cgroup of its own (under rlimits only): nothing to count, nothing to remove."""

    name: str
    confinement: Confinement

    def usage(self) -> JobUsage:
        return JobUsage()

    def remove(self) -> bool:
        return True


@attrs.frozen(kw_only=True)
class RlimitResources:
    """The fallback without cgroups: ``RLIMIT_AS`` = the job's memory for each of its
    processes; CPU and processes are not enforced (docs/design.md, "Job runtimes")."""

    mode: Mode = Mode.RLIMIT
    where: str = ""

    def confine(self, name: str, limits: JobLimits) -> ConfinedJob:
        return UncountedJob(
            name=name, confinement=Confinement(address_space_bytes=memory_limit_bytes(limits.memory_mb))
        )

    def find(self, name: str) -> ConfinedJob | None:
        return None

    def jobs_usage(self) -> JobUsage:
        return JobUsage()

    def remove_leftovers(self, keep: Collection[str] = ()) -> list[str]:
        return []

    def close(self) -> None:
        pass


RELEASE_RETRIES_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""The waits between attempts to remove a job's cgroup that still holds processes (each
attempt SIGKILLs them), in seconds: about 2 s in all."""


async def release(job: ConfinedJob) -> JobUsage:
    """Read what ``job``'s cgroup counted, then remove it, once its reaper has exited; return
    the usage. Shielded from cancellation. One that cannot be removed after
    :data:`RELEASE_RETRIES_S` is logged and left for the next start of the agent."""
    with trio.CancelScope(shield=True):
        usage = job.usage()
        for wait_s in RELEASE_RETRIES_S:
            try:
                if job.remove():
                    break
            except OSError as exc:
                log.get("agent").warning("cannot remove a job's cgroup", job=job.name, error=str(exc))
                break
            await trio.sleep(wait_s)
        else:
            log.get("agent").warning(
                "a job's cgroup still holds processes: left for the next start", job=job.name
            )
    return usage
