"""The checker: proves from the record that no job was placed or run twice.

It reads the database history, the workers' ``agent.jsonl`` and the faults a harness recorded
or an operator gave; :func:`ops.invariants.check` counts what they show. What it reads and what
each count means: docs/design.md, "The checker: what it reads and what it counts".
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import trio
from rich.console import Group

from ops.checker_records import (
    CLEAN_STOP,
    FAULT_KINDS,
    KILLED_AGENT_RUN_ON_S,
    AssignmentRecord,
    DeathRecord,
    FaultEvent,
    GangAttemptRecord,
    History,
    Run,
    ScheduleRecord,
    SlotRecord,
)
from ops.checker_report import CheckReport, details_lines, report_rows
from ops.tables import verdict_table
from runtime.aio import PgConnection
from runtime.errors import InvalidArgument
from runtime.text import read_jsonl


def check_table(report: CheckReport) -> Group:
    """The report for the terminal: a verdict per count, then the first 20 details."""
    rows = [*report_rows(report), ("worker_leaves (clean stops)", str(report.worker_leaves), None)]
    return Group(verdict_table(rows), *details_lines(report.details))


def placement_recoveries_s(
    assignments: Iterable[AssignmentRecord], faults: Sequence[FaultEvent], kind: str = "db_outage"
) -> list[float]:
    """Per database outage (a fault of ``kind``: ``db_outage``, or ``db_failover``, which ends
    at the promotion), seconds from its end to the first assignment committed after it;
    outages followed by none are left out."""
    created = sorted(a.created_at for a in assignments)
    found = []
    for fault in faults:
        if fault.kind != kind:
            continue
        after = next((t for t in created if t >= fault.until), None)
        if after is not None:
            found.append(after - fault.until)
    return found


# ---------------------------------------------------------------------------- loading


def runs_from_records(records: Iterable[dict[str, Any]], faults: Sequence[FaultEvent] = ()) -> list[Run]:
    """Pair start and stop records (one worker's ``agent.jsonl`` or several) into runs.

    A start with no stop ends :data:`KILLED_AGENT_RUN_ON_S` after the first kill of its worker
    after it started, else never. Two start records of one assignment on one worker count as two
    runs. A stop record with ``"started": false`` drops itself and its start.
    """
    kills = kill_times(faults)
    open_runs: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
    runs: list[Run] = []
    for record in records:
        event = record.get("event")
        if event not in ("start", "stop"):
            continue
        key = (record["worker_id"], int(record["incarnation"]), int(record["assignment_id"]))
        if event == "start":
            open_runs[key].append(record)
        elif open_runs[key]:
            start = open_runs[key].pop(0)
            if record.get("started") is False:
                continue
            runs.append(
                Run(
                    worker_id=key[0],
                    incarnation=key[1],
                    job_id=int(start["job_id"]),
                    assignment_id=key[2],
                    started_at=float(start["time"]),
                    ended_at=float(record["time"]),
                    stop_reason=record.get("reason"),
                    units=_units(start),
                )
            )
    for (worker_id, incarnation, assignment_id), starts in open_runs.items():
        for start in starts:
            began = float(start["time"])
            killed = min((t for t in kills.get(worker_id, []) if t >= began), default=math.inf)
            ended = killed + KILLED_AGENT_RUN_ON_S
            runs.append(
                Run(
                    worker_id=worker_id,
                    incarnation=incarnation,
                    job_id=int(start["job_id"]),
                    assignment_id=assignment_id,
                    started_at=began,
                    ended_at=ended,
                    units=_units(start),
                )
            )
    return runs


def _units(start: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The (resource, unit id) pairs a start record's ``units`` ({name: [ids]}) names."""
    return tuple(
        sorted((name, str(unit)) for name, ids in (start.get("units") or {}).items() for unit in ids)
    )


def kill_times(faults: Iterable[FaultEvent]) -> dict[str, list[float]]:
    """Worker id -> the times it was killed."""
    kills: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if f.kind == "kill":
            kills[f.target].append(f.at)
    return kills


def parse_fault(text: str) -> FaultEvent:
    """A fault injected by hand, written ``KIND:ID@TIME`` or ``KIND:ID@TIME..UNTIL``.

    ``KIND`` is one of :data:`FAULT_KINDS`, ``ID`` the process it hit (``w-3``), ``TIME`` and
    ``UNTIL`` (default: ``TIME``) Unix seconds or ISO 8601 date-times (local time unless an
    offset is given): ``freeze:w-2@2026-11-30T21:33:12..2026-11-30T21:33:20``.

    Raises:
        InvalidArgument: the text does not have that shape, the kind is unknown, a time cannot
            be read, or UNTIL is before TIME.
    """
    shape = "must be KIND:ID@TIME or KIND:ID@TIME..UNTIL, e.g. kill:w-3@1764538392.5"
    head, at_sign, times = text.partition("@")
    kind, colon, target = head.partition(":")
    if not at_sign or not colon or not target or not times:
        raise InvalidArgument("fault", text, shape)
    if kind not in FAULT_KINDS:
        raise InvalidArgument("fault kind", kind, f"must be one of {', '.join(FAULT_KINDS)} (in {text!r})")
    start_text, dots, end_text = times.partition("..")
    at = _fault_time("fault TIME", start_text, text)
    until = _fault_time("fault UNTIL", end_text, text) if dots else at
    if until < at:
        raise InvalidArgument("fault UNTIL", end_text, f"must not be before TIME {start_text} (in {text!r})")
    return FaultEvent(kind=kind, target=target, at=at, until=until)


def _fault_time(field: str, value: str, text: str) -> float:
    """Unix seconds from ``value``: a number of seconds, or an ISO 8601 date-time."""
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = datetime.fromisoformat(value).timestamp()
        except ValueError:
            raise InvalidArgument(
                field, value, f"must be Unix seconds or an ISO 8601 date-time (in {text!r})"
            ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(field, value, f"must be a time after 1970-01-01 (in {text!r})")
    return seconds


def clean_stops(records: Iterable[dict[str, Any]]) -> list[FaultEvent]:
    """The clean stops among a worker's log records: one ``stop`` event per ``leave`` line,
    at the time the agent stopped heartbeating (whether or not its leave got through)."""
    return [
        FaultEvent(kind=CLEAN_STOP, target=r["worker_id"], at=float(r["time"]), until=float(r["time"]))
        for r in records
        if r.get("event") == "leave"
    ]


def load_events(path: Path | None) -> list[FaultEvent]:
    """A harness's ``events.jsonl`` (``{"kind", "target", "at", "until"}`` per line), or none."""
    if path is None or not path.exists():
        return []
    return [
        FaultEvent(
            kind=r["kind"], target=r["target"], at=float(r["at"]), until=float(r.get("until", r["at"]))
        )
        for r in read_jsonl(path)
        if "kind" in r
    ]


def load_records(worker_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Every record of every ``agent.jsonl`` under ``worker_dirs``."""
    records: list[dict[str, Any]] = []
    for directory in worker_dirs:
        log = directory / "agent.jsonl"
        if log.exists():
            records.extend(read_jsonl(log))
    return records


def load_runs(worker_dirs: Iterable[Path], faults: Sequence[FaultEvent] = ()) -> list[Run]:
    """Runs from every ``agent.jsonl`` under ``worker_dirs``."""
    return runs_from_records(load_records(worker_dirs), faults)


def count_self_fences(records: Iterable[dict[str, Any]]) -> int:
    """``self_fence`` records among ``records``."""
    return sum(1 for r in records if r.get("event") == "self_fence")


def check_logs(
    history: History,
    worker_dirs: Iterable[Path],
    faults: Sequence[FaultEvent] = (),
    *,
    acknowledged_job_ids: Iterable[int] = (),
    expected_final_states: Mapping[int, str] | None = None,
    finish_required: bool = True,
) -> CheckReport:
    """:func:`ops.invariants.check` of ``history`` against the ``agent.jsonl`` of every folder in
    ``worker_dirs``, whose clean stops (:func:`clean_stops`) count beside ``faults``."""
    from ops.invariants import check  # which reads this module's records

    records = load_records(worker_dirs)
    explained = [*faults, *clean_stops(records)]
    return check(
        history,
        runs_from_records(records, faults),
        explained,
        self_fences=count_self_fences(records),
        pauses=sum(1 for r in records if r.get("event") == "pause"),
        acknowledged_job_ids=acknowledged_job_ids,
        expected_final_states=expected_final_states,
        finish_required=finish_required,
    )


ASSIGNMENT_HISTORY = """
SELECT id AS assignment_id, job_id, worker_id, worker_incarnation AS incarnation, epoch, state,
       end_reason, outcome, extract(epoch FROM created_at)::float8 AS created_at,
       extract(epoch FROM ended_at)::float8 AS ended_at, held_units(id) AS units, gang_attempt
  FROM assignments ORDER BY id
"""
DEATH_HISTORY = """
SELECT worker_id, incarnation, epoch, extract(epoch FROM declared_at)::float8 AS declared_at,
       extract(epoch FROM last_heartbeat_at)::float8 AS last_heartbeat_at
  FROM worker_deaths ORDER BY id
"""
JOB_STATES = """
SELECT j.id, j.state, coalesce(g.failures, j.failures) AS failures, j.max_attempts,
       (cardinality(j.retry_on_exit) + cardinality(j.no_retry_on) > 0 OR j.cancel_requested) AS fails_early
  FROM jobs j LEFT JOIN gangs g ON g.id = j.gang_id
"""
GANG_ATTEMPTS = """
SELECT g.id AS gang_id, a.gang_attempt AS attempt, g.size,
       array_agg(a.id ORDER BY a.id) AS assignment_ids,
       count(DISTINCT a.created_at)::int AS transactions, count(DISTINCT a.epoch)::int AS epochs,
       bool_and(a.state = 'finished' AND a.outcome IS NOT DISTINCT FROM 'succeeded') AS succeeded
  FROM assignments a JOIN jobs j ON j.id = a.job_id JOIN gangs g ON g.id = j.gang_id
 WHERE a.gang_attempt IS NOT NULL
 GROUP BY g.id, a.gang_attempt, g.size
 ORDER BY g.id, a.gang_attempt
"""
PARTIAL_GANGS = "SELECT count(*) FROM partial_gangs"
DEVICE_USE = """
SELECT (SELECT count(*) FROM assignment_units u JOIN workers w ON w.id = u.worker_id
         WHERE u.active AND u.resource = $1 AND w.state = 'alive') AS used,
       (SELECT coalesce(sum(jsonb_array_length(w.resources -> $1)), 0) FROM workers w
         WHERE w.state = 'alive' AND w.resources ? $1) AS offered,
       (SELECT count(*) FROM jobs j
         WHERE j.state = 'pending' AND j.resources ? $1
           AND (j.not_before IS NULL OR j.not_before <= now())) AS waiting
"""
STALE_WRITES = "SELECT count(*) FROM stale_writes"
ELECTIONS = "SELECT count(*) FROM lease_history"
LEAVES = "SELECT count(*) FROM worker_leaves"
REGISTERED_WORKERS = "SELECT id FROM workers UNION SELECT worker_id FROM worker_deaths"
UNFINISHED_JOBS = "SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
DEPENDENCY_CANCELS = """
SELECT c.id, c.dependency, s.state AS dependency_state
  FROM (SELECT id, split_part(detail, ' ', 3)::bigint AS dependency FROM jobs
         WHERE state = 'cancelled' AND detail ~ '^dependency_failed: job [0-9]+$') c
  LEFT JOIN LATERAL dependency_states(ARRAY[c.dependency]) s ON true
"""
"""Jobs cancelled for a dependency, with the state of that dependency as a dependency (an
array's id: the whole array's, ``dependency_states`` in schema.sql)."""
SCHEDULE_HISTORY = """
SELECT s.id AS schedule_id, s.name, s.cron, s.tz, extract(epoch FROM s.created_at)::float8 AS created_at,
       extract(epoch FROM s.slots_through)::float8 AS slots_through,
       extract(epoch FROM CASE WHEN s.paused
                               THEN coalesce((SELECT max(a.at) FROM audit_log a
                                               WHERE a.action = 'schedule_pause'
                                                 AND a.target_ids @> to_jsonb(ARRAY[s.id])),
                                             s.slots_through)
                               ELSE now() END)::float8 AS ended_at
  FROM schedules s
 WHERE NOT EXISTS (SELECT FROM audit_log a WHERE a.action = 'schedule_resume'
                                             AND a.target_ids @> to_jsonb(ARRAY[s.id]))
 ORDER BY s.id
"""
"""Every schedule never resumed (a resumed one's pause is a gap the checker does not judge),
with the end of its window: its pause, else now."""
SLOT_HISTORY = """
SELECT schedule_id, extract(epoch FROM slot_at)::float8 AS slot_at, outcome, reason, job_id
  FROM schedule_slots ORDER BY schedule_id, slot_at
"""


@contextlib.asynccontextmanager
async def _connection(database_url: str) -> AsyncIterator[PgConnection]:
    """A connection to the cluster's database, named ``stockade check``, closed at the end.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    conn = await PgConnection.connect(database_url, server_settings={"application_name": "stockade check"})
    try:
        yield conn
    finally:
        await conn.close()


async def wait_for_jobs(database_url: str, *, timeout_s: float, poll_s: float = 0.5) -> int:
    """Wait until every job has finished (succeeded, failed or cancelled), for at most
    ``timeout_s`` seconds, reading the count every ``poll_s``; returns how many are still
    unfinished (0: all finished). Needs the asyncio bridge open.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    async with _connection(database_url) as conn:
        deadline = trio.current_time() + timeout_s
        while True:
            unfinished = int(await conn.fetchval(UNFINISHED_JOBS))
            left_s = deadline - trio.current_time()
            if unfinished == 0 or left_s <= 0:
                return unfinished
            await trio.sleep(min(poll_s, left_s))


async def registered_workers(database_url: str) -> frozenset[str]:
    """The id of every worker that ever registered with the cluster of ``database_url`` (or was
    declared dead there), however it was started. Needs the asyncio bridge open.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    async with _connection(database_url) as conn:
        return frozenset(r["id"] for r in await conn.fetch(REGISTERED_WORKERS))


async def partial_gangs(database_url: str) -> int:
    """How many gangs hold resources partially now (the view ``partial_gangs``; docs/gangs.md).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    async with _connection(database_url) as conn:
        return int(await conn.fetchval(PARTIAL_GANGS))


async def device_use(database_url: str, resource: str = "gpu") -> tuple[int, int, int]:
    """Now, by database time: the units of ``resource`` that active assignments hold on alive
    workers, the units alive workers offer, and the pending jobs asking it whose backoff has
    passed (waiting for units, or for room beside them).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    async with _connection(database_url) as conn:
        row = await conn.fetchrow(DEVICE_USE, resource)
    assert row is not None
    return int(row["used"]), int(row["offered"]), int(row["waiting"])


async def load_history(database_url: str) -> History:
    """Read the history from the database (needs the asyncio bridge open).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    # One snapshot: else a job that succeeded between two reads looks succeeded with no success.
    async with _connection(database_url) as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        rows = await conn.fetch(ASSIGNMENT_HISTORY)
        deaths = await conn.fetch(DEATH_HISTORY)
        jobs = await conn.fetch(JOB_STATES)
        stale = int(await conn.fetchval(STALE_WRITES))
        elections = int(await conn.fetchval(ELECTIONS))
        leaves = int(await conn.fetchval(LEAVES))
        dependency_cancels = await conn.fetch(DEPENDENCY_CANCELS)
        schedules = await conn.fetch(SCHEDULE_HISTORY)
        slots = await conn.fetch(SLOT_HISTORY)
        gang_attempts = await conn.fetch(GANG_ATTEMPTS)
        partial = int(await conn.fetchval(PARTIAL_GANGS))
    return History(
        schedules=tuple(ScheduleRecord(**dict(r)) for r in schedules),
        schedule_slots=tuple(SlotRecord(**dict(r)) for r in slots),
        gang_attempts=tuple(
            GangAttemptRecord(**{**dict(r), "assignment_ids": tuple(r["assignment_ids"])})
            for r in gang_attempts
        ),
        partial_gangs=partial,
        assignments=tuple(
            AssignmentRecord(**{**dict(r), "units": tuple((n, u) for n, u in json.loads(r["units"] or "[]"))})
            for r in rows
        ),
        deaths=tuple(DeathRecord(**dict(r)) for r in deaths),
        job_states={r["id"]: r["state"] for r in jobs},
        job_attempts={r["id"]: (r["failures"], r["max_attempts"]) for r in jobs},
        policy_jobs=frozenset(r["id"] for r in jobs if r["fails_early"]),
        dependency_cancels={r["id"]: r["dependency"] for r in dependency_cancels},
        dependency_states={r["dependency"]: r["dependency_state"] for r in dependency_cancels},
        stale_writes_rejected=stale,
        elections=elections,
        leaves=leaves,
    )
