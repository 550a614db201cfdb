"""``stockade bench failover``: on a fresh local cluster, the time from a fault to a new leader
(SIGKILL, SIGSTOP longer than the lease, SIGTERM), and from the busiest worker's SIGKILL until its
jobs moved (the rules: :mod:`ops.faults`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attr
import attrs
import rich.box
import trio
from rich.table import Table

from ops import faults
from ops.bench.settings import FailoverBenchSettings
from ops.chaos import Harness
from ops.chaosresult import ChaosSettings
from ops.launcher.control import LocalCluster
from ops.tables import seconds_text
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient


@attrs.frozen(kw_only=True)
class FailoverSamples:
    """Every measured time, in seconds, in the order measured."""

    kill: tuple[float, ...] = ()
    """To a new leader after a SIGKILL of the leader."""
    freeze: tuple[float, ...] = ()
    """To a new leader after a SIGSTOP of the leader (longer than the lease)."""
    stop: tuple[float, ...] = ()
    """To a new leader after a SIGTERM of the leader."""
    worker_recovery: tuple[float, ...] = ()
    """From a worker's SIGKILL until every job it ran runs elsewhere."""


_MEASURES = {
    "kill": ("failover_kill", "new leader after SIGKILL"),
    "freeze": ("failover_freeze", "new leader after SIGSTOP"),
    "stop": ("failover_stop", "new leader after SIGTERM"),
    "worker_recovery": ("worker_recovery", "killed worker's jobs running elsewhere"),
}
"""A field of :class:`FailoverSamples` -> the prefix of its figures' keys, and its table label."""


@attrs.frozen(kw_only=True)
class FailoverFigures:
    """The p50 and max of each kind of sample, in seconds (None: none measured), and the samples."""

    failover_kill_p50_s: float | None
    failover_kill_max_s: float | None
    failover_freeze_p50_s: float | None
    failover_freeze_max_s: float | None
    failover_stop_p50_s: float | None
    failover_stop_max_s: float | None
    worker_recovery_p50_s: float | None
    worker_recovery_max_s: float | None
    samples: FailoverSamples

    @classmethod
    def of(cls, samples: FailoverSamples) -> FailoverFigures:
        """The figures of ``samples`` (which are kept rounded to the millisecond)."""
        figures: dict[str, float | None] = {}
        for kind, (key, _) in _MEASURES.items():
            figures[f"{key}_p50_s"], figures[f"{key}_max_s"] = _summary(getattr(samples, kind))
        rounded = FailoverSamples(
            **{k: tuple(round(v, 3) for v in vs) for k, vs in attrs.asdict(samples).items()}
        )
        return cls(**figures, samples=rounded)

    def to_json(self) -> dict[str, Any]:
        """The figures with their stable keys (``stockade bench failover --json``)."""
        return attr.asdict(self, retain_collection_types=False)


