"""Command jobs held to their limits by the machine's real cgroups, with real processes.

Each test takes the mode this machine gives an agent (:func:`agent.cgroups.select_resources`,
``auto``) for a worker of its own, runs jobs through :func:`agent.runtimes.run_job` and reads
what the job's cgroup counted. They skip, saying why, where the machine has no usable cgroups
(``rlimit``: not root, or no hierarchies); the development machine has cgroup v1 only for the
controllers (an empty cgroup2 beside it), so there they exercise cgroup v1, and a machine with
a delegated cgroup v2 would run them on v2.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

from agent.cgroup_mounts import locate
from agent.cgroups import select_resources
from agent.job_results import JobResult
from agent.messages import JobState
from agent.resources import ConfinedJob, Confinement, JobLimits, JobResources, JobUsage, Mode
from agent.runtimes import run_job
from runtime.jobs import CommandRuntime

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="cgroups are Linux's")

LIMITS = JobLimits(cpu_millis=500, memory_mb=64)
SPIN_4 = ("sh", "-c", "for i in 1 2 3 4; do (while :; do :; done) & done; wait")


def _read(path: str) -> str:
    return Path(path).read_text()


def _key() -> str:
    return f"w-t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def resources() -> Iterator[JobResources]:
    """This machine's mode for a worker of the test's own, with 32 processes per job; removed after."""
    found, skipped = select_resources("auto", worker_key=_key(), job_nice=10, pids_max=32)
    if found.mode is Mode.RLIMIT:
        pytest.skip(f"no usable cgroups on this machine: {'; '.join(skipped)}")
    try:
        yield found
    finally:
        found.remove_leftovers()
        found.close()


async def _run(
    argv: tuple[str, ...], job_dir: Path, resources: JobResources, stop: trio.Event | None = None
) -> JobResult:
    return await run_job(
        CommandRuntime(argv=argv),
        job_dir=job_dir,
        stop=trio.Event() if stop is None else stop,
        stop_grace_s=0.5,
        resources=resources,
        limits=LIMITS,
    )


async def _wait_for_cgroup(resources: JobResources, name: str) -> None:
    with trio.fail_after(10):
        while resources.find(name) is None:  # noqa: ASYNC110 (the kernel's files: nothing to wait on)
            await trio.sleep(0.01)


def _quota_us(confined: ConfinedJob) -> tuple[int, int] | None:
    """The CFS quota and period of the job's cgroup, in microseconds (cgroup v2 ``cpu.max`` or
    v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``), or None where none is found."""
    for procs in confined.confinement.cgroup_procs:
        folder = Path(procs).parent
        if (folder / "cpu.max").exists():
            quota, period = (folder / "cpu.max").read_text().split()
            return int(quota), int(period)
        if (folder / "cpu.cfs_quota_us").exists():
            quota_us = int((folder / "cpu.cfs_quota_us").read_text())
            return quota_us, int((folder / "cpu.cfs_period_us").read_text())
    return None


THROTTLE_WAIT_S = 10.0
"""How long the test waits for the kernel to throttle the job: on an idle machine the first
period does; on one whose other processes take the CPU (the job's group has the lowest weight),
the job may never get its quota's worth in a period, and then it is not throttled."""


async def test_a_job_of_500_millicores_spinning_on_four_processes_is_held_to_its_quota(
    tmp_path: Path, resources: JobResources
) -> None:
    """Four busy loops in a job asking 500 millicores get well under the cores they want: its
    cgroup's quota is 0.5 of a core, it used less than 0.75 of a core by its own cgroup's
    accounting, and the quota throttled it, or else the machine gave it less than its quota
    (others took the CPU), which a throttle cannot show."""
    stop = trio.Event()
    used: list[JobUsage] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, SPIN_4, tmp_path / "1-1", resources, stop)
        await _wait_for_cgroup(resources, "1-1")
        confined = resources.find("1-1")
        assert confined is not None
        assert _quota_us(confined) == (50_000, 100_000)
        began = time.monotonic()
        used.append(confined.usage())
        # At least two seconds of accounting, and until a throttled period shows (or the wait ends).
        await trio.sleep(2.0)
        with trio.move_on_after(THROTTLE_WAIT_S):
            while not confined.usage().throttled_periods:  # noqa: ASYNC110 (the kernel's counters)
                await trio.sleep(0.1)
        used.append(confined.usage())
        elapsed_s = time.monotonic() - began
        stop.set()
    first, last = used
    if first.cpu_s is None or last.cpu_s is None:
        pytest.skip("this machine's cgroups do not count CPU time (no cpuacct hierarchy)")
    cores = (last.cpu_s - first.cpu_s) / elapsed_s
    assert cores < 0.75, f"the job got {cores:.2f} cores"
    assert last.throttled_periods is not None
    if last.throttled_periods == 0:
        assert cores < 0.5, f"the job got {cores:.2f} cores in {elapsed_s:.1f} s and was never throttled"


