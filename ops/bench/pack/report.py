"""The report of ``stockade bench pack``: typed results, their table, picture and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attr
import attrs
import rich.box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ops.bench.pack.figures import PHASES, PlacerFigures, ProbeFigures, WaitFigures
from ops.bench.settings import PackSettings
from ops.checker_report import CheckReport

DISTURBANCES = ("lease_losses", "worker_deaths", "self_fences", "extra_assignments", "lost_successes")
"""Counts a run with no injected fault must keep at 0, however loaded the machine."""

CHECK_KEYS = ("double_placements", "double_runs", *DISTURBANCES, "jobs_finished", "unfinished_job_ids")
"""The checker's counts that stand among a policy's own keys (:meth:`PolicyResult.to_json`):
:class:`~ops.checker_report.CheckReport`'s, and ``lease_losses`` (:attr:`PolicyResult.lease_losses`)."""

Sample = tuple[float, float, float, int, int]
"""[seconds since the first submit, cpu use, memory use, pending, waiting]."""


@attrs.frozen(kw_only=True)
class PolicyResult:
    """One policy's run of the stream in one scenario (:func:`ops.bench.pack.scenarios.run_policy`)."""

    policy: str
    arrival_rate_per_s: float | None
    """None: every job submitted at the start."""
    cpu_use_waiting: float | None
    memory_use_waiting: float | None
    cpu_use_pending: float | None
    finished_s: float | None
    jobs_per_s: float | None
    makespan_lower_bound_s: float
    makespan_over_bound: float | None
    placer: PlacerFigures
    mean_pending_while_waiting: int
    waits: WaitFigures
    placements_per_s: float | None
    overcommitted_workers: tuple[str, ...]
    check: CheckReport
    """The checker's verdict on the run; its :data:`CHECK_KEYS` stand among the policy's keys."""
    probes: ProbeFigures
    samples: tuple[Sample, ...]
    agent_memory_mb: tuple[float, float, float] | None = None
    """Workers in containers: the memory each agent's container used at the end of the run
    (the cgroup's usage less its page cache), MiB: (min, median, max); None otherwise."""

    @property
    def lease_losses(self) -> int:
        """Takeovers after the first election."""
        return max(0, self.check.elections - 1)

    def failed(self, jobs: int) -> bool:
        """Whether the run broke a rule: a job placed or run twice, a worker over-committed, a
        job of the ``jobs`` unfinished, or a disturbance."""
        check = self.check
        return bool(
            check.double_placements
            or check.double_runs
            or self.overcommitted_workers
            or check.unfinished_job_ids
            or check.jobs_finished < jobs
            or any(self.row(k) for k in DISTURBANCES)
        )

    def to_json(self) -> dict[str, Any]:
        """The flat JSON of one policy, its figures' keys and the checker's among the others."""
        data = attr.asdict(self, retain_collection_types=False)
        flat: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("placer", "waits", "probes"):
                flat.update(value)
            elif key == "check":
                counts = value | {"lease_losses": self.lease_losses}
                flat.update((k, counts[k]) for k in CHECK_KEYS)
            else:
                flat[key] = value
        return flat

    def row(self, key: str) -> Any:
        """The value the tables show under ``key`` (a key of :meth:`to_json`)."""
        if key == "lease_losses":
            return self.lease_losses
        if key in CHECK_KEYS:
            return getattr(self.check, key)
        for part in (self, self.placer, self.waits, self.probes):
            if key in attrs.fields_dict(type(part)):
                return getattr(part, key)
        raise KeyError(key)


@attrs.frozen(kw_only=True)
class BurstResult:
    """Small jobs submitted at once into an empty cluster with room for all of them."""

    burst_jobs: int
    burst_started: int
    burst_s: float | None
    """Seconds from the first submit until every job was started (None: not all were)."""
    burst_placements_per_s: float | None


@attrs.frozen(kw_only=True)
class ScalePoint:
    """The real placer round against ``pending`` jobs and ``workers`` simulated busy workers."""

    pending: int
    workers: int
    first_round_ms: float
    round_p50_ms: float
    round_p99_ms: float
    round_max_ms: float
    placed: int
    accounts: int = 1
    """Accounts the pending jobs belong to (round-robin), with weights 1, 2 and 3 in turn."""
    device_share: float = 0.0
    """The share of the pending jobs that ask 1 to 4 gpu (the workers offer 8 each); 0: none."""
    gang_share: float = 0.0
    """The share of the pending jobs asked to be tasks of gangs of 2 to 8; 0: none."""
    gang_tasks: int = 0
    """How many of the pending jobs are gang tasks (``gang_share`` of them, in whole gangs)."""
    failed_rounds: int = 0
    """Rounds (the untimed first one included) whose statement the database cancelled (a statement
    timeout); the timed ones count in the percentiles."""


