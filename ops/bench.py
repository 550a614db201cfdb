"""``stockade bench``: benchmarks that print numbers. Timing goals live here, never in tests.

``failover`` measures, on a fresh local cluster (3 control planes, 5 workers, jobs running),
the time from a fault to a new leader with a higher epoch answering, for repeated SIGKILLs,
SIGSTOP freezes (longer than the lease) and clean stops (SIGTERM), and the time from a
worker's SIGKILL until every job it ran is running on another worker.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import attrs
import trio

from ops.chaos import ChaosSettings, Harness
from ops.cluster import LocalCluster
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient


@attrs.frozen(kw_only=True)
class FailoverBenchSettings:
    """How many of each fault to inject."""

    kills: int = 10
    freezes: int = 10
    stops: int = 10
    worker_kills: int = 10
    workers: int = 5
    long_jobs: int = 24
    """Sleep jobs (500 cpu_millis, 256 MiB, 10 minutes) kept running so killed workers have jobs to move."""


def _summary(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return round(statistics.median(values), 3), round(max(values), 3)


async def run_failover_bench(
    settings: FailoverBenchSettings, cluster: LocalCluster, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the faults one after the other and return the figures (seconds) with stable keys:
    ``failover_kill_p50_s``, ``failover_kill_max_s``, ``failover_freeze_p50_s``,
    ``failover_freeze_max_s``, ``failover_stop_p50_s``, ``failover_stop_max_s``,
    ``worker_recovery_p50_s``, ``worker_recovery_max_s``, and the raw samples."""
    harness = Harness(
        settings=ChaosSettings(failovers=0, workers=settings.workers, mid_transaction_every=0),
        cluster=cluster,
        progress=progress,
    )
    await trio.to_thread.run_sync(harness.fresh_cluster)
    addresses = cluster.config().control_plane_addresses
    recoveries: list[float] = []
    async with asyncio_bridge():
        client = ControlPlaneClient(addresses, timeout_s=1.0)
        try:
            for index in range(settings.long_jobs):
                spec = pb.JobSpec(
                    name=f"bench-long-{index}",
                    cpu_millis=500,
                    memory_mb=256,
                    sleep=pb.SleepRuntime(duration_ms=600_000),
                )
                await client.call("submit_job", pb.SubmitJobRequest(spec=spec))
            for round_ in range(max(settings.kills, settings.freezes, settings.stops, settings.worker_kills)):
                failovers_before, recoveries_before = len(harness.result.failovers), len(recoveries)
                if round_ < settings.kills:
                    await harness.kill_leader(client, cluster.state)
                if round_ < settings.freezes:
                    await harness.freeze_leader(client, cluster.state, in_transaction=False)
                if round_ < settings.stops:
                    await harness.stop_leader(client)
                if round_ < settings.worker_kills:
                    recoveries.append(await harness.kill_busiest_worker(client, cluster.state))
                this_round = harness.result.failovers[failovers_before:]
                progress(
                    f"round {round_ + 1}: "
                    + ", ".join(f"{f.kind} {f.seconds:.2f} s" for f in this_round)
                    + (
                        f", worker recovery {recoveries[-1]:.2f} s"
                        if len(recoveries) > recoveries_before
                        else ""
                    )
                )
        finally:
            client.close()
    times: dict[str, list[float]] = {"kill": [], "freeze": [], "stop": []}
    for failover in harness.result.failovers:
        times[failover.kind].append(failover.seconds)
    figures: dict[str, Any] = {}
    for kind, values in times.items():
        figures[f"failover_{kind}_p50_s"], figures[f"failover_{kind}_max_s"] = _summary(values)
    figures["worker_recovery_p50_s"], figures["worker_recovery_max_s"] = _summary(recoveries)
    figures["samples"] = {
        **{k: [round(v, 3) for v in vs] for k, vs in times.items()},
        "worker_recovery": [round(v, 3) for v in recoveries],
    }
    return figures
