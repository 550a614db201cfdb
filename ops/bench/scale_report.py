"""What ``stockade bench scale`` reports: one :class:`ScalePoint` per worker count, their growth
per doubling of the count, the table, the JSON and the picture. Pure, except :func:`save` and
:func:`plot`, which write files. How the numbers are measured: :mod:`ops.bench.scale`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attr
import attrs
import rich.box
from rich.table import Table

from runtime.errors import InvalidArgument

__all__ = [
    "DEFAULT_WORKERS",
    "GROWTH_METRICS",
    "REAL_AGENTS_LIMIT",
    "WORKERS_LIMIT",
    "ScalePoint",
    "ScaleReport",
    "growth_per_doubling",
    "parse_workers",
    "plot",
    "render",
    "save",
]

DEFAULT_WORKERS = (100, 500, 1000, 2000)
"""The worker counts measured when ``--workers`` is not given."""
WORKERS_LIMIT = 20_000
"""Most simulated workers one step may have."""
REAL_AGENTS_LIMIT = 200
"""Most workers a step runs as real agents (in fleets) with ``--real-agents`` (what a 2-core
machine hosts beside 3 control planes and the database); larger steps use the load generator."""


def parse_workers(text: str) -> tuple[int, ...]:
    """The worker counts of ``--workers``: comma-separated integers, each 1..:data:`WORKERS_LIMIT`,
    no repeats; returned rising.

    Raises:
        InvalidArgument: an empty list, a value not an integer or out of range, or a repeat.
    """
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise InvalidArgument("--workers", text, "must be comma-separated worker counts such as 100,500")
    counts: list[int] = []
    for part in parts:
        try:
            count = int(part)
        except ValueError:
            raise InvalidArgument(
                "--workers", part, f"must list whole numbers of workers in 1..{WORKERS_LIMIT}"
            ) from None
        if not 1 <= count <= WORKERS_LIMIT:
            raise InvalidArgument("--workers", count, f"must list worker counts in 1..{WORKERS_LIMIT}")
        if count in counts:
            raise InvalidArgument("--workers", count, "must not list a count twice")
        counts.append(count)
    return tuple(sorted(counts))


@attrs.frozen(kw_only=True)
class ScalePoint:
    """What one step measured, over its window of ``duration_s`` (None: nothing measured).

    CPU per 1,000 heartbeats divides all the CPU time the processes used in the window (user +
    system, seconds) by the heartbeats recorded in it: an upper bound on what heartbeats cost.
    """

    workers: int
    mode: str
    """``loadgen`` (simulated workers) or ``real_agents`` (agents in fleets)."""
    duration_s: float
    heartbeat_interval_s: float
    """The heartbeat interval in force at the window's end."""
    heartbeats: int
    """Heartbeats the control planes recorded in the window (their counters, summed)."""
    heartbeats_per_s: float
    heartbeats_acked: int
    """Heartbeats the workers saw acknowledged (without reregister) in the window: a cross-check
    of ``heartbeats`` counted on the workers' side."""
    ack_p50_ms: float | None
    ack_p99_ms: float | None
    heartbeat_failures: int
    reregisters: int
    self_fences: int
    cp_cpu_s_per_1000_heartbeats: float | None
    db_cpu_s_per_1000_heartbeats: float | None
    db_exec_ms_per_1000_heartbeats: float | None
    """pg_stat_statements' total_exec_time of every statement in the window (None: not loaded)."""
    db_calls_per_heartbeat: float | None
    """pg_stat_statements' calls of every statement in the window, per heartbeat."""
    loadgen_cpu_s_per_1000_heartbeats: float | None
    """The load generator's own CPU (None with real agents); near 1 s per second it was the
    bottleneck."""
    false_deaths: int
    """Workers declared dead in the window that were not killed on purpose."""
    deaths: int
    elections: int
    """Lease history rows (takeovers) whose acquired_at lies in the window."""
    pending_p50: int | None
    """Median pending jobs over the window's samples (the queue the placer rounds read)."""
    placer_rounds: int
    placer_round_p50_ms: float | None
    placer_round_p99_ms: float | None
    killed_workers: tuple[str, ...]
    jobs_moved: int
    """Jobs the killed workers were running, each timed until it ran elsewhere."""
    jobs_not_moved: int
    """Jobs the killed workers were running that did not run elsewhere in time."""
    recovery_p50_s: float | None
    """From the kill (database time) to a job's new assignment confirmed running, p50 over jobs."""
    recovery_max_s: float | None
    recovery_declared_p50_s: float | None = None
    """From the kill to a killed worker's death declared, p50 over the killed workers."""
    recovery_placed_p50_s: float | None = None
    """From the kill to a lost job's first new assignment elsewhere, p50 over jobs."""
    dead_after_s: float | None = None
    """The dead_after in force at the window's end (None: the control planes' default)."""
    workers_updates: int | None = None
    """Row updates of the ``workers`` table in the window (``pg_stat_user_tables.n_tup_upd``)."""
    workers_hot_share: float | None = None
    """The share of those that were HOT updates (``n_tup_hot_upd``, 0 to 1)."""
    workers_dead_rows: int | None = None
    """Dead row versions of ``workers`` at the window's end (``n_dead_tup``)."""
    cp_gc_pauses_over_100_ms: int | None = None
    """Garbage collections longer than 100 ms in the control planes (and real agents) over the
    window (``stockade_gc_pause_seconds``)."""
    loadgen_gc_pause_max_ms: float | None = None
    """The load generator's longest garbage collection in the window (None: real agents)."""

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self, retain_collection_types=False)


