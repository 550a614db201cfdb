"""Ingest: the ControlPlane gRPC service that clients and workers call, on every replica.

Records what is not a decision, with or without a leader (unfenced writes): submissions,
cancellation requests, worker registrations, heartbeats (liveness, running confirmations,
finished outcomes) and this replica's presence. Answers job queries and the status view.
Every input is checked before anything is written (:mod:`actors.validation`).

Outcomes (succeeded, failed) come with heartbeats and with registrations; a registration's
are recorded for the worker's previous incarnation in the same transaction, before the new
incarnation exists, so the leader's sweep of that incarnation finds those assignments already
finished. An outcome ends its assignment when that is still active; one that arrives after the
leader ended the assignment as lost (worker declared dead or registered again) is still kept
on that assignment, and ends its job if the job is still pending (not placed again), so a job
that ran to completion does not run again (see :data:`actors.queries.RECORD_OUTCOMES`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import attrs
import trio

from actors import queries, validation
from protocol import pb
from runtime import log
from runtime.aio import PgConnection, PgPool, serve_grpc, trio_service
from runtime.errors import DatabaseUnavailable, NotFound

SESSION_SETTINGS = {
    "statement_timeout": "5000",
    # A replica frozen in the middle of a heartbeat must not keep that worker's row locked:
    # its session ends after 0.5 s idle in the transaction, and others wait for a lock 0.3 s
    # at most (the worker then tries the next replica).
    "idle_in_transaction_session_timeout": "500",
    "lock_timeout": "300",
}
"""Session settings of ingest's connections."""


def job_info(row: Any) -> pb.JobInfo:
    """A ``JobInfo`` from a row of :data:`actors.queries.GET_JOB`."""
    spec = pb.JobSpec(
        name=row["name"], cpu_millis=row["cpu_millis"], memory_mb=row["memory_mb"], priority=row["priority"]
    )
    if row["runtime"] == "command":
        spec.command = pb.CommandRuntime(argv=list(row["argv"] or []))
    else:
        spec.sleep = pb.SleepRuntime(duration_ms=row["sleep_ms"] or 0)
    info = pb.JobInfo(
        job_id=row["id"],
        spec=spec,
        state=row["state"],
        reason=row["reason"],
        worker_id=row["worker_id"] or "",
        assignment_id=row["assignment_id"] or 0,
        epoch=row["epoch"] or 0,
        has_exit_code=row["exit_code"] is not None,
        exit_code=row["exit_code"] or 0,
        submitted_unix_s=row["submitted_unix_s"] or 0.0,
        started_unix_s=row["started_unix_s"] or 0.0,
        finished_unix_s=row["finished_unix_s"] or 0.0,
        stdout_path=row["stdout_path"] or "",
        stderr_path=row["stderr_path"] or "",
        attempts=row["attempts"],
    )
    if row["cancel_requested"] and row["state"] in ("assigned", "running"):
        info.reason = "cancelling"
    elif row["detail"] and not info.reason:
        info.reason = row["detail"]
    return info


async def _record_outcomes(conn: PgConnection, worker_id: str, finished: list[pb.JobOutcome]) -> None:
    """Record a worker's reported outcomes (inside the caller's transaction)."""
    args = (
        worker_id,
        [o.assignment_id for o in finished],
        [o.state for o in finished],
        [o.exit_code if o.has_exit_code else None for o in finished],
        [o.started_unix_s or None for o in finished],
        [o.finished_unix_s or None for o in finished],
        [o.stdout_path or None for o in finished],
        [o.stderr_path or None for o in finished],
        [o.detail for o in finished],
    )
    if await conn.fetchval(queries.RECORD_OUTCOMES, *args):
        await conn.execute(queries.END_JOBS_OF_LATE_OUTCOMES, *args)


def _job_fields(spec: pb.JobSpec) -> dict[str, object]:
    """A JobSpec as the keyword arguments of :func:`actors.validation.check_job`."""
    return {
        "name": spec.name,
        "cpu_millis": spec.cpu_millis,
        "memory_mb": spec.memory_mb,
        "priority": spec.priority,
        "sleep_ms": spec.sleep.duration_ms if spec.sleep is not None else None,
        "argv": list(spec.command.argv) if spec.command is not None else None,
    }


