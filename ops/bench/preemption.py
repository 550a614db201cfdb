"""``stockade bench preemption``: how long a job of high priority submitted into a full cluster
waits to run when preemption is on (docs/preemption.md). A local cluster with ``--preemption``
is filled with low-priority command jobs that ignore SIGTERM (so each preemption waits out the
whole grace before its SIGKILL), with more of them queued behind; then, one at a time, a job of
priority 10 that fits no free room is submitted, and the time from its submission to its start
on its worker (the agent's ``start`` line) is measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from ops.bench import operator_client
from ops.bench.settings import PreemptionBenchSettings
from ops.launcher.control import LocalCluster
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.text import read_jsonl

# Running jobs and the alive workers' capacity, cpu_millis.
FULLNESS = """
SELECT (SELECT count(*) FROM jobs WHERE state = 'running') AS running,
       (SELECT coalesce(sum(cpu_allocated_millis), 0) FROM worker_allocations) AS allocated,
       (SELECT coalesce(sum(cpu_millis), 0) FROM workers WHERE state = 'alive') AS capacity
"""


@attrs.frozen(kw_only=True)
class PreemptionBenchReport:
    settings: PreemptionBenchSettings
    waits_s: tuple[float, ...]
    """Per try: from the submission to the start on its worker, seconds."""
    preemptions: int

    @property
    def p50_s(self) -> float | None:
        return round(statistics.median(self.waits_s), 3) if self.waits_s else None

    @property
    def ok(self) -> bool:
        """Every try ran, and the median within the grace plus 1 s."""
        p50 = self.p50_s
        return (
            len(self.waits_s) == self.settings.tries and p50 is not None and p50 <= self.settings.grace_s + 1
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": attrs.asdict(self.settings),
            "waits_s": list(self.waits_s),
            "p50_s": self.p50_s,
            "max_s": max(self.waits_s) if self.waits_s else None,
            "preemptions": self.preemptions,
            "ok": self.ok,
        }


def _filler(settings: PreemptionBenchSettings, n: int) -> pb.JobSpec:
    script = "trap '' TERM; sleep 600" if settings.ignore_term else "sleep 600"
    return pb.JobSpec(
        name=f"filler-{n}",
        cpu_millis=settings.filler_cpu_millis,
        memory_mb=64,
        command=pb.CommandRuntime(argv=["sh", "-c", script]),
    )


def _started_at(cluster: LocalCluster, job_id: int) -> float | None:
    """The agent's ``start`` time (unix s) of ``job_id``'s first run, from any worker's log."""
    for worker in cluster.config().workers:
        path = cluster.state.work_dir(worker.id) / "agent.jsonl"
        if path.exists():
            for record in read_jsonl(path):
                if record.get("event") == "start" and int(record.get("job_id", -1)) == job_id:
                    return float(record["time"])
    return None


async def _fullness(database_url: str) -> tuple[int, int, int]:
    db = await PgConnection.connect(database_url)
    try:
        row = await db.fetchrow(FULLNESS)
    finally:
        await db.close()
    assert row is not None
    return int(row["running"]), int(row["allocated"]), int(row["capacity"])


async def _run(
    settings: PreemptionBenchSettings, cluster: LocalCluster, progress: Callable[[str], None]
) -> PreemptionBenchReport:
    config = cluster.config()
    async with asyncio_bridge(), operator_client(config) as client:
        _, _, capacity = await _fullness(config.database_url)
        # Fill every worker, and queue as many again so that preempted room refills.
        count = 2 * capacity // settings.filler_cpu_millis
        specs = [_filler(settings, n) for n in range(count)]
        await client.call("submit_jobs", pb.SubmitJobsRequest(specs=specs), timeout_s=60)
        deadline = time.monotonic() + settings.timeout_s
        while True:
            running, allocated, capacity = await _fullness(config.database_url)
            progress(f"filling: {running} running, {allocated} of {capacity} cpu_millis allocated")
            if allocated >= capacity:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("the cluster did not fill")
            await trio.sleep(1)
        waits: list[float] = []
        for n in range(settings.tries):
            spec = pb.JobSpec(
                name=f"urgent-{n}",
                cpu_millis=settings.cpu_millis,
                memory_mb=64,
                priority=10,
                sleep=pb.SleepRuntime(duration_ms=500),
            )
            submitted = time.time()
            reply = await client.call("submit_job", pb.SubmitJobRequest(spec=spec))
            job_id = int(reply.job_id)
            deadline = time.monotonic() + settings.timeout_s
            started: float | None = None
            while started is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"job {job_id} of priority 10 did not start")
                await trio.sleep(0.1)
                started = await trio.to_thread.run_sync(_started_at, cluster, job_id)
            waits.append(round(started - submitted, 3))
            progress(f"try {n + 1}: job {job_id} ran {waits[-1]:.2f} s after its submission")
            # Let it end, and the cluster fill again, before the next.
            deadline = time.monotonic() + settings.timeout_s
            while True:
                info = await client.call("get_job", pb.GetJobRequest(job_id=job_id))
                _, allocated, capacity = await _fullness(config.database_url)
                if info.state in ("succeeded", "failed", "cancelled") and allocated >= capacity:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("the cluster did not fill again")
                await trio.sleep(0.2)
        db = await PgConnection.connect(config.database_url)
        try:
            preemptions = int(
                await db.fetchval("SELECT count(*) FROM assignments WHERE end_reason = 'preempted'")
            )
        finally:
            await db.close()
    return PreemptionBenchReport(settings=settings, waits_s=tuple(waits), preemptions=preemptions)


def run_preemption_bench(
    settings: PreemptionBenchSettings, root: Path, progress: Callable[[str], None]
) -> PreemptionBenchReport:
    """Run the bench on a fresh local cluster under ``root`` (stopped afterwards).

    Raises:
        ClusterError: the cluster could not be started.
        TimeoutError: the cluster did not fill, or a job did not start, within ``timeout_s``.
    """
    cluster = LocalCluster(
        root,
        fleet_size=settings.workers,
        cp_args=("--preemption", "--preempt-grace-s", str(settings.grace_s), "--preempt-cooldown-s", "0"),
    )
    try:
        cluster.up(control_planes=3, workers=settings.workers, timeout_s=240)
        return trio.run(_run, settings, cluster, progress)
    finally:
        cluster.down()


def render(report: PreemptionBenchReport) -> str:
    s = report.settings
    waits = report.waits_s
    lines = [
        f"{s.tries} jobs of priority 10 ({s.cpu_millis} cpu_millis) into a full cluster of "
        f"{s.workers} workers, one at a time; fillers of {s.filler_cpu_millis} cpu_millis"
        + (" that ignore SIGTERM" if s.ignore_term else "")
        + f"; preempt grace {s.grace_s:g} s",
        f"submission to start, s: {list(waits)}",
        f"p50 {report.p50_s} s, max {max(waits) if waits else None} s "
        f"(target p50 <= grace + 1 = {s.grace_s + 1:g} s)",
        f"preemptions: {report.preemptions}",
        f"ok: {report.ok}",
    ]
    return "\n".join(lines)
