"""What a reconcile pass reads, and the store that reads it (:mod:`actors.reconciler`).

:class:`ReconcilerStore` is what a pass needs; :class:`PgReconcilerStore` reads it on a
connection of its own with the reconciler's statements (:mod:`actors.queries.reconciler`),
and a unit test passes a stand-in.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import attrs

from actors import queries
from actors.dependencies import WaitingJob
from actors.health import JOB_FAULTS, Run, WorkerRuns
from actors.heartbeat_policy import HeartbeatPolicy
from actors.messages import CommittedAssignment, WorkerRef
from actors.rows import ints, parallel
from runtime.aio import ReadStore


@attrs.frozen(kw_only=True)
class HeartbeatAge:
    """An alive worker incarnation and the age of its last recorded heartbeat (database time)."""

    worker_id: str
    incarnation: int
    age_s: float
    dead_after_s: float | None = None
    """The dead_after this worker is judged by as its row records it (docs/design.md, "Heartbeat
    interval"); None: the reconciler's own ``dead_after_s`` judges it."""


@attrs.frozen(kw_only=True)
class PolicyInputs:
    """What the leader's choice of the heartbeat interval reads (:mod:`actors.heartbeat_policy`)."""

    current: HeartbeatPolicy | None
    """The policy in force; None: none chosen yet."""
    costs_us: tuple[float, ...]
    """What one heartbeat costs each control plane seen lately (CPU µs), those that measured it."""
    waits_ms: tuple[float, ...] = ()
    """Each control plane's 99th percentile of its heartbeats' reported waits (ms), if enough."""
    replicas: int = 0
    """The control planes seen lately, whether or not they measured a cost."""


@attrs.frozen(kw_only=True)
class SilenceReading:
    """One read of the workers' silence: the database's time and every judged worker's age."""

    now_unix_s: float
    """The database's ``now()``, unix seconds."""
    ages: list[HeartbeatAge]
    """Each age counts from the last recorded heartbeat or, when later, the server's start."""


@attrs.frozen(kw_only=True)
class Delivery:
    """An active assignment, where it goes, and how long ago it was committed."""

    assignment: CommittedAssignment
    worker: WorkerRef
    age_s: float


class ReconcilerStore(Protocol):
    """What a pass reads."""

    async def heartbeat_ages(self) -> SilenceReading: ...

    async def unconfirmed(self) -> list[Delivery]: ...

    async def cancel_requested(self) -> list[Delivery]: ...

    async def overdue(self, margin_s: float) -> list[Delivery]:
        """Active assignments whose job ran past its timeout by ``margin_s`` (or a tenth of it)."""

    async def waiting_jobs(self, limit: int) -> list[WaitingJob]:
        """At most ``limit`` waiting jobs the leader can settle now (``queries.WAITING_JOBS``)."""

    async def drain_due(self) -> list[Delivery]:
        """Active assignments of workers whose drain deadline has passed (not those whose
        cancel a user asked: :meth:`cancel_requested` has them)."""

    async def preempt_due(self) -> list[Delivery]:
        """Active assignments marked to be preempted (not those whose cancel a user asked)."""

    async def heartbeat_policy_inputs(self, seen_within_s: float) -> PolicyInputs:
        """The heartbeat policy in force and the heartbeat costs of the control planes seen in
        the last ``seen_within_s`` seconds (database time)."""

    async def worker_runs(self, most: int, window_s: float) -> list[WorkerRuns]:
        """Every alive worker, its health, and its judged runs (:mod:`actors.health`): at most
        ``most`` per worker, newest first, ended within ``window_s`` seconds (database time)."""

    async def close(self) -> None:
        """Close the store's connection (a later read opens another)."""


def held_units(text: str | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """An assignment's device units from schema.sql's held_units (JSON [[name, unit], ...]
    sorted; None: none) as (name, unit ids) pairs."""
    held: dict[str, list[str]] = {}
    for name, unit in json.loads(text) if text else ():
        held.setdefault(name, []).append(unit)
    return tuple((name, tuple(units)) for name, units in sorted(held.items()))


def _delivery(row: Any) -> Delivery:
    return Delivery(
        assignment=CommittedAssignment(
            assignment_id=int(row["assignment_id"]),
            job_id=int(row["job_id"]),
            worker_id=row["worker_id"],
            incarnation=int(row["incarnation"]),
            epoch=int(row["epoch"]),
            spec=queries.job_spec_of(row),
            array_index=row["array_index"],
            array_id=row["array_id"],
            placed_before=bool(row["placed_before"]),
            units=held_units(row.get("units")),
            gang=queries.gang_seat_of(row),
        ),
        worker=WorkerRef(
            worker_id=row["worker_id"], address=row["address"], incarnation=int(row["incarnation"])
        ),
        age_s=float(row["age_s"]),
    )


_RUN_COLUMNS = (
    "job_ids",
    "failed",
    "details",
    "after_mark",
    "ages_s",
    "array_ids",
    "spec_keys",
    "failed_elsewhere",
    "succeeded_elsewhere",
)
"""queries.WORKER_RUNS' parallel arrays of a worker's judged runs."""


def worker_runs(row: Any) -> WorkerRuns:
    """A :class:`WorkerRuns` from a row of :data:`actors.queries.WORKER_RUNS`."""
    return WorkerRuns(
        worker_id=row["id"],
        version=int(row["health_version"]),
        unhealthy=bool(row["unhealthy"]),
        takes_placements=bool(row["takes_placements"]),
        runs=tuple(
            Run(
                job_id=int(job_id),
                failed=bool(failed),
                detail=detail,
                after_mark=bool(after),
                age_s=float(age_s),
                array_id=None if array_id is None else int(array_id),
                spec_key=spec_key,
                failed_elsewhere=bool(failed_x),
                succeeded_elsewhere=bool(succeeded_x),
            )
            for job_id, failed, detail, after, age_s, array_id, spec_key, failed_x, succeeded_x in parallel(
                row, _RUN_COLUMNS
            )
        ),
    )


def waiting_job(row: Any) -> WaitingJob:
    """A :class:`WaitingJob` from a row of :data:`actors.queries.WAITING_JOBS`."""
    return WaitingJob(
        job_id=int(row["id"]),
        after=tuple(zip((int(i) for i in row["after_ids"]), row["after_states"], strict=True)),
        array_id=None if row["array_id"] is None else int(row["array_id"]),
        **ints(row, "array_index", "array_max_running", "array_active"),
    )


@attrs.define
class PgReconcilerStore(ReadStore):
    """:class:`ReconcilerStore` on a read connection of its own (``statement_timeout_s``: the
    reconciler settings' ``read_statement_timeout_s``)."""

    async def heartbeat_ages(self) -> SilenceReading:
        rows = await (await self._connection()).fetch(queries.HEARTBEAT_AGES)
        return SilenceReading(
            now_unix_s=float(rows[0]["now_unix_s"]),
            ages=[
                HeartbeatAge(
                    worker_id=r["id"],
                    incarnation=int(r["incarnation"]),
                    age_s=float(r["age_s"]),
                    dead_after_s=None if r["dead_after_ms"] is None else r["dead_after_ms"] / 1000,
                )
                for r in rows
                if r["id"] is not None
            ],
        )

    async def heartbeat_policy_inputs(self, seen_within_s: float) -> PolicyInputs:
        row = await (await self._connection()).fetchrow(queries.HEARTBEAT_POLICY_INPUTS, seen_within_s)
        assert row is not None
        fields = ("interval_ms", "dead_after_ms", "workers", "cpu_per_heartbeat_us", "reason")
        current = None if row["interval_ms"] is None else HeartbeatPolicy(**{f: row[f] for f in fields})
        return PolicyInputs(
            current=current,
            costs_us=tuple(float(c) for c in row["costs_us"]),
            waits_ms=tuple(float(w) for w in row["waits_ms"]),
            replicas=int(row["replicas"]),
        )

    async def _deliveries(self, sql: str, *args: Any) -> list[Delivery]:
        return [_delivery(r) for r in await (await self._connection()).fetch(sql, *args)]

    async def unconfirmed(self) -> list[Delivery]:
        return await self._deliveries(queries.UNCONFIRMED_ASSIGNMENTS)

    async def cancel_requested(self) -> list[Delivery]:
        return await self._deliveries(queries.CANCEL_REQUESTED_ASSIGNMENTS)

    async def overdue(self, margin_s: float) -> list[Delivery]:
        return await self._deliveries(queries.OVERDUE_ASSIGNMENTS, margin_s)

    async def waiting_jobs(self, limit: int) -> list[WaitingJob]:
        rows = await (await self._connection()).fetch(queries.WAITING_JOBS, limit)
        return [waiting_job(r) for r in rows]

    async def drain_due(self) -> list[Delivery]:
        return await self._deliveries(queries.DRAIN_DUE_ASSIGNMENTS)

    async def preempt_due(self) -> list[Delivery]:
        return await self._deliveries(queries.PREEMPT_DUE_ASSIGNMENTS)

    async def worker_runs(self, most: int, window_s: float) -> list[WorkerRuns]:
        rows = await (await self._connection()).fetch(queries.WORKER_RUNS, most, window_s, list(JOB_FAULTS))
        return [worker_runs(r) for r in rows]
