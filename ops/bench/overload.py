"""``stockade bench overload``: offered load raised step by step past what the machine can do.

A fresh cluster gets an open loop of short jobs, rate after rate (``OverloadSettings``), then
the first rate again and a drain (:class:`OverloadResult`). The figures and how to read the
curve: docs/benchmarks.md, "`just bench-overload`" and docs/design.md, "Benchmarks under overload".
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attr
import attrs
import rich.box
import trio
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ops import checker
from ops.bench.settings import OverloadSettings
from ops.checker_report import CheckReport
from ops.cluster import LocalCluster, StateDir
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.errors import ClusterBusy, StockadeError
from runtime.jobs import CommandRuntime, JobRuntime, JobSpec, SleepRuntime
from runtime.wire_jobs import job_spec_to_pb


@attrs.define
class _Step:
    label: str
    rate_per_s: float
    started_unix_s: float = 0.0
    ended_unix_s: float = 0.0
    offered: int = 0
    accepted: int = 0
    shed: int = 0
    failed: int = 0
    job_ids: list[int] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class StepResult:
    """One step's figures (jobs per second over the step's own length; see the module docstring)."""

    step: str
    offered_per_s: float
    accepted_per_s: float
    shed_per_s: float
    failed_per_s: float
    goodput_per_s: float
    finish_p50_s: float | None
    finish_p99_s: float | None
    elections: int
    worker_deaths: int
    self_fences: int


@attrs.frozen(kw_only=True)
class OverloadResult:
    """The whole run (see the module docstring for each figure)."""

    settings: OverloadSettings
    steps: tuple[StepResult, ...]
    peak_goodput_per_s: float
    last_step_over_peak: float | None
    recovery_over_first: float | None
    backlog_after_steps: int
    drain_s: float | None
    unfinished_after_drain: int
    check: CheckReport
    samples: tuple[tuple[float, int, int, int], ...]
    """[seconds, pending, placed, succeeded] every second."""

    @property
    def ok(self) -> bool:
        """False when a job was placed or run twice or a success was lost."""
        return not (self.check.double_placements or self.check.double_runs or self.check.lost_successes)

    def to_json(self) -> dict[str, Any]:
        """The result with the stable keys of ``bench-overload.json`` (README)."""
        data = attr.asdict(
            self, filter=lambda field, _value: field.name != "check", retain_collection_types=False
        )
        samples = data.pop("samples")
        return {**data, "check": self.check.to_json(), "samples": samples}


def _spec(settings: OverloadSettings, index: int) -> pb.JobSpec:
    runtime: JobRuntime = (
        CommandRuntime(argv=("true",))
        if settings.kind == "command"
        else SleepRuntime(duration_ms=settings.sleep_ms)
    )
    return job_spec_to_pb(JobSpec(name=f"overload-{index}", cpu_millis=10, memory_mb=16, runtime=runtime))


async def _offer(
    client: ControlPlaneClient, settings: OverloadSettings, step: _Step, first_index: int
) -> int:
    """Run one step of the open-loop generator; returns the next job index."""
    index = first_index
    owed = 0.0
    async with trio.open_nursery() as calls:
        start = trio.current_time()
        step.started_unix_s = time.time()
        next_at = start
        while next_at < start + settings.step_s:
            await trio.sleep_until(next_at)
            owed += step.rate_per_s * settings.batch_interval_s
            count = int(owed)
            owed -= count
            if count:
                specs = [_spec(settings, i) for i in range(index, index + count)]
                index += count
                step.offered += count
                calls.start_soon(_submit_batch, client, specs, step)
            next_at += settings.batch_interval_s
        step.ended_unix_s = time.time()
    return index


async def _submit_batch(client: ControlPlaneClient, specs: list[pb.JobSpec], step: _Step) -> None:
    """Submit one batch once (no retry: the generator is an open loop)."""
    try:
        reply = await client.call("submit_jobs", pb.SubmitJobsRequest(specs=specs))
    except ClusterBusy:
        step.shed += len(specs)
        return
    except StockadeError:
        step.failed += len(specs)
        return
    step.accepted += len(specs)
    step.job_ids.extend(int(j) for j in reply.job_ids)


STEP_FIGURES = """
SELECT (SELECT count(*) FROM jobs WHERE state = 'succeeded'
          AND finished_at >= to_timestamp($1) AND finished_at < to_timestamp($2)) AS succeeded,
       (SELECT count(*) FROM lease_history
         WHERE acquired_at >= to_timestamp($1) AND acquired_at < to_timestamp($2)) AS elections,
       (SELECT count(*) FROM worker_deaths
         WHERE declared_at >= to_timestamp($1) AND declared_at < to_timestamp($2)) AS deaths