async def test_a_job_over_its_memory_is_oom_killed_and_fails_saying_so(
    tmp_path: Path, resources: JobResources
) -> None:
    """A job of 64 MiB that fills 128 MiB is killed by the kernel and ends failed, its detail
    starting with oom_killed."""
    result = await _run(("python3", "-c", "x = b'x' * (128 * 2**20)"), tmp_path / "1-1", resources)
    assert result.state is JobState.FAILED
    assert result.detail.startswith("oom_killed: the kernel killed it: it used more than its memory_mb of 64")


async def test_a_fork_bomb_stops_at_the_pids_limit(tmp_path: Path, resources: JobResources) -> None:
    """A job that tries 2000 forks gets no more processes than its pids limit (32 here): the
    forks past it fail, and the job ends on its own."""
    bomb = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(2000):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    made += 1\n"
        "print(made)\n"
    )
    result = await _run(("python3", "-c", bomb), tmp_path / "1-1", resources)
    assert result.state is JobState.SUCCEEDED, result.detail
    made = int(_read(result.stdout_path))
    assert made < 32  # the job's own process counts too


async def test_the_jobs_cgroup_is_gone_once_it_has_ended_also_when_stopped(
    tmp_path: Path, resources: JobResources
) -> None:
    """After a job that ended on its own and one that was stopped, no cgroup of theirs is left."""
    await _run(("true",), tmp_path / "1-1", resources)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, ("sleep", "60"), tmp_path / "2-2", resources, stop)
        await _wait_for_cgroup(resources, "2-2")
        stop.set()
    assert resources.find("1-1") is None and resources.find("2-2") is None
    assert resources.remove_leftovers() == []


async def test_the_reaper_stays_outside_the_cgroup_its_job_runs_in(
    tmp_path: Path, resources: JobResources
) -> None:
    """The job's process is in its job's cgroup in every hierarchy; its parent, the reaper, in none."""
    script = "cat /proc/self/cgroup; echo ---; cat /proc/$PPID/cgroup"
    result = await _run(("sh", "-c", script), tmp_path / "3-4", resources)
    job, reaper_lines = _read(result.stdout_path).split("---\n")
    mine = [line for line in job.splitlines() if line.endswith("/3-4")]
    assert len(mine) >= (1 if resources.mode is Mode.CGROUP2 else 3)  # cpu, memory, pids (v1)
    assert not any("/3-4" in line for line in reaper_lines.splitlines())


def test_leftover_job_cgroups_of_an_earlier_life_are_removed_at_start_with_their_processes() -> None:
    """A job cgroup an earlier life left, with a process still in it: the next start of the same
    worker kills the process and removes the cgroup."""
    key = _key()
    first, _ = select_resources("auto", worker_key=key, job_nice=10, pids_max=32)
    if first.mode is Mode.RLIMIT:
        pytest.skip("no usable cgroups on this machine")
    try:
        confined = first.confine("5-6", LIMITS)
        procs = confined.confinement.cgroup_procs

        def join() -> None:
            for path in procs:
                with open(path, "w") as file:
                    file.write("0")

        leftover = subprocess.Popen(["sleep", "60"], preexec_fn=join)
        again, _ = select_resources("auto", worker_key=key, job_nice=10, pids_max=32)
        removed = again.remove_leftovers()
        assert len(removed) == len(procs) and all(p.endswith("/5-6") for p in removed)
        assert leftover.wait(timeout=5) == -9
        assert again.find("5-6") is None
    finally:
        first.remove_leftovers()
        first.close()


@attrs.frozen
class _Confined:
    name: str
    confinement: Confinement

    def usage(self) -> JobUsage:
        return JobUsage()

    def remove(self) -> bool:
        return True