def failover_table(figures: FailoverFigures) -> Table:
    """The figures for the terminal: runs, p50 and max of each measure."""
    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False)
    for column in ("measure", "runs", "p50", "max"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for kind, (key, label) in _MEASURES.items():
        p50, top = getattr(figures, f"{key}_p50_s"), getattr(figures, f"{key}_max_s")
        runs = getattr(figures.samples, kind)
        table.add_row(label, str(len(runs)), seconds_text(p50), seconds_text(top))
    return table


def _summary(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return round(statistics.median(values), 3), round(max(values), 3)


LONG_JOB_START_TIMEOUT_S = 60.0
"""How long the benchmark waits for its long jobs to run, in seconds."""


async def _start_long_jobs(client: ControlPlaneClient, count: int, *, first_index: int) -> list[int]:
    """Submit ``count`` long sleep jobs and return their ids once every one runs.

    Raises:
        trio.TooSlowError: they did not all run within :data:`LONG_JOB_START_TIMEOUT_S`.
    """
    ids = []
    for index in range(first_index, first_index + count):
        spec = pb.JobSpec(
            name=f"bench-long-{index}",
            cpu_millis=500,
            memory_mb=256,
            sleep=pb.SleepRuntime(duration_ms=600_000),
        )
        reply = await client.call("submit_job", pb.SubmitJobRequest(spec=spec))
        ids.append(int(reply.job_id))
    await _wait_in(client, ids, ("running",))
    return ids


async def _cancel_jobs(client: ControlPlaneClient, ids: Sequence[int]) -> None:
    """Cancel ``ids`` and wait until none holds a worker any more (so their room is free)."""
    for job_id in ids:
        await client.call("cancel_job", pb.CancelJobRequest(job_id=job_id))
    await _wait_in(client, ids, faults.ENDED)


async def _wait_in(client: ControlPlaneClient, ids: Sequence[int], states: Sequence[str]) -> None:
    """Return once every job of ``ids`` is in one of ``states``.

    Raises:
        trio.TooSlowError: not within :data:`LONG_JOB_START_TIMEOUT_S`.
    """
    with trio.fail_after(LONG_JOB_START_TIMEOUT_S):
        while True:
            jobs = [await client.call("get_job", pb.GetJobRequest(job_id=j)) for j in ids]
            if all(j.state in states for j in jobs):
                return
            await trio.sleep(0.1)


async def run_failover_bench(
    settings: FailoverBenchSettings, cluster: LocalCluster, progress: Callable[[str], None] = print
) -> FailoverFigures:
    """Run the faults one after the other and return the figures (seconds) and the samples."""
    harness = Harness(
        settings=ChaosSettings(failovers=0, workers=settings.workers, mid_transaction_every=0),
        cluster=cluster,
        progress=progress,
    )
    recoveries: list[float] = []
    # The bridge opens first: a Ctrl-C during its opening left trio-asyncio waiting for ever.
    async with asyncio_bridge():
        await trio.to_thread.run_sync(harness.fresh_cluster)
        addresses, tls = cluster.config().control_plane_addresses, cluster.config().client_tls
        client = ControlPlaneClient(addresses, timeout_s=1.0, tls=tls)
        try:
            long_ids = await _start_long_jobs(client, settings.long_jobs, first_index=0)
            for round_ in range(max(settings.kills, settings.freezes, settings.stops, settings.worker_kills)):
                failovers_before, recoveries_before = len(harness.result.failovers), len(recoveries)
                if round_ < settings.kills:
                    await harness.kill_leader(client)
                if round_ < settings.freezes:
                    await harness.freeze_leader(client, in_transaction=False)
                if round_ < settings.stops:
                    stop = await faults.kill_leader(
                        cluster, client, timeout_s=harness.timeout_s, tls=tls, clean=True
                    )
                    harness.result.failovers.append(stop)
                    await trio.to_thread.run_sync(harness.restart)
                if round_ < settings.worker_kills:
                    timeout_s = harness.timeout_s + 60
                    recoveries.append(await faults.kill_busiest_worker(cluster, client, timeout_s=timeout_s))
                    await trio.to_thread.run_sync(harness.restart)
                    if round_ + 1 < settings.worker_kills:
                        await _cancel_jobs(client, long_ids)
                        long_ids = await _start_long_jobs(
                            client, settings.long_jobs, first_index=(round_ + 1) * settings.long_jobs
                        )
                this_round = harness.result.failovers[failovers_before:]
                parts = [f"{f.kind} {f.seconds:.2f} s" for f in this_round]
                if len(recoveries) > recoveries_before:
                    parts.append(f"worker recovery {recoveries[-1]:.2f} s")
                progress(f"round {round_ + 1}: " + ", ".join(parts))
        finally:
            client.close()
    times: dict[str, list[float]] = {"kill": [], "freeze": [], "stop": []}
    for failover in harness.result.failovers:
        times[failover.kind].append(failover.seconds)
    return FailoverFigures.of(
        FailoverSamples(
            kill=tuple(times["kill"]),
            freeze=tuple(times["freeze"]),
            stop=tuple(times["stop"]),
            worker_recovery=tuple(recoveries),
        )
    )
