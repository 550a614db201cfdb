"""What ``stockade chaos`` (:mod:`ops.chaos`) found, as JSON and a table; what it is asked to do,
:class:`ChaosSettings`, is :mod:`ops.chaos_settings`'s (and imported from here too)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import attrs
from rich.console import Group

from ops.chaos_settings import ChaosSettings
from ops.checker_report import CheckReport, details_lines, report_rows
from ops.faults import Failover
from ops.tables import VerdictRow, seconds_text, verdict_table

__all__ = ["DEVICE_USE_TARGET", "ChaosResult", "ChaosSettings", "chaos_table"]


@attrs.define
class ChaosResult:
    """What a run did and what the checker found."""

    failovers: list[Failover] = attrs.field(factory=list)
    worker_kills: int = 0
    worker_kills_continued: int = 0
    """Killed workers whose restarted agent continued their incarnation (took their jobs over)."""
    worker_restarts: int = 0
    worker_restarts_continued: int = 0
    """Planned restarts whose new agent continued the worker's incarnation."""
    partitions: list[tuple[str, float, float]] = attrs.field(factory=list)
    """(worker, cut at, healed at) in Unix seconds."""
    partitions_rejoined: int = 0
    """Partitions after which the worker came back: registered again, or resumed its paused jobs."""
    partitions_worked_again: int = 0
    """Partitions after which the worker also started a job again."""
    mass_partitions: list[tuple[float, float]] = attrs.field(factory=list)
    """(cut at, healed at) of each cut of every worker, Unix seconds."""
    db_outages: list[tuple[str, float, float]] = attrs.field(factory=list)
    """(how it went down, down at, up again at) of each database restart, Unix seconds."""
    placement_recoveries_s: list[float] = attrs.field(factory=list)
    """Per database outage: seconds from the database up again to the first placement after it."""
    db_failovers: list[tuple[str, float, float]] = attrs.field(factory=list)
    """(the primary killed, killed at, standby promoted at) of each database failover, Unix s."""
    failover_placements_s: list[float] = attrs.field(factory=list)
    """Per database failover: seconds from the promotion to the first placement after it."""

    @property
    def promotions_s(self) -> list[float]:
        """Per database failover: seconds from the kill of the primary to the promotion."""
        return [promoted - killed for _, killed, promoted in self.db_failovers]

    @property
    def failover_outages_s(self) -> list[float]:
        """Per database failover followed by a placement: seconds from the kill of the primary to it."""
        return [p + r for p, r in zip(self.promotions_s, self.failover_placements_s, strict=False)]

    gangs_submitted: int = 0
    """Gangs submitted (``--gangs``)."""
    gang_samples: int = 0
    """Reads of the view ``partial_gangs`` during the run."""
    samples_with_partial_gangs: int = 0
    """Of those, the reads that found a partial gang holding resources (must be 0)."""
    report: CheckReport | None = None
    jobs_made_to_fail: int = 0
    """Jobs submitted to fail (:attr:`ChaosSettings.failing_share`): each must end failed."""
    duration_s: float = 0.0
    errors: list[str] = attrs.field(factory=list)
    device_samples: list[tuple[int, int, int]] = attrs.field(factory=list)
    """With devices: (gpu in use, gpu offered by alive workers, gpu jobs waiting) read from the
    database every half second from the first submission until every job finished."""

    @property
    def device_use_while_waiting(self) -> float | None:
        """The mean share of the gpu in use over the samples taken while jobs asking gpu were
        pending past their backoff (and gpu offered); None without such a sample."""
        shares = [used / offered for used, offered, pending in self.device_samples if pending and offered]
        return sum(shares) / len(shares) if shares else None

    def _times(self, *kinds: str) -> list[float]:
        return [f.seconds for f in self.failovers if f.kind in kinds]

    @property
    def kill_times(self) -> list[float]:
        """Seconds to a new leader after each SIGKILL."""
        return self._times("kill")

    @property
    def freeze_times(self) -> list[float]:
        """Seconds to a new leader after each freeze (in a transaction or not)."""
        return self._times("freeze", "freeze_in_transaction")

    @property
    def details(self) -> list[str]:
        """The checker's details, then what stopped the run early."""
        return [*(self.report.details if self.report is not None else ()), *self.errors]

    def to_json(self) -> dict[str, Any]:
        """The results, with the stable keys of the table (``stockade chaos --json``)."""
        kills, freezes = self.kill_times, self.freeze_times
        report = self.report
        counts = {
            key: getattr(report, key) if report is not None else None
            for key in (
                "double_placements",
                "double_runs",
                "jobs_submitted",
                "jobs_finished",
                "jobs_cancelled",
                "false_deaths",
                "lost_successes",
                "stale_writes_rejected",
                "elections",
                "worker_deaths",
                "self_fences",
                "pauses",
                "extra_assignments",
                "jobs_killed_by_outage",
                "acknowledged_submissions_lost",
                "wrong_final_states",
                "schedule_slots_fired",
                "schedule_slots_skipped",
                "schedule_slot_errors",
                "shared_units",
                "device_assignments",
            )
        }
        recoveries = self.placement_recoveries_s
        return {
            "failovers": {
                "killed": len(kills),
                "frozen": len(freezes),
                "frozen_in_transaction": len(self._times("freeze_in_transaction")),
            },
            **counts,
            "failover_kill_p50_s": _p50(kills),
            "failover_kill_max_s": _max(kills),
            "failover_freeze_p50_s": _p50(freezes),
            "failover_freeze_max_s": _max(freezes),
            "jobs_made_to_fail": self.jobs_made_to_fail,
            "gangs_submitted": self.gangs_submitted,
            "gang_samples": self.gang_samples,
            "samples_with_partial_gangs": self.samples_with_partial_gangs,
            "gang_violations": report.gang_violations if report is not None else None,
            "worker_kills": self.worker_kills,
            "worker_kills_continued": self.worker_kills_continued,
            "worker_restarts": self.worker_restarts,
            "worker_restarts_continued": self.worker_restarts_continued,
            "partitions": len(self.partitions),
            "partitions_rejoined": self.partitions_rejoined,
            "partitions_worked_again": self.partitions_worked_again,
            "mass_partitions": len(self.mass_partitions),
            "db_restarts": len(self.db_outages),
            "db_back_to_placement_p50_s": _p50(recoveries),
            "db_back_to_placement_max_s": _max(recoveries),
            "db_failovers": len(self.db_failovers),
            "db_promotion_p50_s": _p50(self.promotions_s),
            "db_promotion_to_placement_p50_s": _p50(self.failover_placements_s),
            "db_promotion_to_placement_max_s": _max(self.failover_placements_s),
            "db_kill_to_placement_p50_s": _p50(self.failover_outages_s),
            "db_kill_to_placement_max_s": _max(self.failover_outages_s),
            "device_use_while_waiting": _round(self.device_use_while_waiting),
            "duration_s": round(self.duration_s, 1),
            "unfinished_job_ids": list(report.unfinished_job_ids) if report is not None else [],
            "details": self.details,
            "ok": self.ok,
        }

    @property
    def ok(self) -> bool:
        return (
            self.report is not None
            and self.report.ok
            and not self.errors
            and self.samples_with_partial_gangs == 0
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _device_rows(result: ChaosResult) -> list[VerdictRow]:
    """The device rows of the table (none for a run without devices): how many assignments held
    units, and the gpu use while jobs waited, judged against the issue's 0.9."""
    if not result.device_samples:
        return []
    use = result.device_use_while_waiting
    assignments = result.report.device_assignments if result.report is not None else 0
    return [
        ("device_assignments (held gpu units)", str(assignments), None),
        (
            "device_use_while_waiting (gpu in use / offered)",
            "-" if use is None else f"{use:.2f}",
            None if use is None else use >= DEVICE_USE_TARGET,
        ),
    ]


DEVICE_USE_TARGET = 0.9
"""The share of the gpu in use while jobs wait that a chaos run with devices should reach
(issue 33's target)."""


def chaos_table(result: ChaosResult) -> Group:
    """The run for the terminal: the failovers, the checker's verdicts, the failover times,
    worker kills and partitions, then the first 20 details."""
    kills, freezes = result.kill_times, result.freeze_times
    partitions = len(result.partitions)
    kills_text = f"{result.worker_kills} ({result.worker_kills_continued})"
    rows: list[VerdictRow] = [
        ("failovers (killed, frozen)", f"{len(kills)}, {len(freezes)}", None),
        *(report_rows(result.report) if result.report is not None else []),
        *_device_rows(result),
        ("failover_kill_p50_s / max", _p50_max_text(kills), None),
        ("failover_freeze_p50_s / max", _p50_max_text(freezes), None),
        ("jobs_made_to_fail (retried once, must end failed)", str(result.jobs_made_to_fail), None),
        *(
            [
                (
                    "gangs: submitted, samples with a partial gang",
                    f"{result.gangs_submitted}, {result.samples_with_partial_gangs} of {result.gang_samples}",
                    result.samples_with_partial_gangs == 0,
                )
            ]
            if result.gangs_submitted
            else []
        ),
        ("worker_kills (incarnation continued)", kills_text, None),
        (
            "partitions (rejoined, ran jobs again)",
            f"{partitions} ({result.partitions_rejoined}, {result.partitions_worked_again})",
            result.partitions_rejoined == partitions if partitions else None,
        ),
    ]
    if result.worker_restarts:
        restarts = f"{result.worker_restarts} ({result.worker_restarts_continued})"
        rows.append(("worker_restarts (planned; incarnation continued)", restarts, None))
    if result.mass_partitions:
        rows.append(("mass_partitions (every worker cut off)", str(len(result.mass_partitions)), None))
    if result.db_outages:
        rows.append(("db_restarts", str(len(result.db_outages)), None))
        rows.append(
            ("db back to first placement p50 / max", _p50_max_text(result.placement_recoveries_s), None)
        )
    if result.db_failovers:
        rows += [
            ("db failovers: kill to promotion p50 / max", _p50_max_text(result.promotions_s), None),
            (
                "db failovers: promotion to placement p50 / max",
                _p50_max_text(result.failover_placements_s),
                None,
            ),
            ("db failovers: kill to placement p50 / max", _p50_max_text(result.failover_outages_s), None),
            ("db_failovers", str(len(result.db_failovers)), None),
        ]
    rows.append(("duration", f"{round(result.duration_s, 1)} s", None))
    return Group(verdict_table(rows), *details_lines(result.details))


def _p50_max_text(values: Sequence[float]) -> str:
    return f"{seconds_text(_p50(values))} / {seconds_text(max(values, default=None))}"


def _max(values: Sequence[float]) -> float | None:
    return round(max(values), 3) if values else None


def _p50(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None