GROWTH_METRICS = (
    "heartbeats_per_s",
    "ack_p50_ms",
    "ack_p99_ms",
    "cp_cpu_s_per_1000_heartbeats",
    "db_cpu_s_per_1000_heartbeats",
    "db_exec_ms_per_1000_heartbeats",
    "placer_round_p50_ms",
    "placer_round_p99_ms",
    "recovery_p50_s",
)
"""The metrics whose growth per doubling of the worker count is reported and drawn."""


def growth_per_doubling(points: Sequence[ScalePoint], metric: str) -> list[dict[str, Any]]:
    """How ``metric`` grows between consecutive worker counts, as a factor per doubling:
    ``(v2 / v1) ** (1 / log2(n2 / n1))`` (2.0: it doubles with the workers, 1.0: flat).

    Returns:
        ``[{"from": n1, "to": n2, "factor": f}, ...]`` over the points sorted by workers; the
        factor is None where either value is None or the first is 0.
    """
    ordered = sorted(points, key=lambda p: p.workers)
    steps = []
    for low, high in itertools.pairwise(ordered):
        v1, v2 = getattr(low, metric), getattr(high, metric)
        factor = None
        if v1 is not None and v2 is not None and v1 > 0 and high.workers > low.workers:
            factor = round((v2 / v1) ** (1 / math.log2(high.workers / low.workers)), 3)
        steps.append({"from": low.workers, "to": high.workers, "factor": factor})
    return steps


@attrs.frozen(kw_only=True)
class ScaleReport:
    """Every step of one run, and how it was run."""

    settings: dict[str, Any]
    points: tuple[ScalePoint, ...]

    @property
    def ok(self) -> bool:
        """No false death in any step."""
        return all(p.false_deaths == 0 for p in self.points)

    def to_json(self) -> dict[str, Any]:
        """``{"settings", "points", "growth_per_doubling": {metric: [...]}}``."""
        return {
            "settings": self.settings,
            "points": [p.to_json() for p in self.points],
            "growth_per_doubling": {m: growth_per_doubling(self.points, m) for m in GROWTH_METRICS},
        }


_COLUMNS = (
    ("workers", "workers"),
    ("heartbeat_interval_s", "interval s"),
    ("dead_after_s", "dead after s"),
    ("heartbeats_per_s", "hb/s"),
    ("ack_p50_ms", "ack p50 ms"),
    ("ack_p99_ms", "ack p99 ms"),
    ("heartbeat_failures", "hb failed"),
    ("cp_cpu_s_per_1000_heartbeats", "CP cpu s/1k hb"),
    ("db_cpu_s_per_1000_heartbeats", "DB cpu s/1k hb"),
    ("db_exec_ms_per_1000_heartbeats", "DB exec ms/1k hb"),
    ("false_deaths", "false deaths"),
    ("elections", "elections"),
    ("placer_round_p50_ms", "round p50 ms"),
    ("placer_round_p99_ms", "round p99 ms"),
    ("pending_p50", "pending"),
    ("recovery_declared_p50_s", "declared p50 s"),
    ("recovery_placed_p50_s", "placed p50 s"),
    ("recovery_p50_s", "recovery p50 s"),
    ("recovery_max_s", "recovery max s"),
    ("workers_hot_share", "workers HOT"),
    ("workers_dead_rows", "workers dead rows"),
    ("cp_gc_pauses_over_100_ms", "CP GC > 0.1 s"),
)


def render(report: ScaleReport) -> Table:
    """The steps as a rich table, one row per measure and one column per worker count."""
    table = Table(box=rich.box.SIMPLE_HEAD, show_edge=False, title="stockade bench scale")
    table.add_column("workers", no_wrap=True)
    for point in report.points:
        table.add_column(f"{point.workers:,}", justify="right", no_wrap=True)
    for key, title in _COLUMNS[1:]:
        table.add_row(title, *(_cell(getattr(point, key)) for point in report.points))
    return table


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def save(path: Path, report: ScaleReport) -> None:
    """Write ``report`` as JSON (:meth:`ScaleReport.to_json`)."""
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")


def plot(report: ScaleReport, path: Path) -> None:
    """One small panel per metric of :data:`GROWTH_METRICS` against the worker count (log 2
    axis, so each step right is a doubling), as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = math.ceil(len(GROWTH_METRICS) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    ordered = sorted(report.points, key=lambda p: p.workers)
    for index, metric in enumerate(GROWTH_METRICS):
        axis = axes[index // columns, index % columns]
        xs = [p.workers for p in ordered if getattr(p, metric) is not None]
        ys = [getattr(p, metric) for p in ordered if getattr(p, metric) is not None]
        axis.plot(xs, ys, marker="o")
        if xs and min(xs) > 0 and len(set(xs)) > 1:
            axis.set_xscale("log", base=2)
        axis.set_title(metric, fontsize=9)
        axis.set_xlabel("workers")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
