"""The checker's verdict: :class:`CheckReport` (what :func:`ops.invariants.check` counted), and
its rows for the terminal (:func:`report_rows`, :func:`details_lines`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from rich.text import Text

from ops.tables import VerdictRow


@attrs.frozen(kw_only=True)
class CheckReport:
    """The checker's verdict. ``ok`` when every safety count is 0 and, when
    ``finish_required``, every job finished."""

    double_placements: int
    """Jobs with two assignments active at once, or placed again after one finished (from the
    database)."""
    double_runs: int
    """Jobs that ran at overlapping times in two places (from the workers' logs)."""
    false_deaths: int
    """Dead-worker declarations no fault injected into that worker nor a clean stop explains."""
    stale_writes_rejected: int
    """Fenced writes the database refused (rows of ``stale_writes``)."""
    jobs_submitted: int
    jobs_finished: int
    """Jobs that succeeded or failed."""
    unfinished_job_ids: tuple[int, ...]
    details: tuple[str, ...]
    """One line per finding, naming the jobs and workers."""
    lost_successes: int = 0
    """Successes a worker logged that the database does not record, with no kill to explain it."""
    elections: int = 0
    """Lease takeovers, the first one included (counted, not judged, as the four below)."""
    worker_deaths: int = 0
    """Dead-worker declarations, explained or not."""
    self_fences: int = 0
    """``self_fence`` records: a worker killed its jobs."""
    extra_assignments: int = 0
    """Assignments beyond one per job that was placed."""
    worker_leaves: int = 0
    """Clean stops the control planes recorded (rows of ``worker_leaves``)."""
    pauses: int = 0
    """``pause`` records in the workers' logs (each resumed or followed by a self-fence)."""
    jobs_killed_by_outage: int = 0
    """Runs the cluster stopped (self-fence, register again, told to stop) during a database
    outage or a cut-off of every worker, or within ``OUTAGE_SLACK_S`` after it, on a worker
    no fault of its own explains."""
    acknowledged_submissions_lost: int = 0
    """Job ids a client was given that the database does not have."""
    wrong_final_states: int = 0
    """Jobs whose final state contradicts their runs or their retry budget
    (:func:`ops.invariants.wrong_final_states`), or the state their submitter expected."""
    unfinished_states: dict[str, int] = attrs.field(factory=dict)
    """The unfinished jobs by state (``pending``, ``waiting``, ``assigned``, ``running``)."""
    jobs_cancelled: int = 0
    """Jobs that ended cancelled (by a caller, a failed dependency or their gang): ended, neither
    succeeded nor failed, so ``jobs_submitted`` = finished + cancelled + unfinished."""
    gang_violations: int = 0
    """Gang attempts not committed whole in one transaction, or that ran part of their tasks
    (:func:`ops.invariants.gang_violations`), and partial gangs holding resources at the read."""
    gang_attempts: int = 0
    """Gang attempts committed (counted)."""
    preemptions: int = 0
    """Assignments a preemption ended (stopped, ``preempted``): counted, not judged; a preempted
    run followed by a new run of its job is not a double run (:func:`ops.invariants.double_runs`)."""
    schedule_slots_fired: int = 0
    """Slots of schedules recorded fired, each with its one job (counted)."""
    schedule_slots_skipped: int = 0
    """Slots recorded skipped, each with its reason (counted)."""
    schedule_slot_errors: int = 0
    """Slots of a schedule between its creation and the end of the run not recorded exactly once
    (:func:`ops.invariants.schedule_slot_errors`): missing, not a slot of its cron, fired with no
    job, skipped with no reason, or left unrecorded behind a stalled cursor."""
    finish_required: bool = True
    """Whether an unfinished job fails the check (the caller waited for every job); False: a look
    at a cluster that may still be running some, which reports them as running."""
    shared_units: int = 0
    """Device units held by two jobs at once on one worker: by two active assignments (from the
    database) or by two running jobs (from the workers' logs) (docs/devices.md)."""
    device_assignments: int = 0
    """Assignments that held device units (counted, not judged)."""

    @property
    def ok(self) -> bool:
        return (
            self.double_placements == 0
            and self.double_runs == 0
            and self.shared_units == 0
            and self.false_deaths == 0
            and self.lost_successes == 0
            and self.jobs_killed_by_outage == 0
            and self.acknowledged_submissions_lost == 0
            and self.wrong_final_states == 0
            and self.schedule_slot_errors == 0
            and self.gang_violations == 0
            and (not self.unfinished_job_ids or not self.finish_required)
        )

    @property
    def undisturbed(self) -> bool:
        """True when the run had one election, no death, no self-fence and one assignment per job:
        what a run with no injected fault must show, however loaded the machine."""
        return (
            self.elections <= 1
            and self.worker_deaths == 0
            and self.self_fences == 0
            and self.extra_assignments == 0
        )

    def to_json(self) -> dict[str, Any]:
        """The report with the stable JSON keys of ``stockade check --json``."""
        return {
            "double_placements": self.double_placements,
            "double_runs": self.double_runs,
            "false_deaths": self.false_deaths,
            "lost_successes": self.lost_successes,
            "stale_writes_rejected": self.stale_writes_rejected,
            "jobs_submitted": self.jobs_submitted,
            "jobs_finished": self.jobs_finished,
            "jobs_cancelled": self.jobs_cancelled,
            "unfinished_job_ids": list(self.unfinished_job_ids),
            "jobs_unfinished": dict(self.unfinished_states),
            "finish_required": self.finish_required,
            "elections": self.elections,
            "worker_deaths": self.worker_deaths,
            "self_fences": self.self_fences,
            "pauses": self.pauses,
            "extra_assignments": self.extra_assignments,
            "worker_leaves": self.worker_leaves,
            "preemptions": self.preemptions,
            "jobs_killed_by_outage": self.jobs_killed_by_outage,
            "acknowledged_submissions_lost": self.acknowledged_submissions_lost,
            "wrong_final_states": self.wrong_final_states,
            "schedule_slots_fired": self.schedule_slots_fired,
            "schedule_slots_skipped": self.schedule_slots_skipped,
            "schedule_slot_errors": self.schedule_slot_errors,
            "shared_units": self.shared_units,
            "device_assignments": self.device_assignments,
            "gang_violations": self.gang_violations,
            "gang_attempts": self.gang_attempts,
            "details": list(self.details),
            "ok": self.ok,
        }


def report_rows(report: CheckReport) -> list[VerdictRow]:
    """The rows :func:`ops.checker.check_table` shows (also the checker's part of ``stockade
    chaos``'s table); unfinished jobs show as a ``jobs_unfinished`` row, by state."""
    finished: bool | str = not report.unfinished_job_ids
    if report.unfinished_job_ids and not report.finish_required:
        finished = "running"
    unfinished: list[VerdictRow] = []
    if report.unfinished_job_ids:
        by_state = ", ".join(f"{state} {count}" for state, count in report.unfinished_states.items())
        unfinished = [("jobs_unfinished", f"{len(report.unfinished_job_ids)} ({by_state})", None)]
    return [
        ("double_placements (database)", str(report.double_placements), report.double_placements == 0),
        ("double_runs (workers' logs)", str(report.double_runs), report.double_runs == 0),
        ("shared_units (database, workers' logs)", str(report.shared_units), report.shared_units == 0),
        ("jobs_submitted", str(report.jobs_submitted), None),
        ("jobs_finished", str(report.jobs_finished), finished),
        *([("jobs_cancelled", str(report.jobs_cancelled), None)] if report.jobs_cancelled else []),
        *unfinished,
        ("false_deaths", str(report.false_deaths), report.false_deaths == 0),
        ("lost_successes", str(report.lost_successes), report.lost_successes == 0),
        ("jobs_killed_by_outage", str(report.jobs_killed_by_outage), report.jobs_killed_by_outage == 0),
        (
            "acknowledged_submissions_lost",
            str(report.acknowledged_submissions_lost),
            report.acknowledged_submissions_lost == 0,
        ),
        ("wrong_final_states", str(report.wrong_final_states), report.wrong_final_states == 0),
        (
            "schedule slots fired / skipped / errors",
            " / ".join(
                str(n)
                for n in (
                    report.schedule_slots_fired,
                    report.schedule_slots_skipped,
                    report.schedule_slot_errors,
                )
            ),
            report.schedule_slot_errors == 0,
        ),
        (
            "gang_violations",
            f"{report.gang_violations} of {report.gang_attempts} attempts",
            report.gang_violations == 0,
        ),
        ("stale_writes_rejected", str(report.stale_writes_rejected), None),
        (
            "elections / worker_deaths / pauses / self_fences",
            f"{report.elections} / {report.worker_deaths} / {report.pauses} / {report.self_fences}",
            None,
        ),
        ("extra_assignments", str(report.extra_assignments), None),
        ("preemptions", str(report.preemptions), None),
    ]


def details_lines(details: Sequence[str], limit: int = 20) -> list[Text]:
    """The first ``limit`` details, indented, as plain text (no markup)."""
    return [Text(f"  {line}") for line in details[:limit]]
