"""Ingest's replies and reported outcomes: rows as protobuf, protobuf as checked fields.

Pure functions of the rows the ingest's queries return (:mod:`actors.queries`) and of the
requests it gets; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from actors import queries, validation
from actors.rows import columns, or_unset
from protocol import pb
from runtime.validation import JOB_STATES
from runtime.wire_jobs import job_spec_to_pb


def _exit_code(row: Any) -> dict[str, Any]:
    """``has_exit_code`` and ``exit_code`` from a row's ``exit_code`` column (NULL: none)."""
    return {"has_exit_code": row["exit_code"] is not None, "exit_code": row["exit_code"] or 0}


def job_info(row: Any, *, env_values: bool) -> pb.JobInfo:
    """A ``JobInfo`` from a row of :data:`actors.queries.GET_JOB`; without ``env_values`` its
    spec's environment values are :data:`runtime.jobs.HIDDEN_ENV_VALUE` (its names kept). A
    gang's task's spec holds the gang's ``tasks`` and ``spread`` (kept in ``gangs``, not in the
    task's row), so it reads back as the gang that was submitted."""
    spec = queries.job_spec_of(row)
    if row.get("gang_id") is not None:
        spec = attrs.evolve(spec, tasks=int(row["gang_size"]), spread=bool(row["gang_spread"]))
    info = pb.JobInfo(
        job_id=row["id"],
        spec=job_spec_to_pb(spec if env_values else spec.env_values_hidden()),
        **columns(row, "state", "reason", "attempts", "failures", "owner"),
        **or_unset(row, "", "worker_id", "stdout_path", "stderr_path"),
        **or_unset(row, 0, "assignment_id", "epoch", "array_id", "array_index"),
        **or_unset(row, 0.0, "submitted_unix_s", "started_unix_s", "finished_unix_s", "read_unix_s"),
        **_exit_code(row),
        not_before_unix_s=row["not_before_unix_s"] or 0.0 if row["state"] == "pending" else 0.0,
    )
    if row.get("gang_id") is not None:
        info.gang = pb.JobGang(
            gang_id=row["gang_id"],
            rank=row["gang_rank"],
            size=row["gang_size"],
            spread=row["gang_spread"],
            state=row["gang_state"],
            attempts=row["gang_attempts"],
            failures=row["gang_failures"],
            detail=row["gang_detail"],
        )
    if row.get("schedule_name") is not None:
        info.schedule = row["schedule_name"]
        info.schedule_slot_unix_s = row["schedule_slot_unix_s"]
    if row["cancel_requested"] and row["state"] in ("assigned", "running"):
        # A task its array's max_failed_tasks cancels says so (schema.sql, array_task_failed),
        # as a job a schedule's replace cancels does (FIRE_SCHEDULE_SLOTS).
        why = row["detail"] or ""
        told = why.startswith(("max_failed_tasks:", "replaced by schedule "))
        info.reason = "cancelling: " + why if told else "cancelling"
    elif row["detail"] and not info.reason:
        info.reason = row["detail"]
    return info


def array_counts(rows: list[Any]) -> list[pb.JobCount]:
    """An array's tasks per state (rows of :data:`actors.queries.ARRAY_COUNTS`), in the order of
    :data:`runtime.JOB_STATES`, states with no task left out."""
    by_state = {r["state"]: int(r["count"]) for r in rows}
    return [pb.JobCount(state=s, count=by_state[s]) for s in JOB_STATES if s in by_state]


def attempt_info(row: Any) -> pb.Attempt:
    """An ``Attempt`` from a row of :data:`actors.queries.JOB_ATTEMPTS` (``units``: JSON
    {resource: [unit, ...]} of the device units it holds or held)."""
    held = json.loads(row["units"]) if isinstance(row.get("units"), str) else row.get("units") or {}
    return pb.Attempt(
        assignment_id=row["id"],
        **columns(row, "worker_id", "epoch", "state", "end_reason", "detail", "counted"),
        **or_unset(row, 0.0, "created_unix_s", "ended_unix_s"),
        **_exit_code(row),
        units=[pb.ResourceUnits(name=name, units=list(units)) for name, units in sorted(held.items())],
    )


