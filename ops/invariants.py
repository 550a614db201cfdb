"""The checker's counts, each a pure function of the records :mod:`ops.checker` reads, and
:func:`check`, which judges one run of the cluster with all of them. What each count means:
docs/design.md, "The checker: what it reads and what it counts"."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import attrs

from ops.checker import kill_times
from ops.checker_records import (
    FAULT_SLACK_S,
    FENCE_REASONS,
    KILL_TAKES_S,
    OUTAGE_KINDS,
    OUTAGE_SLACK_S,
    REPORT_SLACK_S,
    SCHEDULE_SLACK_S,
    AssignmentRecord,
    DeathRecord,
    FaultEvent,
    History,
    Run,
    ScheduleRecord,
    SlotRecord,
)
from ops.checker_report import CheckReport


def schedule_slot_errors(
    schedules: Sequence[ScheduleRecord], slots: Sequence[SlotRecord], job_states: Mapping[int, str]
) -> list[str]:
    """What breaks "each slot of a schedule between its creation and the end of its window is
    recorded exactly once, a fired one with exactly one job", one line each: a slot of the cron
    at or before the cursor with no record; a record that is no slot of the cron in the window
    (or is recorded twice); a fired slot whose job the database does not have; a skipped slot
    with no reason; slots more than :data:`SCHEDULE_SLACK_S` before the window's end left
    behind the cursor (a schedule that stopped firing). Slots are computed as the scheduler
    computes them (:mod:`runtime.schedules`); times are compared to the millisecond."""
    import datetime as dt

    from runtime.schedules import parse_cron, slots_between, zone

    def ms(t: float) -> int:
        return round(t * 1000)

    by_schedule: dict[int, list[SlotRecord]] = defaultdict(list)
    for slot in slots:
        by_schedule[slot.schedule_id].append(slot)
    found: list[str] = []
    for schedule in schedules:
        name = f"schedule {schedule.name} ({schedule.schedule_id})"
        start = dt.datetime.fromtimestamp(schedule.created_at, dt.UTC)
        end = dt.datetime.fromtimestamp(schedule.ended_at, dt.UTC)
        expected = [
            ms(s.timestamp())
            for s in slots_between(parse_cron(schedule.cron), zone(schedule.tz), start, end, limit=10**7)
        ]
        recorded = [ms(s.slot_at) for s in by_schedule.pop(schedule.schedule_id, [])]
        counts: dict[int, int] = defaultdict(int)
        for at in recorded:
            counts[at] += 1
        for at, n in counts.items():
            if n > 1:
                found.append(f"{name}: slot {at / 1000:.3f} recorded {n} times")
        known = set(expected)
        found += [
            f"{name}: slot {at / 1000:.3f} recorded but no slot of {schedule.cron!r} in its window"
            for at in sorted(counts)
            if at not in known
        ]
        through, lag_end = ms(schedule.slots_through), ms(schedule.ended_at - SCHEDULE_SLACK_S)
        missing = [at for at in expected if at <= through and at not in counts]
        found += [f"{name}: slot {at / 1000:.3f} never recorded" for at in missing]
        stalled = [at for at in expected if through < at <= lag_end]
        if stalled:
            found.append(
                f"{name}: {len(stalled)} slots from {stalled[0] / 1000:.3f} never recorded (its cursor "
                f"stopped at {through / 1000:.3f}, the window ended at {schedule.ended_at:.3f})"
            )
    for slot in slots:
        if slot.outcome == "fired" and (slot.job_id is None or slot.job_id not in job_states):
            found.append(
                f"schedule {slot.schedule_id}: slot {slot.slot_at:.3f} fired, but its job is missing"
            )
        if slot.outcome == "skipped" and not slot.reason:
            found.append(f"schedule {slot.schedule_id}: slot {slot.slot_at:.3f} skipped with no reason")
    return found


def _overlap(a_start: float, a_end: float, b_start: float, b_end: float) -> bool:
    return a_start < b_end and b_start < a_end


def double_placements(assignments: Iterable[AssignmentRecord]) -> dict[int, str]:
    """Jobs placed twice, with why: two assignments active at once, or placed again after one
    of its assignments finished."""
    by_job: dict[int, list[AssignmentRecord]] = defaultdict(list)
    for a in assignments:
        by_job[a.job_id].append(a)
    found: dict[int, str] = {}
    for job_id, group in by_job.items():
        group.sort(key=lambda a: (a.created_at, a.assignment_id))
        for i, first in enumerate(group):
            first_end = math.inf if first.ended_at is None else first.ended_at
            for second in group[i + 1 :]:
                second_end = math.inf if second.ended_at is None else second.ended_at
                if _overlap(first.created_at, first_end, second.created_at, second_end):
                    found[job_id] = (
                        f"job {job_id}: assignments {first.assignment_id} (epoch {first.epoch}, "
                        f"{first.worker_id}) and {second.assignment_id} (epoch {second.epoch}, "
                        f"{second.worker_id}) were active at the same time"
                    )
                elif first.state == "finished" and not _failed_run(first) and not _gang_rerun(first, second):
                    # A run that failed may be retried; one that succeeded never runs again.
                    found[job_id] = (
                        f"job {job_id}: placed again as assignment {second.assignment_id} "
                        f"(epoch {second.epoch}) after assignment {first.assignment_id} finished"
                    )
    return found


def _gang_rerun(first: AssignmentRecord, second: AssignmentRecord) -> bool:
    """Whether ``second`` is a gang task's run in a later attempt of its gang than ``first``:
    a task that succeeded runs again when its gang's attempt broke (docs/gangs.md)."""
    return (
        first.gang_attempt is not None
        and second.gang_attempt is not None
        and second.gang_attempt > first.gang_attempt
    )