@attrs.define
class ControlPlaneService:
    """The RPC handlers (trio coroutines), served through :func:`runtime.aio.trio_service`."""

    cp_id: str
    pool: PgPool
    dead_after_s: float = 5.0
    """Told to workers at registration, so they fence themselves in time."""

    async def submit_job(self, request: pb.SubmitJobRequest) -> pb.SubmitJobReply:
        job = validation.check_job(**_job_fields(request.spec or pb.JobSpec()))  # type: ignore[arg-type]
        async with self.pool.acquire() as conn:
            job_id = await conn.fetchval(
                queries.SUBMIT_JOB,
                job.name,
                job.cpu_millis,
                job.memory_mb,
                job.priority,
                job.runtime,
                job.sleep_ms,
                None if job.argv is None else list(job.argv),
            )
        return pb.SubmitJobReply(job_id=job_id)

    async def submit_jobs(self, request: pb.SubmitJobsRequest) -> pb.SubmitJobsReply:
        jobs = validation.check_jobs([_job_fields(spec) for spec in request.specs])
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                queries.SUBMIT_JOBS,
                [j.name for j in jobs],
                [j.cpu_millis for j in jobs],
                [j.memory_mb for j in jobs],
                [j.priority for j in jobs],
                [j.runtime for j in jobs],
                [j.sleep_ms for j in jobs],
                [None if j.argv is None else json.dumps(list(j.argv)) for j in jobs],
            )
        return pb.SubmitJobsReply(job_ids=sorted(int(r["id"]) for r in rows))

    async def get_job(self, request: pb.GetJobRequest) -> pb.JobInfo:
        validation.check_job_id(request.job_id)
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(queries.GET_JOB, request.job_id)
        if row is None:
            raise NotFound(f"job_id {request.job_id} not found")
        return job_info(row)

    async def list_jobs(self, request: pb.ListJobsRequest) -> pb.ListJobsReply:
        state, limit = validation.check_list(request.state, request.limit)
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(queries.LIST_JOBS, state, limit)
        return pb.ListJobsReply(jobs=[job_info(r) for r in rows])

    async def cancel_job(self, request: pb.CancelJobRequest) -> pb.CancelJobReply:
        validation.check_job_id(request.job_id)
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(queries.CANCEL_JOB, request.job_id)
        if row is None:
            raise NotFound(f"job_id {request.job_id} not found")
        state = "cancelling" if row["cancel_requested"] else row["state"]
        return pb.CancelJobReply(state=state)

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        labels = dict(request.labels)
        validation.check_registration(
            worker_id=request.worker_id,
            address=request.address,
            cpu_millis=request.cpu_millis,
            memory_mb=request.memory_mb,
            labels=labels,
        )
        finished = list(request.finished)
        async with self.pool.acquire() as conn, conn.transaction():
            if finished:
                # The worker's row first, as a heartbeat takes it (one lock order), then the
                # outcomes, for the incarnation that is still current: before the new one
                # exists, so the sweep of the old one finds these assignments finished.
                await conn.fetchval(queries.LOCK_WORKER, request.worker_id)
                await _record_outcomes(conn, request.worker_id, finished)
            incarnation = await conn.fetchval(
                queries.REGISTER_WORKER,
                request.worker_id,
                request.address,
                request.cpu_millis,
                request.memory_mb,
                json.dumps(labels),
            )
            epoch = await conn.fetchval(queries.CURRENT_EPOCH)
        log.get("ingest").info(
            "worker registered",
            worker_id=request.worker_id,
            incarnation=incarnation,
            address=request.address,
            outcomes=len(finished),
        )
        return pb.RegisterWorkerReply(
            incarnation=incarnation, epoch=epoch, dead_after_ms=int(self.dead_after_s * 1000)
        )

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        worker_id = validation.check_worker_id(request.worker_id)
        validation.check_incarnation(request.incarnation)
        finished = list(request.finished)
        running = list(request.running_assignment_ids)
        async with self.pool.acquire() as conn, conn.transaction():
            if not finished:
                # Liveness only: losing it in a database crash makes the worker look a little
                # older, and a lost running-confirmation is re-sent (workers deduplicate), so
                # skip the WAL flush. Outcomes end assignments and are committed durably.
                await conn.execute(queries.ASYNC_COMMIT)
            alive = await conn.fetchval(queries.RECORD_HEARTBEAT, worker_id, request.incarnation)
            epoch = await conn.fetchval(queries.CURRENT_EPOCH)
            if finished:
                await _record_outcomes(conn, worker_id, finished)
            if alive is None:
                return pb.HeartbeatReply(epoch=epoch, reregister=True)
            stop: list[int] = []
            if running:
                await conn.execute(queries.CONFIRM_RUNNING, worker_id, running)
                stop = [r["id"] for r in await conn.fetch(queries.ENDED_AMONG, worker_id, running)]
        return pb.HeartbeatReply(epoch=epoch, stop_assignment_ids=stop)

    async def status(self, request: pb.StatusRequest) -> pb.StatusReply:
        async with self.pool.acquire() as conn:
            lease = await conn.fetchrow(queries.READ_LEASE)
            cps = await conn.fetch(queries.STATUS_CONTROL_PLANES)
            workers = await conn.fetch(queries.STATUS_WORKERS)
            counts = await conn.fetch(queries.STATUS_JOB_COUNTS)
            stuck = await conn.fetch(queries.STATUS_UNSCHEDULABLE)
        assert lease is not None
        leader = lease["holder"] if lease["live"] and lease["holder"] else ""
        by_state = {r["state"]: r["count"] for r in counts}
        return pb.StatusReply(
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
            workers=[
                pb.WorkerInfo(
                    id=r["id"],
                    address=r["address"],
                    state=r["state"],
                    cpu_millis=r["cpu_millis"],
                    memory_mb=r["memory_mb"],
                    cpu_allocated_millis=r["cpu_allocated_millis"],
                    memory_allocated_mb=r["memory_allocated_mb"],
                    job_ids=list(r["job_ids"]),
                    incarnation=r["incarnation"],
                    last_heartbeat_age_s=r["heartbeat_age_s"],
                )
                for r in workers
            ],
            jobs=[pb.JobCount(state=s, count=by_state.get(s, 0)) for s in validation.JOB_STATES],
            unschedulable=[job_info(r) for r in stuck],
            answered_by=self.cp_id,
        )