def job_events_reply(job_id: int, rows: list[Any]) -> pb.GetJobEventsReply:
    """A ``GetJobEventsReply`` from the rows of :data:`actors.queries.JOB_EVENTS` (at least one:
    every job has its ``submitted`` event), in their order."""
    return pb.GetJobEventsReply(
        job_id=job_id,
        state=rows[0]["job_state"],
        events=[
            pb.JobEvent(
                kind=r["kind"],
                **or_unset(r, "", "worker_id", "leader", "state", "reason", "outcome", "detail"),
                **or_unset(r, 0, "assignment_id", "incarnation", "epoch"),
                **or_unset(r, 0.0, "at_unix_s", "not_before_unix_s"),
                **_exit_code(r),
            )
            for r in rows
        ],
    )


def outcome_log_keys(finished: list[pb.JobOutcome]) -> dict[str, list[Any]]:
    """The log keys of reported outcomes, as parallel lists: ``job_ids``, ``assignment_ids``,
    ``states``; none for no outcome (a line about one batch lists its ids, runtime/log.py)."""
    if not finished:
        return {}
    return {
        "job_ids": [o.job_id for o in finished],
        "assignment_ids": [o.assignment_id for o in finished],
        "states": [o.state for o in finished],
    }


def outcome_arrays(finished: list[pb.JobOutcome]) -> tuple[list[Any], ...]:
    """Reported outcomes as the parallel arrays record_outcomes (schema.sql) takes: assignment
    ids, states, exit codes (None for none), run lengths and how long before the report each
    run ended (ms, the worker's monotonic clock), stdout and stderr paths, details."""
    return (
        [o.assignment_id for o in finished],
        [o.state for o in finished],
        [o.exit_code if o.has_exit_code else None for o in finished],
        [o.run_ms for o in finished],
        [o.ended_ago_ms for o in finished],
        [o.stdout_path or None for o in finished],
        [o.stderr_path or None for o in finished],
        [o.detail for o in finished],
    )


def outcome_fields(outcome: pb.JobOutcome) -> dict[str, object]:
    """A JobOutcome as the keyword arguments of :func:`actors.validation.check_outcome`."""
    fields = ("assignment_id", "job_id", "state", "run_ms", "ended_ago_ms", "stdout_path", "stderr_path")
    return {f: getattr(outcome, f) for f in (*fields, "detail")}


def check_outcomes(finished: list[pb.JobOutcome]) -> None:
    """Check reported outcomes; raises InvalidArgument for an outcome's field out of range."""
    validation.check_outcomes([outcome_fields(o) for o in finished])


def leave_verdict(worker_id: str, incarnation: int, row: Any) -> tuple[bool, str]:
    """Whether a leave of ``worker_id``'s ``incarnation`` left the row ``left``, and why, from
    the row of :data:`actors.queries.LEAVE_WORKER` (None: no such worker)."""
    if row is None:
        return False, f"worker {worker_id} is unknown"
    if row["incarnation"] != incarnation:
        return False, (
            f"incarnation {incarnation} of worker {worker_id} is not current "
            f"(incarnation {row['incarnation']} is, {row['state']})"
        )
    if not row["same_run"]:
        # The run id is not shown: it is what tells the registering agent from anyone else.
        return False, f"agent_run_id is not the run that registered incarnation {incarnation} of {worker_id}"
    if row["left_now"]:
        return True, "left"
    if row["state"] == "left":
        return True, "left already (a copy of this leave)"
    return False, f"worker {worker_id} incarnation {incarnation} is {row['state']}"


@attrs.frozen(kw_only=True)
class Schedule:
    """A worker's schedule as status and the drain and cordon calls show it."""

    cordoned: bool
    """No new placement on it (a drain cordons too)."""
    draining: bool
    """A drain was asked and jobs are still active on it."""
    drained: bool
    """A drain was asked and no job is active on it: its agent can be stopped, nothing lost."""


def schedule_of(*, cordoned: bool, drain_requested: bool, active_jobs: int) -> Schedule:
    """A worker's :class:`Schedule` from its row and how many assignments are active on it (any
    incarnation's: drained means no job of it runs anywhere)."""
    return Schedule(
        cordoned=cordoned,
        draining=drain_requested and active_jobs > 0,
        drained=drain_requested and active_jobs == 0,
    )


def _schedule_fields(row: Any) -> dict[str, Any]:
    """``cordoned``, ``draining`` and ``drained`` of a worker's row that lists its ``job_ids``."""
    drain_requested, active_jobs = bool(row["drain_requested"]), len(row["job_ids"])
    return attrs.asdict(
        schedule_of(cordoned=bool(row["cordoned"]), drain_requested=drain_requested, active_jobs=active_jobs)
    )


