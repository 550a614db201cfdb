"""A job's usage measured from the machine's real cgroups, with real processes: what the agent's
measure (:func:`agent.usage.read_usage`, :class:`agent.usage.UsageMeter`) reads of a job spinning
on two cores with cpu_millis 2000.

The job is given the machine's CPU first (its worker's cgroup at the largest weight the kernel
takes), so that it really spins on two cores however busy the machine is; an agent's jobs have
the lowest weight (``job_nice``), and on a busy machine they get less, and read less (the e2e
test ``test_usage_on_a_cluster.py`` reads that through a whole cluster). It skips, saying why,
where the machine has no usable cgroups, or fewer than two CPUs.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from test_job_cgroups import _wait_for_cgroup, resources  # noqa: F401 (resources: a fixture)

from agent.cgroups import Cgroup1Resources, Cgroup2Resources
from agent.messages import WORKER_TOTAL
from agent.resources import JobLimits, JobResources
from agent.runtimes import run_job
from agent.usage import UsageMeter, read_usage
from runtime.jobs import CommandRuntime

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="cgroups are Linux's")

SPIN_2 = ("python3", "-c", "import os\nos.fork()\nwhile True:\n    pass\n")
SPAN_S = 5.0
"""The span measured: the agent's default usage_interval_s."""


def _job_pids(found: JobResources, name: str) -> set[int]:
    """The processes in the job's cgroup, each once (cgroup v1 lists them in every hierarchy)."""
    confined = found.find(name)
    assert confined is not None
    return {
        int(pid) for procs in confined.confinement.cgroup_procs for pid in Path(procs).read_text().split()
    }


def _processes_cpu_s(found: JobResources, name: str) -> float:
    """The CPU time of the processes in the job's cgroup (utime + stime in /proc), in seconds:
    the kernel's count per process, apart from the cgroup's own counters."""
    ticks = 0
    for pid in _job_pids(found, name):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def _first_in_line(found: JobResources) -> None:
    """Give the worker's jobs the largest CPU weight the kernel takes (v1 ``cpu.shares``, v2
    ``cpu.weight`` of the jobs' groups)."""
    if isinstance(found, Cgroup1Resources):
        (found.worker_dirs["cpu"] / "cpu.shares").write_text("262144")
    elif isinstance(found, Cgroup2Resources):
        for folder in (found.worker_dir.parent, found.worker_dir):
            (folder / "cpu.weight").write_text("10000")


async def test_a_job_spinning_on_two_cores_with_cpu_millis_2000_reads_1_8_to_2_cores(
    tmp_path: Path,
    resources: JobResources,  # noqa: F811 (the fixture imported above)
) -> None:
    """Two processes spinning in a job of cpu_millis 2000 that has the CPU it wants: a sample
    over 5 s reads 1800 to 2000 millicores (2020: a read's time is the middle of its reads), as
    the kernel's count of its processes' CPU time over the sample's span says (within 60), and so
    does the worker's total; memory a few MiB. The job is stopped while both counts are read, so
    they agree however long this process waits for a core (beside other work)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("fewer than two CPUs: a job cannot spin on two cores here")
    _first_in_line(resources)
    stop = trio.Event()
    meter = UsageMeter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: run_job(
                CommandRuntime(argv=SPIN_2),
                job_dir=tmp_path / "1-1",
                stop=stop,
                stop_grace_s=0.5,
                resources=resources,
                limits=JobLimits(cpu_millis=2000, memory_mb=64),
            )
        )
        await _wait_for_cgroup(resources, "1-1")
        await trio.sleep(0.5)  # both processes spinning
        names = {1: "1-1"}

        def measure() -> tuple[dict[int, Any], dict[int, float], float]:
            # The cgroup's counters and the kernel's count of the job's processes, read while
            # the job is stopped: both are the CPU time up to the same moment.
            pids = _job_pids(resources, "1-1")
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                readings, read_at_s = read_usage(resources, names)
                return readings, read_at_s, _processes_cpu_s(resources, "1-1")
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)

        readings, read_at_s, cpu_began = await trio.to_thread.run_sync(measure)
        meter.samples(readings, read_at_s)
        await trio.sleep(SPAN_S)
        readings, read_at_s, cpu_ended = await trio.to_thread.run_sync(measure)
        samples = meter.samples(readings, read_at_s)
        stop.set()
    by_id = {s.assignment_id: s for s in samples}
    kernel_millis = (cpu_ended - cpu_began) / (by_id[1].span_ms / 1000) * 1000
    print(f"a job spinning on two cores, cpu_millis 2000: {by_id}; its processes: {kernel_millis:.0f} millis")
    assert abs(by_id[1].cpu_millis - kernel_millis) <= 60, (by_id[1], kernel_millis)
    assert 1800 <= by_id[1].cpu_millis <= 2020, by_id[1]
    assert 1800 <= by_id[WORKER_TOTAL].cpu_millis <= 2020, by_id[WORKER_TOTAL]
    assert 0 < by_id[1].memory_mb <= 64 and by_id[1].span_ms >= SPAN_S * 1000 - 10