def gang_violations(history: History, runs: Iterable[Run]) -> list[str]:
    """What breaks a gang's all or nothing, one line each: an attempt whose assignments are not
    its gang's size, or were committed in more than one transaction or epoch; an attempt all of
    whose tasks succeeded while the workers' logs show some never started; partial gangs holding
    resources when the history was read (``History.partial_gangs``)."""
    started = {r.assignment_id for r in runs}
    found = []
    for g in history.gang_attempts:
        where = f"gang {g.gang_id} attempt {g.attempt}"
        if len(g.assignment_ids) != g.size or g.transactions != 1 or g.epochs != 1:
            found.append(
                f"{where}: {len(g.assignment_ids)} of {g.size} assignments committed in "
                f"{g.transactions} transactions and {g.epochs} epochs"
            )
        elif g.succeeded and runs and not started.issuperset(g.assignment_ids):
            missing = sorted(set(g.assignment_ids) - started)
            found.append(f"{where}: succeeded, but assignments {missing} never started on their workers")
    if history.partial_gangs:
        found.append(f"{history.partial_gangs} partial gangs held resources when the history was read")
    return found


def _failed_run(a: AssignmentRecord) -> bool:
    """Whether ``a`` finished with a failed run (its end reason is ``failed`` or the reason of
    the failure, ``timeout``, ``oom_killed``, ...): its job may be placed again (a retry)."""
    return a.state == "finished" and a.end_reason is not None and a.end_reason != "succeeded"


def _as_dependency(history: History, job_id: int | None) -> str:
    """The state of ``job_id`` as a dependency (:attr:`History.dependency_states`, else its
    own); ``failed`` for None (no dependency named: nothing to check)."""
    if job_id is None:
        return "failed"
    return history.dependency_states.get(job_id) or history.job_states.get(job_id, "failed")


def wrong_final_states(history: History, expected: Mapping[int, str] | None = None) -> dict[int, str]:
    """Jobs whose final state contradicts their runs, their retry budget, their dependencies
    or ``expected`` (job id -> the final state its submitter knows it must reach), with why:
    more failed runs than ``max_attempts``; ``failed`` with attempts left (but by a failure
    policy or a cancel asked while it ran, ``History.policy_jobs``); ``succeeded`` with
    no run whose success the database holds; cancelled as ``dependency_failed`` naming a job
    that did not fail; another final state than expected."""
    failed_runs: dict[int, int] = defaultdict(int)
    succeeded: set[int] = set()
    for a in history.assignments:
        if _failed_run(a):
            failed_runs[a.job_id] += 1
        if a.success_recorded:
            succeeded.add(a.job_id)
    found: dict[int, str] = {}
    for job_id, state in history.job_states.items():
        spent: int | None
        most: int | None
        spent, most = history.job_attempts.get(job_id, (None, None))
        if most is not None and failed_runs[job_id] > most:
            found[job_id] = (
                f"job {job_id}: {failed_runs[job_id]} failed runs, more than its max_attempts {most}"
            )
        elif (
            state == "failed"
            and spent is not None
            and most is not None
            and spent < most
            and job_id not in history.policy_jobs
        ):
            found[job_id] = f"job {job_id}: failed with attempts left ({spent} of {most} spent)"
        elif state == "succeeded" and job_id not in succeeded:
            found[job_id] = f"job {job_id}: succeeded, but no run of it reported a success"
        elif state == "cancelled" and _as_dependency(history, history.dependency_cancels.get(job_id)) not in (
            "failed",
            "cancelled",
        ):
            dependency = history.dependency_cancels[job_id]
            found[job_id] = (
                f"job {job_id}: cancelled as dependency_failed: job {dependency}, which ended "
                f"{_as_dependency(history, dependency)}"
            )
        elif (
            expected
            and job_id in expected
            and state in ("succeeded", "failed", "cancelled")
            and state != expected[job_id]
        ):
            found[job_id] = f"job {job_id}: ended {state}, expected {expected[job_id]}"
    return found