RATIO_KEYS = ("cpu_use_waiting", "memory_use_waiting", "finished_s")


def ratios(results: tuple[PolicyResult, ...]) -> dict[str, dict[str, float | None]]:
    """The first policy's figures over each other one's, keyed ``"best_fit/worst_fit"``."""
    base = results[0]
    out: dict[str, dict[str, float | None]] = {}
    for other in results[1:]:
        out[f"{base.policy}/{other.policy}"] = {
            k: (round(base.row(k) / other.row(k), 3) if base.row(k) and other.row(k) else None)
            for k in RATIO_KEYS
        }
    return out


@attrs.frozen(kw_only=True)
class Scenario:
    """Every policy's run of one scenario, side by side."""

    title: str
    policies: tuple[PolicyResult, ...]

    @property
    def ratios(self) -> dict[str, dict[str, float | None]]:
        return ratios(self.policies) if self.policies else {}


@attrs.frozen(kw_only=True)
class PackReport:
    """The whole run."""

    settings: PackSettings
    all_at_once: Scenario
    arriving: Scenario | None = None
    """None when ``settings.arrival_rate_per_s`` is 0."""
    burst: BurstResult | None = None
    scale: tuple[ScalePoint, ...] = ()

    @property
    def scenarios(self) -> list[Scenario]:
        return [self.all_at_once, *([self.arriving] if self.arriving is not None else [])]

    @property
    def ok(self) -> bool:
        """False when a policy run broke a rule (:meth:`PolicyResult.failed`)."""
        return not any(r.failed(self.settings.jobs) for s in self.scenarios for r in s.policies)

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        arriving = self.arriving
        return {
            "settings": {
                "jobs": s.jobs,
                "workers": s.workers,
                "seed": s.seed,
                "fleet_size": s.fleet_size,
                "arrival_rate_per_s": s.arrival_rate_per_s,
            },
            "policies": [r.to_json() for r in self.all_at_once.policies],
            "ratios": self.all_at_once.ratios,
            "arrivals": (
                {
                    "rate_per_s": s.arrival_rate_per_s,
                    "policies": [r.to_json() for r in arriving.policies],
                    "ratios": arriving.ratios,
                }
                if arriving is not None
                else None
            ),
            "burst": attr.asdict(self.burst) if self.burst is not None else {},
            "scale": [attr.asdict(p) for p in self.scale],
            "scale_growth": growth(self.scale),
        }


TABLE_KEYS = (
    "cpu_use_waiting",
    "memory_use_waiting",
    "cpu_use_pending",
    "finished_s",
    "jobs_per_s",
    "makespan_over_bound",
    "round_p50_ms",
    "round_p99_ms",
    "round_max_ms",
    "mean_pending_while_waiting",
    "wait_p50_s",
    "large_wait_p50_s",
    "large_wait_max_s",
    "placements_per_s",
    "double_placements",
    "double_runs",
    "overcommitted_workers",
    *DISTURBANCES,
    "db_commit_p50_ms",
    "db_commit_p99_ms",
    "db_commit_max_ms",
)
"""The rows of a scenario's table, keys of :meth:`PolicyResult.to_json`."""


