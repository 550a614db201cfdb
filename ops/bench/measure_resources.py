"""What enforcing a command job's resources does, measured: the CPU a job gets against its
quota, and what the confinement adds to each job's start.

``python -m ops.bench.measure_resources [--mode auto] [--spin-s 10] [--burners 2] [--starts 200]
[--v2-placement]``, where an agent would run (root, for the cgroup modes on most machines);
nothing is left behind. What it runs and the figures: docs/benchmarks.md, "Enforced job
resources".
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
import trio

from agent.cgroup_mounts import Located, locate
from agent.cgroups import select_resources
from agent.resources import ConfinedJob, Confinement, JobLimits, JobResources, RlimitResources
from agent.runtimes import run_job
from runtime.jobs import CommandRuntime

SPIN_4 = ("sh", "-c", "for i in 1 2 3 4; do (while :; do :; done) & done; wait")
BURNER = ["sh", "-c", "while :; do :; done"]


async def _spin(
    resources: JobResources, root: Path, limits: JobLimits, spin_s: float
) -> tuple[float, int | None]:
    """Cores the spinning job got over ``spin_s`` (after a 1 s start), and its throttled periods."""
    stop = trio.Event()
    result: list[tuple[float, int | None]] = []
    async with trio.open_nursery() as nursery:

        async def job() -> None:
            await run_job(
                CommandRuntime(argv=SPIN_4),
                job_dir=root / "1-1",
                stop=stop,
                stop_grace_s=0.5,
                resources=resources,
                limits=limits,
            )

        nursery.start_soon(job)
        while resources.find("1-1") is None:  # noqa: ASYNC110 (the kernel's files: nothing to wait on)
            await trio.sleep(0.01)
        confined = resources.find("1-1")
        assert confined is not None
        await trio.sleep(1.0)
        first, began = confined.usage(), time.monotonic()
        await trio.sleep(spin_s)
        last, elapsed_s = confined.usage(), time.monotonic() - began
        stop.set()
        if first.cpu_s is None or last.cpu_s is None:
            raise SystemExit(f"{resources.mode}: no CPU accounting here, nothing to measure")
        throttled = None
        if last.throttled_periods is not None and first.throttled_periods is not None:
            throttled = last.throttled_periods - first.throttled_periods
        result.append(((last.cpu_s - first.cpu_s) / elapsed_s, throttled))
    return result[0]


async def _starts(
    resources: JobResources, root: Path, limits: JobLimits, count: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"confined": [], "unconfined": [], "confine": [], "release": []}
    for index in range(count):
        confined = index % 2 == 0
        took_s = await _true_job(
            root / f"{index + 10}-{index + 10}", resources if confined else None, limits if confined else None
        )
        times["confined" if confined else "unconfined"].append(took_s)
    for index in range(count // 2):
        began = time.perf_counter()
        job = resources.confine(f"{index + 10_000}-1", limits)
        made = time.perf_counter()
        job.remove()
        times["confine"].append(made - began)
        times["release"].append(time.perf_counter() - made)
    return times


async def _true_job(job_dir: Path, resources: JobResources | None, limits: JobLimits | None) -> float:
    """Seconds a ``true`` job took, end to end."""
    began = time.perf_counter()
    await run_job(
        CommandRuntime(argv=("true",)),
        job_dir=job_dir,
        stop=trio.Event(),
        stop_grace_s=0.5,
        resources=resources,
        limits=limits,
    )
    return time.perf_counter() - began


@attrs.frozen
class _Placement:
    """Resources that only place every job in one cgroup v2 (no limits, nothing removed)."""

    folder: Path
    born_inside: bool

    def confine(self, name: str, limits: JobLimits) -> ConfinedJob:
        """A job placed in the folder: as one under rlimits (nothing counted, nothing to
        remove), but with this confinement."""
        procs = (str(self.folder / "cgroup.procs"),)
        clone_into = str(self.folder) if self.born_inside else None
        unconfined: Any = RlimitResources().confine(name, limits)  # an attrs class
        return attrs.evolve(unconfined, confinement=Confinement(cgroup_procs=procs, clone_into=clone_into))


def _located_here() -> Located:
    return locate(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())


async def _v2_placement(root: Path, count: int) -> str:
    located = _located_here()
    if located.v2 is None:
        return f"v2 placement: no cgroup2 here ({located.v2_why})"
    folder = located.v2 / f"stockade-measure-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    try:
        times: dict[str, list[float]] = {"born": [], "moved": [], "none": []}
        limits = JobLimits(cpu_millis=500, memory_mb=256)
        for index in range(count):
            kind = ("born", "moved", "none")[index % 3]
            resources = None if kind == "none" else _Placement(folder=folder, born_inside=kind == "born")
            times[kind].append(await _true_job(root / f"v2-{index}", resources, limits))  # type: ignore[arg-type]
    finally:
        folder.rmdir()
    return (
        f"v2 placement ({folder.parent}): a true job end to end, median of {count // 3} each: "
        f"{_ms(times['born'])} born in its cgroup, {_ms(times['moved'])} moved there, "
        f"{_ms(times['none'])} neither"
    )


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} ms"


async def _main(args: argparse.Namespace) -> None:
    resources, skipped = select_resources(
        args.mode, worker_key=f"measure-{uuid.uuid4().hex[:12]}", job_nice=args.job_nice, pids_max=4096
    )
    print(f"mode: {resources.mode.value} {resources.where}")
    for reason in skipped:
        print(f"  not taken: {reason}")
    limits = JobLimits(cpu_millis=args.cpu_millis, memory_mb=256)
    burners: list[trio.Process] = []
    try:
        with tempfile.TemporaryDirectory(prefix="stockade-measure-") as folder:
            root = Path(folder)
            if resources.mode.value != "rlimit":
                burners = [await trio.lowlevel.open_process(BURNER) for _ in range(args.burners)]
                cores, throttled = await _spin(resources, root, limits, args.spin_s)
                for burner in burners:
                    burner.kill()
                    await burner.wait()
                burners = []
                print(
                    f"cpu: a {args.cpu_millis}-millicore job spinning on 4 processes got {cores:.3f} cores "
                    f"over {args.spin_s:g} s ({throttled} periods throttled), beside {args.burners} burners"
                )
            times = await _starts(resources, root, limits, args.starts)
            print(
                f"start: a true job end to end, median of {args.starts // 2} each: "
                f"{_ms(times['confined'])} confined, {_ms(times['unconfined'])} not; "
                f"making a job's cgroup {_ms(times['confine'])}, removing it {_ms(times['release'])}"
            )
            if args.v2_placement:
                print(await _v2_placement(root, args.starts))
    finally:
        for burner in burners:
            burner.kill()
        resources.remove_leftovers()
        resources.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="auto", choices=["auto", "cgroup2", "cgroup1", "rlimit"])
    parser.add_argument("--cpu-millis", type=int, default=500)
    parser.add_argument("--spin-s", type=float, default=10.0)
    parser.add_argument("--burners", type=int, default=0)
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--job-nice", type=int, default=10)
    parser.add_argument("--v2-placement", action="store_true")
    trio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