def worker_schedule_reply(row: Any) -> pb.WorkerScheduleReply:
    """A ``WorkerScheduleReply`` from an answer row of :data:`actors.queries.CORDON_WORKER`,
    ``UNCORDON_WORKER`` or ``DRAIN_WORKER`` (a JSON object: the stored answer)."""
    job_ids = [int(j) for j in row["job_ids"]]
    return pb.WorkerScheduleReply(
        worker_id=row["id"],
        **_schedule_fields(row),
        drain_deadline_unix_s=row["drain_deadline_unix_s"] or 0.0,
        job_ids=job_ids,
        unhealthy=bool(row.get("unhealthy", False)),
        unhealthy_reason=row.get("unhealthy_reason") or "",
    )


def usage_now(value: Sequence[int] | None) -> pb.UsageNow | None:
    """The newest usage sample from ``[cpu_millis, memory_mb, age in ms]`` (a ``usage_now`` of
    :data:`actors.queries.STATUS_WORKERS` or :data:`actors.queries.JOB_USAGE_NOW`); None: none."""
    if value is None:
        return None
    cpu_millis, memory_mb, age_ms = value
    return pb.UsageNow(cpu_millis=cpu_millis, memory_mb=memory_mb, age_s=max(0, age_ms) / 1000)


def _worker_info(r: Any) -> pb.WorkerInfo:
    """A ``WorkerInfo`` from a row of :data:`actors.queries.STATUS_WORKERS`."""
    return pb.WorkerInfo(
        **columns(r, "id", "address", "state", "incarnation"),
        **columns(r, "cpu_millis", "memory_mb", "cpu_allocated_millis", "memory_allocated_mb"),
        job_ids=list(r["job_ids"]),
        last_heartbeat_age_s=r["heartbeat_age_s"],
        **_schedule_fields(r),
        labels=json.loads(r["labels"]) if r["labels"] else {},
        unhealthy=bool(r["unhealthy"]),
        unhealthy_reason=r["unhealthy_reason"] or "",
        **or_unset(r, 0.0, "drain_deadline_unix_s", "unhealthy_since_unix_s"),
        resources=[
            pb.ResourceUnits(name=name, units=list(units))
            for name, units in sorted(json.loads(r.get("resources") or "{}").items())
        ],
        resources_in_use=_units_in_use(r.get("units_in_use")),
        usage=usage_now(r.get("usage_now")),
    )


def _units_in_use(text: str | None) -> list[pb.ResourceUnits]:
    """The units held on a worker (JSON [[name, unit], ...], sorted; None: none), by resource."""
    held: dict[str, list[str]] = {}
    for name, unit in json.loads(text) if text else ():
        held.setdefault(name, []).append(unit)
    return [pb.ResourceUnits(name=name, units=units) for name, units in held.items()]


def status_reply(
    cp_id: str,
    lease: Any,
    cps: list[Any],
    workers: list[Any],
    counts: list[Any],
    stuck: list[Any],
    *,
    env_values: bool,
    heartbeat_policy: Any = None,
) -> tuple[pb.StatusReply, dict[str, Any]]:
    """The status reply from the rows of its queries, with its lists of workers and of
    unschedulable jobs apart, to be built lazily (the ``elements`` of
    :func:`protocol.wire.encode_steps`); ``heartbeat_policy``: None when not read."""
    assert lease is not None
    leader = lease["holder"] if lease["live"] and lease["holder"] else ""
    by_state = {r["state"]: r["count"] for r in counts}
    reply = pb.StatusReply(
        leader=leader,
        epoch=lease["epoch"],
        control_planes=[
            pb.ControlPlaneInfo(
                id=r["id"],
                address=r["address"],
                seen_unix_s=r["seen_unix_s"],
                role="leader" if r["id"] == leader else ("standby" if r["up"] else "down"),
            )
            for r in cps
        ],
        jobs=[pb.JobCount(state=s, count=by_state.get(s, 0)) for s in JOB_STATES],
        answered_by=cp_id,
    )
    if heartbeat_policy is not None:
        reply.heartbeat_interval_ms = heartbeat_policy["interval_ms"]
        reply.dead_after_ms = heartbeat_policy["dead_after_ms"]
        reason = heartbeat_policy["reason"]
        # The leader's reason states the cluster as it was when it chose (a new interval is
        # taken only past a tenth of the one in force), not the cluster now.
        reply.heartbeat_policy = f"when chosen: {reason}" if reason else "the control planes' settings"
    elements = {
        "workers": (_worker_info(r) for r in workers),
        "unschedulable": (job_info(r, env_values=env_values) for r in stuck),
    }
    return reply, elements