@attrs.define
class Ingest:
    """The actor: serves :class:`ControlPlaneService` and records this replica's presence."""

    cp_id: str
    database_url: str
    listen_host: str
    listen_port: int
    pool_size: int
    presence_interval_s: float
    dead_after_s: float = 5.0
    """The reconciler's dead_after, told to workers at registration."""
    advertise_address: str = ""
    address: str = ""
    """host:port others reach this replica at; set once serving."""
    _log: Any = attrs.field(factory=lambda: log.get("ingest"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled."""
        pool = await PgPool.create(
            self.database_url,
            size=self.pool_size,
            server_settings={"application_name": f"stockade {self.cp_id} ingest", **SESSION_SETTINGS},
        )
        try:
            service = trio_service(
                pb.ControlPlaneBase,
                ControlPlaneService(cp_id=self.cp_id, pool=pool, dead_after_s=self.dead_after_s),
            )
            async with trio.open_nursery() as nursery:
                port = await nursery.start(serve_grpc, [service], self.listen_host, self.listen_port)
                self.address = self.advertise_address or f"{self.listen_host}:{port}"
                await self._record_presence(pool)
                nursery.start_soon(self._presence, pool)
                self._log.info("serving", address=self.address)
                task_status.started()
        finally:
            await pool.close()

    async def _record_presence(self, pool: PgPool) -> None:
        async with pool.acquire() as conn:
            await conn.execute(queries.RECORD_PRESENCE, self.cp_id, self.address, os.getpid())

    async def _presence(self, pool: PgPool) -> None:
        while True:
            await trio.sleep(self.presence_interval_s)
            try:
                await self._record_presence(pool)
            except DatabaseUnavailable as exc:
                self._log.warning("presence not recorded", error=str(exc))


SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema.sql"


async def apply_schema(database_url: str) -> None:
    """Apply ``schema.sql`` (idempotent), serialised across replicas by an advisory lock, and
    only when the database does not hold this very schema yet (its sha256 is recorded).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
        FileNotFoundError: schema.sql is missing next to the packages.
    """
    sql = SCHEMA_PATH.read_text()
    digest = hashlib.sha256(sql.encode()).hexdigest()
    conn = await PgConnection.connect(database_url, server_settings={"application_name": "stockade schema"})
    try:
        await conn.fetchval(queries.APPLY_SCHEMA_LOCK, queries.SCHEMA_LOCK_KEY)
        try:
            await conn.execute(queries.SCHEMA_VERSION_TABLE)
            if await conn.fetchval(queries.SCHEMA_VERSION) != digest:
                await conn.execute(sql)
                await conn.execute(queries.RECORD_SCHEMA_VERSION, digest)
        finally:
            await conn.fetchval(queries.APPLY_SCHEMA_UNLOCK, queries.SCHEMA_LOCK_KEY)
    finally:
        await conn.close()