def preempted_ends(assignments: Iterable[AssignmentRecord]) -> dict[int, float]:
    """Assignment id -> when the database ended it, for the assignments a preemption ended
    (state ``stopped``, end reason ``preempted``): their worker acknowledged the stop first."""
    return {
        a.assignment_id: a.ended_at
        for a in assignments
        if a.state == "stopped" and a.end_reason == "preempted" and a.ended_at is not None
    }


def double_runs(runs: Iterable[Run], preempted: Mapping[int, float] | None = None) -> dict[int, str]:
    """Jobs that ran at overlapping times under two assignments or on two workers, with why.

    A run of a preempted assignment (``preempted``: assignment id -> the database's end of it,
    :func:`preempted_ends`) ended at the latest when the database ended the assignment: its
    worker acknowledged the stop before that fenced end, and the job's next placement came
    after it (invariant 6). So a preempted run followed by a new run is not a double run, even
    where its stop record is missing or dated a little later by the worker's clock; a new run
    that began before the preemption's end still is.
    """
    by_job: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        if preempted and run.assignment_id in preempted:
            run = attrs.evolve(run, ended_at=min(run.ended_at, preempted[run.assignment_id]))
        by_job[run.job_id].append(run)
    found: dict[int, str] = {}
    for job_id, group in by_job.items():
        group.sort(key=lambda r: r.started_at)
        for i, first in enumerate(group):
            for second in group[i + 1 :]:
                if _overlap(first.started_at, first.ended_at, second.started_at, second.ended_at):
                    found[job_id] = (
                        f"job {job_id}: ran on {first.worker_id} (assignment {first.assignment_id}) "
                        f"and on {second.worker_id} (assignment {second.assignment_id}) at the same time"
                    )
    return found


def shared_units(
    assignments: Iterable[AssignmentRecord], runs: Iterable[Run], preempted: Mapping[int, float] | None = None
) -> dict[str, str]:
    """Device units held by two jobs at once on one worker, with why (docs/devices.md): two
    assignments of different jobs, both active at once (from the database), or two runs of
    different jobs at overlapping times (from the workers' logs, across the agent's restarts),
    holding one (worker, resource, unit). Keyed by the unit, ``w-1 gpu 3``. A preempted run ends
    at the latest when the database ended its assignment, as in :func:`double_runs`."""
    found: dict[str, str] = {}
    held: dict[tuple[str, str, str], list[tuple[float, float, int, str]]] = defaultdict(list)
    for a in assignments:
        end = math.inf if a.ended_at is None else a.ended_at
        for name, unit in a.units:
            held[(a.worker_id, name, unit)].append(
                (a.created_at, end, a.job_id, f"assignment {a.assignment_id}")
            )
    ran: dict[tuple[str, str, str], list[tuple[float, float, int, str]]] = defaultdict(list)
    for run in runs:
        if preempted and run.assignment_id in preempted:
            run = attrs.evolve(run, ended_at=min(run.ended_at, preempted[run.assignment_id]))
        for name, unit in run.units:
            ran[(run.worker_id, name, unit)].append(
                (run.started_at, run.ended_at, run.job_id, f"the run of assignment {run.assignment_id}")
            )
    for source, where in ((held, "active"), (ran, "running")):
        for (worker_id, name, unit), spans in source.items():
            spans.sort()
            for i, (start, end, job_id, what) in enumerate(spans):
                for other_start, other_end, other_job, other_what in spans[i + 1 :]:
                    if other_start >= end:
                        break
                    if other_job != job_id and _overlap(start, end, other_start, other_end):
                        found.setdefault(
                            f"{worker_id} {name} {unit}",
                            f"{worker_id} {name} {unit}: held by job {job_id} ({what}) and job "
                            f"{other_job} ({other_what}), both {where} at the same time",
                        )
    return found