@attrs.frozen
class _BrokenResources:
    """Resources whose cgroup cannot be joined (``procs`` names no cgroup), or not made at all."""

    procs: str = ""
    mode: Mode = Mode.CGROUP1
    where: str = ""

    def confine(self, name: str, limits: JobLimits) -> _Confined:
        if not self.procs:
            raise PermissionError(13, "Permission denied", "/sys/fs/cgroup/memory/x")
        return _Confined(name=name, confinement=Confinement(cgroup_procs=(self.procs,)))

    def find(self, name: str) -> None:
        return None

    def remove_leftovers(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


@attrs.frozen
class _FixedResources:
    """Resources that give every job ``confinement`` (and remove nothing)."""

    confinement: Confinement
    mode: Mode = Mode.CGROUP2
    where: str = ""

    def confine(self, name: str, limits: JobLimits) -> _Confined:
        return _Confined(name=name, confinement=self.confinement)

    def find(self, name: str) -> None:
        return None

    def remove_leftovers(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


async def test_a_job_that_cannot_join_its_cgroup_never_runs(tmp_path: Path) -> None:
    """Its process fails to write itself into the cgroup: the command is not exec'd, and the job
    fails unstarted with a resources_error naming the file."""
    marker = tmp_path / "ran"
    broken = _BrokenResources(procs=str(tmp_path / "no-such-cgroup" / "cgroup.procs"))
    result = await _run(("touch", str(marker)), tmp_path / "1-1", broken)  # type: ignore[arg-type]
    assert (result.state, result.started) == (JobState.FAILED, False)
    assert result.detail.startswith("resources_error: cannot confine 'touch' to its limits: ")
    assert "no-such-cgroup/cgroup.procs: [Errno 2]" in result.detail
    assert not marker.exists()


async def test_a_job_whose_cgroup_cannot_be_made_is_not_started(tmp_path: Path) -> None:
    """The agent cannot make the cgroup: no reaper is started, and the job fails saying why."""
    marker = tmp_path / "ran"
    result = await _run(("touch", str(marker)), tmp_path / "1-1", _BrokenResources())  # type: ignore[arg-type]
    assert (result.state, result.started) == (JobState.FAILED, False)
    assert result.detail.startswith("resources_error: cannot make the job's cgroup: [Errno 13]")
    assert not marker.exists()


async def test_rlimit_mode_gives_each_process_the_jobs_memory_as_its_address_space(tmp_path: Path) -> None:
    """Forced to rlimit, a job's processes run with RLIMIT_AS = memory_mb (soft and hard), and
    one that fills twice its memory fails for want of it (MemoryError), no cgroup involved."""
    forced, _ = select_resources("rlimit", worker_key=_key(), job_nice=10, pids_max=32)
    assert forced.mode is Mode.RLIMIT
    result = await _run(("grep", "Max address space", "/proc/self/limits"), tmp_path / "1-1", forced)
    assert _read(result.stdout_path).split()[3:5] == [str(64 * 2**20)] * 2
    result = await _run(("python3", "-c", "x = b'x' * (128 * 2**20)"), tmp_path / "2-2", forced)
    assert (result.state, result.exit_code) == (JobState.FAILED, 1)
    assert "MemoryError" in _read(result.stderr_path)


@pytest.fixture
def unified_cgroup() -> Iterator[Path]:
    """A fresh cgroup in this machine's unified hierarchy (controllers or not), removed after."""
    located = locate(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    if located.v2 is None:
        pytest.skip(f"no cgroup v2 here: {located.v2_why}")
    folder = located.v2 / f"stockade-test-{uuid.uuid4().hex[:12]}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup v2 here: {exc}")
    try:
        yield folder
    finally:
        folder.rmdir()


def _v2_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("0::"))


@pytest.mark.parametrize("born_inside", [True, False])
async def test_a_v2_jobs_process_is_born_in_its_cgroup_or_joins_it_after_the_fork(
    tmp_path: Path, unified_cgroup: Path, born_inside: bool
) -> None:
    """With clone_into the job's process starts in its v2 cgroup (clone3, CLONE_INTO_CGROUP);
    where that cannot be done (here: a folder that is no cgroup), it joins the cgroup after the
    fork. Either way the job runs there and its reaper does not. (Real on this machine's
    unified hierarchy, which has no controllers here: the placement is tested, not limits.)"""
    confinement = Confinement(
        cgroup_procs=(str(unified_cgroup / "cgroup.procs"),),
        clone_into=str(unified_cgroup if born_inside else tmp_path),
    )
    resources = _FixedResources(confinement=confinement)
    script = "cat /proc/self/cgroup; echo ---; cat /proc/$PPID/cgroup"
    result = await _run(("sh", "-c", script), tmp_path / "1-1", resources)  # type: ignore[arg-type]
    assert result.state is JobState.SUCCEEDED, result.detail
    job, reaper_lines = _read(result.stdout_path).split("---\n")
    assert _v2_line(job).endswith(f"/{unified_cgroup.name}")
    assert not _v2_line(reaper_lines).endswith(f"/{unified_cgroup.name}")


async def test_a_worker_folder_removed_meanwhile_is_made_again_for_the_next_job(
    tmp_path: Path, resources: JobResources
) -> None:
    """Someone removed the worker's (empty) cgroup folders while its agent ran: its next job
    gets them back, and its limits."""
    resources.close()
    result = await _run(("python3", "-c", "x = b'x' * (128 * 2**20)"), tmp_path / "1-1", resources)
    assert result.detail.startswith("oom_killed:")