"""
PENDING = "SELECT count(*) FROM jobs WHERE state = 'pending'"
UNFINISHED = "SELECT count(*) FROM jobs WHERE state IN ('pending', 'assigned', 'running')"
FINISH_TIMES = """
SELECT extract(epoch FROM finished_at - submitted_at)::float8 AS seconds
  FROM jobs WHERE id = ANY($1::bigint[]) AND state = 'succeeded'
"""
SAMPLE = """
SELECT count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state IN ('assigned', 'running')) AS placed,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
  FROM jobs
"""


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


async def run_overload(
    settings: OverloadSettings, root: Path, progress: Callable[[str], None]
) -> OverloadResult:
    """Run the benchmark on a fresh cluster in ``root``; returns its figures (see the module
    docstring) with ``steps``, ``samples`` (``[seconds, pending, placed, succeeded]`` every
    second) and the whole run's checker report.

    Raises:
        ClusterError: the cluster could not be started.
    """
    cluster = LocalCluster(StateDir(root))
    await trio.to_thread.run_sync(cluster.down)
    shutil.rmtree(root, ignore_errors=True)
    steps = [_Step(label=f"{r:g}/s", rate_per_s=r) for r in settings.rates]
    steps.append(_Step(label=f"{settings.rates[0]:g}/s again", rate_per_s=settings.rates[0]))
    samples: list[tuple[float, int, int, int]] = []
    try:
        ready = await trio.to_thread.run_sync(
            lambda: cluster.up(control_planes=3, workers=settings.workers, timeout_s=120)
        )
        config = ready.config
        async with asyncio_bridge():
            # busy_retry_s 0: a batch every replica refuses is shed, not asked again (open loop).
            client = ControlPlaneClient(
                config.control_plane_addresses,
                timeout_s=settings.submit_timeout_s,
                busy_retry_s=0,
                tls=config.client_tls,
            )
            db = await PgConnection.connect(config.database_url)
            sampler_db = await PgConnection.connect(config.database_url)
            run_started = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:

                    async def sample() -> None:
                        while True:
                            row = await sampler_db.fetchrow(SAMPLE)
                            assert row is not None
                            samples.append(
                                (
                                    round(trio.current_time() - run_started, 2),
                                    int(row["pending"]),
                                    int(row["placed"]),
                                    int(row["succeeded"]),
                                )
                            )
                            await trio.sleep(1.0)

                    nursery.start_soon(sample)
                    index = 0
                    for step in steps:
                        index = await _offer(client, settings, step, index)
                        progress(
                            f"{step.label}: offered {step.offered}, accepted {step.accepted}, "
                            f"shed {step.shed}, failed {step.failed}"
                        )
                    steps_ended = trio.current_time()
                    backlog = int(await db.fetchval(UNFINISHED))
                    drained_s: float | None = None
                    while trio.current_time() < steps_ended + settings.drain_limit_s:
                        if not int(await db.fetchval(UNFINISHED)):
                            drained_s = trio.current_time() - steps_ended
                            break
                        await trio.sleep(0.5)
                    nursery.cancel_scope.cancel()
                figures = []
                for step in steps:
                    row = await db.fetchrow(STEP_FIGURES, step.started_unix_s, step.ended_unix_s)
                    assert row is not None
                    finish = [float(r["seconds"]) for r in await db.fetch(FINISH_TIMES, step.job_ids)]
                    figures.append((step, row, finish))
                unfinished = int(await db.fetchval(UNFINISHED))
                history = await checker.load_history(config.database_url)
            finally:
                client.close()
                await db.close()
                await sampler_db.close()
        worker_dirs = [cluster.state.work_dir(w.id) for w in config.workers]
        records = checker.load_records(worker_dirs)
        report = checker.check_logs(history, worker_dirs)
    finally:
        await trio.to_thread.run_sync(cluster.down)
    fences = [float(r["time"]) for r in records if r.get("event") == "self_fence"]
    results: list[StepResult] = []
    for step, row, finish in figures:
        seconds = max(step.ended_unix_s - step.started_unix_s, 1e-9)
        half_finished = len(finish) * 2 >= step.accepted
        results.append(
            StepResult(
                step=step.label,
                offered_per_s=round(step.offered / seconds, 1),
                accepted_per_s=round(step.accepted / seconds, 1),
                shed_per_s=round(step.shed / seconds, 1),
                failed_per_s=round(step.failed / seconds, 1),
                goodput_per_s=round(int(row["succeeded"]) / seconds, 1),
                finish_p50_s=_quantile(finish, 0.5) if half_finished else None,
                finish_p99_s=_quantile(finish, 0.99) if half_finished else None,
                elections=int(row["elections"]),
                worker_deaths=int(row["deaths"]),
                self_fences=sum(1 for t in fences if step.started_unix_s <= t < step.ended_unix_s),
            )
        )
    goodput = [r.goodput_per_s for r in results]
    peak = max(goodput[:-1])
    return OverloadResult(
        settings=settings,
        steps=tuple(results),
        peak_goodput_per_s=peak,
        last_step_over_peak=round(goodput[-2] / peak, 3) if peak else None,
        recovery_over_first=round(goodput[-1] / goodput[0], 3) if goodput[0] else None,
        backlog_after_steps=backlog,
        drain_s=None if drained_s is None else round(drained_s, 1),
        unfinished_after_drain=unfinished,
        check=report,
        samples=tuple(samples),
    )


def plot(result: OverloadResult, path: Path) -> None:
    """Goodput and accepted load against offered load, and the run over time, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result.steps
    rising = steps[:-1]
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    offered = [s.offered_per_s for s in rising]
    left.plot(offered, offered, linestyle=":", color="grey", label="offered (all of it done)")
    left.plot(offered, [s.accepted_per_s for s in rising], marker="s", label="accepted")
    left.plot(offered, [s.goodput_per_s for s in rising], marker="o", linewidth=2, label="goodput")
    again = steps[-1]
    left.scatter([again.offered_per_s], [again.goodput_per_s], marker="*", s=150, color="red", zorder=5)
    left.annotate("recovery step", (again.offered_per_s, again.goodput_per_s), fontsize=8)
    left.set_xscale("log")
    left.set_xlabel("offered load, jobs/s (log)")
    left.set_ylabel("jobs/s")
    kind = result.settings.kind
    left.set_title(f"goodput against offered load ({kind} jobs)", fontsize=10)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    samples = result.samples
    t = [s[0] for s in samples]
    done = [s[3] for s in samples]
    rate = [0.0] + [(done[i] - done[i - 1]) / max(t[i] - t[i - 1], 1e-9) for i in range(1, len(done))]
    right.plot(t, rate, label="succeeded per second")
    right.set_xlabel("seconds since the first step")
    right.set_ylabel("jobs/s")
    twin = right.twinx()
    twin.plot(t, [s[1] for s in samples], color="tab:orange", label="pending")
    twin.plot(t, [s[2] for s in samples], color="tab:green", label="placed, not finished")
    twin.set_ylabel("jobs")
    right.set_title("over time: completions, queue and jobs on workers", fontsize=10)
    right.grid(alpha=0.3)
    lines = right.get_legend_handles_labels()
    twin_lines = twin.get_legend_handles_labels()
    right.legend(lines[0] + twin_lines[0], lines[1] + twin_lines[1], fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def save(path: Path, result: OverloadResult) -> None:
    """Write ``result`` as JSON (:meth:`OverloadResult.to_json`)."""
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")


STEP_COLUMNS = {
    "step": "step",
    "offered_per_s": "offered",
    "accepted_per_s": "accepted",
    "shed_per_s": "shed",
    "failed_per_s": "failed",
    "goodput_per_s": "goodput",
    "finish_p50_s": "finish p50",
    "finish_p99_s": "p99",
    "elections": "elections",
    "worker_deaths": "deaths",
    "self_fences": "fences",
}
"""The table's columns: a :class:`StepResult` field -> its header."""


def render(result: OverloadResult) -> Group:
    """The run for the terminal: a row per step, then how the curve behaved (:func:`summary`)."""
    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False, title="jobs/s; finish: submit to end, s")
    for key, header in STEP_COLUMNS.items():
        table.add_column(header, justify="left" if key == "step" else "right", no_wrap=True)
    for step in result.steps:
        table.add_row(*(str(getattr(step, k)) for k in STEP_COLUMNS))
    return Group(table, *(Text(line) for line in summary(result)))


def summary(result: OverloadResult) -> list[str]:
    """Lines that say how the curve behaved."""
    steps = result.steps
    lines = [
        f"peak goodput {result.peak_goodput_per_s} jobs/s; at the highest offered load "
        f"{steps[-2].goodput_per_s} jobs/s (x{result.last_step_over_peak} of the peak)",
        f"recovery step: {steps[-1].goodput_per_s} jobs/s (x{result.recovery_over_first} of the "
        f"first step's {steps[0].goodput_per_s}: it also works off the backlog)",
        (
            f"backlog after the steps: {result.backlog_after_steps} jobs, all finished "
            f"{result.drain_s} s later"
            if result.drain_s is not None
            else f"backlog after the steps: {result.backlog_after_steps} jobs, "
            f"{result.unfinished_after_drain} still unfinished after the drain"
        ),
    ]
    disturbed = {
        k: sum(getattr(s, k) for s in steps)
        for k in ("elections", "worker_deaths", "self_fences")
        if any(getattr(s, k) for s in steps)
    }
    lines.append(
        "disturbances: " + (", ".join(f"{k} {v}" for k, v in disturbed.items()) if disturbed else "none")
    )
    return lines