def false_deaths(deaths: Iterable[DeathRecord], faults: Sequence[FaultEvent]) -> list[str]:
    """Declarations no fault explains: the worker was neither killed, frozen, cut off nor
    stopped cleanly from ``FAULT_SLACK_S`` before its last recorded heartbeat until it was
    declared dead."""
    found = []
    for death in deaths:
        explained = any(
            f.target == death.worker_id
            and f.at <= death.declared_at
            and f.until >= death.last_heartbeat_at - FAULT_SLACK_S
            for f in faults
        )
        if not explained:
            found.append(
                f"worker {death.worker_id} (incarnation {death.incarnation}) declared dead "
                f"under epoch {death.epoch} with no fault injected into it and no clean stop logged"
            )
    return found


def killed_by_outage(runs: Iterable[Run], faults: Sequence[FaultEvent]) -> list[str]:
    """Runs the cluster stopped (:data:`FENCE_REASONS`) during an outage of the whole cluster
    (:data:`OUTAGE_KINDS`) or up to ``OUTAGE_SLACK_S`` after it, on a worker that no fault of
    its own (kill, freeze, partition) touched from ``FAULT_SLACK_S`` before the run ended
    until it ended."""
    outages = [f for f in faults if f.kind in OUTAGE_KINDS]
    found = []
    for run in runs:
        if run.stop_reason not in FENCE_REASONS or math.isinf(run.ended_at):
            continue
        during = [f for f in outages if f.at <= run.ended_at <= f.until + OUTAGE_SLACK_S]
        if not during:
            continue
        own = any(
            f.target == run.worker_id and f.at <= run.ended_at and f.until >= run.ended_at - FAULT_SLACK_S
            for f in faults
        )
        if not own:
            found.append(
                f"job {run.job_id} (assignment {run.assignment_id}) on {run.worker_id} stopped "
                f"({run.stop_reason}) by the {during[0].kind} "
                f"from {during[0].at:.3f} to {during[0].until:.3f}"
            )
    return found