def _cell(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


def _scenario(scenario: Scenario) -> list[RenderableType]:
    """One scenario's policies side by side, its database stalls and the first policy's ratios."""
    results = scenario.policies
    table = Table(title=scenario.title, title_justify="left", box=rich.box.SIMPLE_HEAD, show_edge=False)
    table.add_column("measure")
    for result in results:
        table.add_column(result.policy, justify="right")
    for key in TABLE_KEYS:
        table.add_row(key, *(_cell(r.row(key)) for r in results))
    for phase in PHASES:
        table.add_row(
            f"  {phase} p50 / p99 ms",
            *(
                f"{figures.p50_ms} / {figures.p99_ms}"
                if (figures := r.placer.round_phases.get(phase)) is not None
                else "None"
                for r in results
            ),
        )
    out: list[RenderableType] = [table]
    for result in results:
        if result.agent_memory_mb is not None:
            low, median, high = result.agent_memory_mb
            out.append(
                Text(
                    f"{result.policy}: memory per agent container {median:g} MiB (min {low:g}, max {high:g})"
                )
            )
        if result.probes.db_stalls:
            stalls = ", ".join(f"{latency:g} s at {t:g} s" for t, latency in result.probes.db_stalls)
            out.append(Text(f"{result.policy}: database commits slower than 1 s: {stalls}"))
    for pair, ratio in scenario.ratios.items():
        out.append(Text(f"{pair.replace('/', ' / ')}: " + ", ".join(f"{k} x{v}" for k, v in ratio.items())))
    return out


def render(report: PackReport) -> Group:
    """The report for the terminal: a table per scenario with the ratios, the burst and the
    scale curve."""
    parts: list[RenderableType] = []
    for scenario in report.scenarios:
        if scenario.policies:
            parts += _scenario(scenario)
    if report.burst is not None:
        b = report.burst
        parts.append(
            Text(
                f"burst: {b.burst_started} of {b.burst_jobs} jobs started in {b.burst_s} s: "
                f"burst_placements_per_s {b.burst_placements_per_s}"
            )
        )
    for point in report.scale:
        mix = [f"{point.device_share:.0%} asking gpu"] if point.device_share else []
        if point.gang_share:
            mix.append(f"{point.gang_share:.0%} in gangs")
        devices = f" ({', '.join(mix)})" if mix else ""
        parts.append(
            Text(
                f"scale: {point.pending:>6} pending x {point.workers:>4} workers x {point.accounts:>3} "
                f"accounts{devices}: round p50 "
                f"{point.round_p50_ms} ms, p99 {point.round_p99_ms} ms, max {point.round_max_ms} ms, "
                f"first (full read) {point.first_round_ms} ms"
                + (
                    f"; {point.failed_rounds} rounds failed (a statement cancelled at its timeout)"
                    if point.failed_rounds
                    else ""
                )
            )
        )
    parts += [Text(f"scale: {line}") for line in growth(report.scale)]
    return Group(*parts)


def growth(points: Sequence[ScalePoint]) -> list[str]:
    """Sentences on how the round time grows with the pending queue and the worker count."""
    lines = []
    by = {(p.pending, p.workers): p.round_p50_ms for p in points}
    pendings = sorted({p.pending for p in points})
    for workers in sorted({p.workers for p in points}):
        row = [by[(n, workers)] for n in pendings if (n, workers) in by]
        if len(row) >= 2:
            lines.append(
                f"{workers} workers: p50 {' -> '.join(f'{v} ms' for v in row)} for "
                f"{' -> '.join(str(n) for n in pendings)} pending "
                f"(x{row[-1] / row[0]:.1f} for x{pendings[-1] // pendings[0]} jobs)"
            )
    return lines


def plot(report: PackReport, path: Path) -> None:
    """Allocated CPU and memory over time as one PNG: a row per policy, a column per scenario
    (all at once, then arriving when it ran).

    Args:
        report: the run's report.
        path: the PNG to write.
    """
    scenarios = [(s.title, s.policies) for s in report.scenarios]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(len(results) for _, results in scenarios)
    if rows == 0:  # the scale curve alone: its round p50 by pending jobs, a line per worker count
        figure, axis = plt.subplots(figsize=(7, 4))
        for workers in sorted({p.workers for p in report.scale}):
            points = sorted((p.pending, p.round_p50_ms) for p in report.scale if p.workers == workers)
            axis.plot(
                [n for n, _ in points], [ms for _, ms in points], marker="o", label=f"{workers} workers"
            )
        axis.set_xscale("log")
        axis.set_xlabel("pending jobs")
        axis.set_ylabel("round p50, ms")
        axis.legend()
        figure.savefig(path, dpi=100, bbox_inches="tight")
        plt.close(figure)
        return
    figure, axes = plt.subplots(
        rows, len(scenarios), figsize=(9 * len(scenarios), 2.6 * rows), sharex="col", squeeze=False
    )
    for column, (title, results) in enumerate(scenarios):
        for row, result in enumerate(results):
            axis = axes[row, column]
            samples = result.samples
            t = [s[0] for s in samples]
            axis.plot(t, [s[1] for s in samples], label="CPU allocated")
            axis.plot(t, [s[2] for s in samples], label="memory allocated")
            axis.set_ylim(0, 1.05)
            axis.set_ylabel("fraction")
            axis.set_title(
                f"{title}, {result.policy}: cpu_use_waiting {result.cpu_use_waiting}, "
                f"memory_use_waiting {result.memory_use_waiting}",
                fontsize=9,
            )
            axis.grid(alpha=0.3)
            axis.legend(loc="lower left", fontsize=8)
        for row in range(len(results), rows):
            axes[row, column].set_visible(False)
        axes[len(results) - 1, column].set_xlabel("seconds since the first submit")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def save(path: Path, report: PackReport) -> None:
    """Write ``report`` as JSON (:meth:`PackReport.to_json`)."""
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