def lost_successes(
    runs: Iterable[Run],
    assignments: Iterable[AssignmentRecord],
    faults: Sequence[FaultEvent] = (),
    job_states: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """Jobs with a success on a worker that the database does not record, with why (see the
    docs/design.md, 'The checker'); a kill of the worker within ``REPORT_SLACK_S`` after the run excuses it.
    With ``job_states`` (job id -> state), also a success recorded on a job's last assignment
    whose job ended otherwise."""
    records = list(assignments)
    by_id = {a.assignment_id: a for a in records}
    last = {a.job_id: a for a in sorted(records, key=lambda a: a.assignment_id)}
    kills = kill_times(faults)
    found: dict[int, str] = {}
    for run in runs:
        if run.stop_reason != "succeeded":
            continue
        record = by_id.get(run.assignment_id)
        if record is not None and (record.success_recorded or record.state == "active"):
            continue  # still active: the worker's next heartbeat reports it
        window = (run.ended_at - KILL_TAKES_S, run.ended_at + REPORT_SLACK_S)
        if any(window[0] <= k <= window[1] for k in kills.get(run.worker_id, ())):
            continue
        how = (
            "unknown to the database" if record is None else f"recorded {record.state} ({record.end_reason})"
        )
        found[run.job_id] = (
            f"job {run.job_id}: succeeded on {run.worker_id} (assignment {run.assignment_id}), "
            f"but the assignment is {how}"
        )
    for job_id, state in (job_states or {}).items():
        record = last.get(job_id)
        if record is None or not record.success_recorded or state == "succeeded" or job_id in found:
            continue
        found[job_id] = (
            f"job {job_id}: its last assignment {record.assignment_id} (on {record.worker_id}) "
            f"recorded a success, but the job ended {state}"
        )
    return found


def extra_assignments(assignments: Iterable[AssignmentRecord]) -> int:
    """Assignments beyond one per job that was placed at all."""
    records = list(assignments)
    return len(records) - len({a.job_id for a in records})


def check(
    history: History,
    runs: Sequence[Run],
    faults: Sequence[FaultEvent] = (),
    *,
    self_fences: int = 0,
    pauses: int = 0,
    acknowledged_job_ids: Iterable[int] = (),
    expected_final_states: Mapping[int, str] | None = None,
    finish_required: bool = True,
) -> CheckReport:
    """Judge one run of the cluster. Pure: docs/design.md, 'The checker', says what each count means.

    Args:
        history: what the database says happened.
        runs: the runs from the workers' logs (:func:`load_runs`).
        faults: what a harness injected.
        self_fences: ``self_fence`` records in the workers' logs (:func:`count_self_fences`).
        pauses: ``pause`` records in the workers' logs.
        acknowledged_job_ids: job ids clients were given (each must exist in ``history``).
        expected_final_states: job id -> the final state it must reach (a harness that
            submitted jobs made to fail or succeed knows).
        finish_required: an unfinished job fails the check (the caller waited for them all);
            False: it is reported as running.
    """
    placed_twice = double_placements(history.assignments)
    preempted = preempted_ends(history.assignments)
    ran_twice = double_runs(runs, preempted)
    units_shared = shared_units(history.assignments, runs, preempted)
    wrongly_dead = false_deaths(history.deaths, faults)
    thrown_away = lost_successes(runs, history.assignments, faults, history.job_states)
    outage_kills = killed_by_outage(runs, faults)
    wrong_states = wrong_final_states(history, expected_final_states)
    slot_errors = schedule_slot_errors(history.schedules, history.schedule_slots, history.job_states)
    gangs_broken = gang_violations(history, runs)
    lost_ids = sorted(set(acknowledged_job_ids) - set(history.job_states))
    finished = {j for j, s in history.job_states.items() if s in ("succeeded", "failed", "cancelled")}
    unfinished = tuple(sorted(set(history.job_states) - finished))
    details = [
        *placed_twice.values(),
        *ran_twice.values(),
        *units_shared.values(),
        *wrongly_dead,
        *thrown_away.values(),
        *outage_kills,
        *wrong_states.values(),
        *slot_errors,
        *gangs_broken,
        *(f"job {j} was acknowledged to its client but is not in the database" for j in lost_ids),
    ]
    if unfinished:
        shown = ", ".join(map(str, unfinished[:20])) + (" ..." if len(unfinished) > 20 else "")
        if finish_required:
            details.append(f"{len(unfinished)} jobs unfinished: {shown}")
        else:
            details.append(
                f"{len(unfinished)} jobs not finished yet (not a failure; --wait-s S waits for them): {shown}"
            )
    states = [history.job_states[j] for j in unfinished]
    unfinished_states = {s: states.count(s) for s in sorted(set(states), key=_state_order)}
    return CheckReport(
        double_placements=len(placed_twice),
        double_runs=len(ran_twice),
        false_deaths=len(wrongly_dead),
        stale_writes_rejected=history.stale_writes_rejected,
        jobs_submitted=len(history.job_states),
        jobs_finished=sum(1 for s in history.job_states.values() if s in ("succeeded", "failed")),
        jobs_cancelled=sum(1 for s in history.job_states.values() if s == "cancelled"),
        unfinished_job_ids=unfinished,
        details=tuple(details),
        lost_successes=len(thrown_away),
        elections=history.elections,
        worker_deaths=len(history.deaths),
        self_fences=self_fences,
        pauses=pauses,
        extra_assignments=extra_assignments(history.assignments),
        worker_leaves=history.leaves,
        preemptions=len(preempted),
        jobs_killed_by_outage=len(outage_kills),
        acknowledged_submissions_lost=len(lost_ids),
        wrong_final_states=len(wrong_states),
        schedule_slots_fired=sum(1 for s in history.schedule_slots if s.outcome == "fired"),
        schedule_slots_skipped=sum(1 for s in history.schedule_slots if s.outcome == "skipped"),
        schedule_slot_errors=len(slot_errors),
        gang_violations=len(gangs_broken),
        gang_attempts=len(history.gang_attempts),
        unfinished_states=unfinished_states,
        finish_required=finish_required,
        shared_units=len(units_shared),
        device_assignments=sum(1 for a in history.assignments if a.units),
    )


def _state_order(state: str) -> tuple[int, str]:
    """Job states in their life's order (waiting, pending, assigned, running), others last."""
    order = ("waiting", "pending", "assigned", "running")
    return (order.index(state) if state in order else len(order), state)
