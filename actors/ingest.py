"""Ingest: the ControlPlane gRPC service that clients and workers call, on every replica.

Records what is not a decision, with or without a leader (unfenced writes): submissions,
cancellation requests, worker registrations, heartbeats (liveness, running confirmations,
finished outcomes), clean stops (a worker's row becomes ``left``; the leader requeues its jobs),
cordons and drains (the placer skips a cordoned worker; the leader stops and requeues what a
drain's deadline leaves) and this replica's presence. Answers job queries and the status view.
Every input is checked before anything is written (:mod:`runtime.validation`, :mod:`actors.validation`).

Every mutating call is carried out at most once per idempotency key (:mod:`actors.idempotency`):
submissions and cancels through :meth:`ControlPlaneService._once`, which stores the key and
the answer in the statement of the effect (:func:`actors.queries.once`); registrations by
their agent run id and number, kept in the worker's row. A new mutating RPC gets the same in
two steps (see :mod:`actors.idempotency`).

Outcomes (succeeded, failed) come with heartbeats and with registrations; a registration's
are recorded for the worker's previous incarnation in the same transaction, before the new
incarnation exists, so the leader's sweep of that incarnation finds those assignments already
finished. An outcome ends its assignment when that is still active; one that arrives after the
leader ended the assignment as lost (worker declared dead or registered again) is still kept
on that assignment, and ends its job if the job is still pending (not placed again), so a job
that ran to completion does not run again (see :data:`actors.queries.RECORD_OUTCOMES`).

Under overload (DESIGN.md, "Under overload"), slowness here must not turn into more work:

- Every request is admitted (:meth:`actors.ingest_gate.AdmittedService.admitted`) before any of its work is
  done. A request whose client's deadline has passed is not started (DEADLINE_EXCEEDED:
  nobody reads its answer). Heartbeats and registrations take a connection ahead of
  everything else, from capacity the other RPCs cannot use. Other RPCs hold a turn, of
  ``max_requests_in_progress``, from admission until their reply is encoded: they build and
  encode their replies themselves, in slices that yield to the loop, and hand gRPC the bytes;
  SubmitJobs decodes and checks its batch the same way, inside its turn. They are refused with
  RESOURCE_EXHAUSTED ("busy, try another replica") while the ingest loop lags, when too many
  of them wait for a turn, or when one has waited ``max_admission_wait_s`` for it
  (:mod:`actors.admission` argues the rules). Nothing a refused request asked for was stored.
- Once started, a request's database work runs to its end even when its client gives up
  meanwhile (:func:`runtime.aio.finish_despite_cancel`): cancelling it inside asyncpg would
  terminate the pooled connection, and the replica would open a new one, a new server
  process, exactly when the machine has no CPU to spare. Its server-side timeouts
  (:data:`actors.ingest_gate.SESSION_SETTINGS`) bound it; the late answer is dropped. A
  submission whose client gave up may thus still be stored, with its idempotency key: the
  client's retry gets its answer; a busy answer never stores anything.
- Heartbeats are recorded in groups: the liveness-only heartbeats that arrive within
  ``heartbeat_group_wait_s`` (a few ms) are recorded in one statement (``record_heartbeats`` in
  schema.sql; :mod:`actors.heartbeat_group`), one connection and one round trip for the group,
  each worker getting its own answer. One that carries outcomes, asks for a restart hold, or
  finds its worker's row held by another transaction is one statement of its own
  (``record_heartbeat``). Either way no worker's row lock is held across a round trip.
- Registrations and clean stops are transaction functions
  (:meth:`runtime.aio.PgConnection.run_in_transaction`), run again from their start when a
  schema change invalidated a cached statement. The pool waits for an unreachable database at
  start and backs off from it later, logging the outage once per change
  (:func:`actors.ingest_gate.open_pool`).
- The ingest runs its own loop-lag monitor (``loop="ingest"``), and shares nothing with the
  other actors, so it can be hosted on a trio loop of its own.

Modules: this one holds the handlers, the actor and every statement ingest runs that writes
(DESIGN.md: unfenced writes live here and nowhere else), which is why it stays a little over
500 lines; :mod:`actors.ingest_gate` holds the admission plumbing the handlers are built on,
and :mod:`actors.ingest_replies` the pure row and reply shapes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import ssl
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from actors import dependencies, idempotency, queries, validation
from actors.heartbeat_group import GroupAnswer, GroupedBeat, GroupMember, HeartbeatGrouper
from actors.heartbeat_policy import (
    MAX_DEAD_AFTER_MS,
    MAX_SENT_US,
    HeartbeatCost,
    HeartbeatPolicy,
    HeartbeatWaits,
    default_policy,
)
from actors.ingest_gate import SESSION_SETTINGS, AdmittedService, open_pool, run_in_slices
from actors.ingest_replies import (
    array_counts,
    attempt_info,
    check_outcomes,
    job_events_reply,
    job_info,
    leave_verdict,
    outcome_arrays,
    outcome_log_keys,
    status_reply,
    worker_schedule_reply,
)
from actors.logs import LogRelay, check_read_job_logs, log_source
from protocol import pb, wire
from protocol.wire import Encoded
from runtime import faults, identifiers, log, metrics
from runtime.aio import (
    PgConnection,
    Send,
    require_worker,
    rpc_caller,
    rpc_deadline,
    serve_grpc,
    takes_encoded_request,
    trio_service,
)
from runtime.errors import (
    Busy,
    DatabaseBusy,
    DatabaseUnavailable,
    DeadlineExceeded,
    DuplicateKey,
    IdempotencyConflict,
    InvalidArgument,
    NotFound,
)
from runtime.lag import LoopLag
from runtime.settings.control_plane import IngestSettings
from runtime.settings.leader import ReconcilerSettings
from runtime.tls import OPERATOR, VIEWER, WORKER, ClientTls
from runtime.validation import (
    check_drain_deadline_ms,
    check_idempotency_key,
    check_job_id,
    check_jobs_steps,
    check_list,
    check_worker_id,
)
from runtime.wire_jobs import job_spec_from_pb

__all__ = ["SESSION_SETTINGS", "ControlPlaneService", "Ingest", "apply_schema"]


@attrs.frozen(kw_only=True)
class Once:
    """What a mutating call's statement gave (:meth:`ControlPlaneService._once`)."""

    answer: list[dict[str, Any]]
    """The rows its effect returned, the first time (JSON objects, by column name)."""
    replayed: bool
    """True when the call had been carried out already and this is the stored answer."""


@attrs.define
class ControlPlaneService(AdmittedService):
    """The RPC handlers (trio coroutines), served through :func:`runtime.aio.trio_service`;
    admission as :class:`actors.ingest_gate.AdmittedService` says.

    Args:
        cp_id: this replica's id, named in busy answers.
        pool: the ingest's connections (``settings.pool_size`` of them).
        settings: capacity and shedding limits.
        lag: the ingest loop's lag monitor (its :attr:`~runtime.lag.LoopLag.recent_max_s`).
        told_default: the heartbeat interval and the dead_after told to workers while the
            leader chose none (docs/design.md, "Heartbeat interval").
    """

    told_default: HeartbeatPolicy = attrs.field(factory=lambda: default_policy(ReconcilerSettings()))
    heartbeats_recorded: int = 0
    """Heartbeats this service recorded (the denominator of its measured heartbeat cost)."""
    heartbeat_waits: HeartbeatWaits = attrs.field(factory=HeartbeatWaits)
    """The waits its heartbeats reported (their 99th percentile goes with its presence)."""
    logs: LogRelay | None = None
    """Relays job output from workers (ReadJobLogs); None: one of its own, plaintext."""
    heartbeat_group: HeartbeatGrouper | None = None
    """Records liveness-only heartbeats in groups (started by :class:`Ingest` when
    ``settings.heartbeat_group_wait_s`` > 0); None: each heartbeat in a statement of its own."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.logs is None:
            self.logs = LogRelay(cp_id=self.cp_id, settings=self.settings)

    async def read_job_logs(self, request: pb.ReadJobLogsRequest, send: Send) -> None:
        """Stream a job's output from the worker that keeps it (:mod:`actors.logs`): the job
        is looked up (admitted as any read), then its worker's chunks are relayed as they come,
        holding no database connection.

        Raises:
            NotFound: no such job. InvalidArgument: a bad request, or a sleep job.
            FailedPrecondition: the job has not started, or its worker no longer keeps its output.
            Unavailable: its worker is dead, left or unreachable (named, with its address).
            Busy: this replica relays ``max_log_streams`` streams already.
        """
        checked = check_read_job_logs(request)
        assert self.logs is not None
        self.logs.admit()
        async with self.database("read_job_logs") as conn:
            row = await conn.fetchrow(queries.LOG_SOURCE, checked.job_id, checked.assignment_id)
        source = log_source(checked.job_id, row, checked.assignment_id)
        await self.logs.relay(source, checked, send)

    async def _once(
        self,
        conn: PgConnection,
        rpc: str,
        sql: str,
        *args: Any,
        key: str,
        digest: bytes,
        lock_worker: str | None = None,
    ) -> Once:
        """Carry out a mutating call's statement (made by :func:`actors.queries.once`) once per
        idempotency ``key``: the effect, or, for a copy of a call already carried out, the
        stored answer and no effect (:mod:`actors.idempotency`).

        Args:
            conn: the request's connection.
            rpc: the call, e.g. ``"submit_job"``.
            sql: its statement; ``args`` its effect's parameters.
            key: the request's idempotency key (checked).
            digest: the checked request's sha256 (:func:`actors.idempotency.request_digest`).
            lock_worker: a promise about this worker's future (a cordon or drain): its row is
                locked first (``queries.LOCK_WORKER``) and the statement runs after it in the
                same transaction, so it answers with every assignment a placement in progress
                commits, and no placement commits onto the worker after it.

        Raises:
            IdempotencyConflict: ``key`` was first used for another request; nothing was stored.
            Busy: the database gave up on the statement (another copy of the call, still in
                progress, held the key past the session's ``lock_timeout``, or the statement
                timed out); nothing was stored.
            DatabaseUnavailable: the database failed.
        """

        async def promise(conn: PgConnection) -> Any:
            await conn.fetchval(queries.LOCK_WORKER, lock_worker)
            row = await conn.fetchrow(sql, *args, key, digest)
            await faults.hit("ingest.promise_before_commit")
            return row

        for attempt in (1, 2):
            try:
                if lock_worker is None:
                    row = await conn.fetchrow(sql, *args, key, digest)
                else:
                    row = await conn.run_in_transaction(promise, what=rpc)
            except DuplicateKey as exc:
                # Another copy stored the key after this statement's snapshot: this one rolled
                # back whole; run it again, to find the stored answer.
                if exc.constraint != queries.IDEMPOTENCY_KEY_CONSTRAINT or attempt == 2:
                    raise
                continue
            except DatabaseBusy as exc:
                raise Busy(
                    f"busy: {self.cp_id} could not carry out {rpc} now ({exc}); another copy of this "
                    "call may still be in progress; nothing was stored, try again"
                ) from exc
            break
        assert row is not None
        answer: list[dict[str, Any]] = json.loads(row["answer"])
        if row["replayed"]:
            if row["rpc"] != rpc or bytes(row["request_sha256"]) != digest:
                raise IdempotencyConflict(
                    idempotency.conflict_message(key=key, rpc=rpc, first_rpc=row["rpc"], answer=answer)
                )
            metrics.INGEST_REPLAYED_REQUESTS.labels(rpc).inc()
            return Once(answer=answer, replayed=True)
        await faults.hit("ingest.after_commit")
        return Once(answer=answer, replayed=False)

    async def submit_job(self, request: pb.SubmitJobRequest) -> pb.SubmitJobReply:
        job = job_spec_from_pb(request.spec).check()
        key = check_idempotency_key(request.idempotency_key)
        digest = idempotency.request_digest("submit_job", [idempotency.job_item(job)])
        async with self.admitted("submit_job"):
            await self._refuse_when_queue_full("submit_job")
            async with self.connection("submit_job") as conn:
                done = await self._once(
                    conn,
                    "submit_job",
                    queries.SUBMIT_JOB,
                    *attrs.astuple(queries.job_columns(job)),
                    key=key,
                    digest=digest,
                )
                if not done.answer:
                    # Nothing stored: a dependency does not exist (see queries.SUBMIT_JOB).
                    raise await self._missing_dependencies(conn, "after", job.after)
            if not done.replayed:
                # An array counts as its tasks against the queue's limit.
                self.pending_jobs += int(done.answer[0].get("tasks", 1))
        job_id = int(done.answer[0]["id"])
        if not done.replayed:
            log.get("ingest").info("job submitted", job_id=job_id, name=job.name)
        return pb.SubmitJobReply(job_id=job_id)

    async def _missing_dependencies(
        self, conn: PgConnection, field: str, after: tuple[int, ...]
    ) -> InvalidArgument:
        """The error of a submission that stored nothing because of ``after``: it names the
        jobs that do not exist (read after the submitting statement, which checked them in its
        own snapshot)."""
        missing = [int(i) for i in await conn.fetchval(queries.MISSING_JOBS, list(after))]
        return InvalidArgument(
            field, list(after), dependencies.MISSING_RULE, detail=dependencies.missing_detail(missing)
        )

    @takes_encoded_request
    async def submit_jobs(
        self, request: pb.SubmitJobsRequest | Encoded[pb.SubmitJobsRequest]
    ) -> pb.SubmitJobsReply:
        """Store a batch. Served with its request undecoded: it is decoded and checked in
        slices, inside the turn, so a refused batch costs no decoding."""
        async with self.admitted("submit_jobs"):
            await self._refuse_when_queue_full("submit_jobs")
            step = self.settings.wire_step_messages
            batch = request
            if isinstance(request, Encoded):
                try:
                    batch = await run_in_slices(
                        wire.decode_steps(pb.SubmitJobsRequest, request.data, step_messages=step),
                        self.wire_share,
                    )
                except wire.OutOfRange as exc:
                    raise InvalidArgument(exc.field, exc.value, exc.rule, detail=exc.detail) from None
                except ValueError as exc:
                    raise InvalidArgument(
                        "request", f"{len(request.data)} bytes", f"must be a SubmitJobsRequest ({exc})"
                    ) from None
            assert isinstance(batch, pb.SubmitJobsRequest)
            jobs = await run_in_slices(
                check_jobs_steps(batch.specs, spec_of=job_spec_from_pb, step_jobs=step),
                self.wire_share,
            )
            key = check_idempotency_key(batch.idempotency_key)
            digest = await run_in_slices(
                idempotency.digest_steps(
                    "submit_jobs", (idempotency.job_item(j) for j in jobs), step_items=step
                ),
                self.wire_share,
            )
            async with self.connection("submit_jobs") as conn:
                done = await self._once(
                    conn,
                    "submit_jobs",
                    queries.SUBMIT_JOBS,
                    *queries.job_column_arrays(jobs),
                    key=key,
                    digest=digest,
                )
                if not done.answer:
                    # Nothing stored: a job names a dependency that does not exist.
                    named = sorted({i for j in jobs for i in j.after})
                    missing = {int(i) for i in await conn.fetchval(queries.MISSING_JOBS, named)}
                    index = next((n for n, j in enumerate(jobs) if missing & set(j.after)), 0)
                    raise await self._missing_dependencies(conn, f"specs[{index}].after", jobs[index].after)
            if not done.replayed:
                self.pending_jobs += len(done.answer)
        job_ids = sorted(int(r["id"]) for r in done.answer)
        if not done.replayed:
            # One line per batch, listing its ids (a 10,000-job batch: one line, not 10,000).
            log.get("ingest").info("jobs submitted", count=len(job_ids), job_ids=job_ids)
        return pb.SubmitJobsReply(job_ids=job_ids)

    async def sweep_idempotency_keys(self) -> int:
        """Delete the idempotency keys stored more than ``settings.idempotency_key_retention_s``
        ago, oldest first, ``settings.idempotency_sweep_rows`` per statement, each statement
        admitted as any other request (shed first when the replica is busy); returns how many.

        Raises:
            Busy, DeadlineExceeded: the replica is busy; the rest waits for the next sweep.
            DatabaseUnavailable: the database failed.
        """
        swept = 0
        while True:
            async with self.database("sweep_idempotency_keys") as conn:
                count = int(
                    await conn.fetchval(
                        queries.SWEEP_IDEMPOTENCY_KEYS,
                        self.settings.idempotency_key_retention_s,
                        self.settings.idempotency_sweep_rows,
                    )
                )
            swept += count
            if count < self.settings.idempotency_sweep_rows:
                return swept

    async def get_job(self, request: pb.GetJobRequest) -> pb.JobInfo:
        check_job_id(request.job_id)
        async with self.database("get_job") as conn:
            row = await conn.fetchrow(queries.GET_JOB, request.job_id)
            attempts = [] if row is None else await conn.fetch(queries.JOB_ATTEMPTS, request.job_id)
            counts = (
                []
                if row is None or row["array_id"] is None
                else await conn.fetch(queries.ARRAY_COUNTS, row["array_id"])
            )
        if row is None:
            raise NotFound(f"job_id {request.job_id} not found")
        info = job_info(row, env_values=reads_env_values())
        info.attempt_history = [attempt_info(a) for a in attempts]
        info.array_counts = array_counts(counts)
        return info

    async def get_job_events(self, request: pb.GetJobEventsRequest) -> pb.GetJobEventsReply:
        """The job's history, oldest first, rebuilt from the tables in one read
        (:data:`actors.queries.JOB_EVENTS`).

        Raises:
            InvalidArgument: ``job_id`` outside 1..2**63-1.
            NotFound: no job has this id.
        """
        check_job_id(request.job_id)
        async with self.database("get_job_events") as conn:
            rows = await conn.fetch(queries.JOB_EVENTS, request.job_id)
        if not rows:
            raise NotFound(f"job_id {request.job_id} not found")
        return job_events_reply(request.job_id, rows)

    async def list_jobs(self, request: pb.ListJobsRequest) -> Encoded[pb.ListJobsReply]:
        """Up to ``limit`` jobs, newest first; the reply is built and encoded in slices inside
        the turn."""
        state, limit = check_list(request.state, request.limit)
        async with self.admitted("list_jobs"):
            async with self.connection("list_jobs") as conn:
                rows = await conn.fetch(queries.LIST_JOBS, state, limit)
            env_values = reads_env_values()
            return await self._encoded(
                pb.ListJobsReply(), {"jobs": (job_info(r, env_values=env_values) for r in rows)}
            )

    async def cancel_job(self, request: pb.CancelJobRequest) -> pb.CancelJobReply:
        check_job_id(request.job_id)
        key = check_idempotency_key(request.idempotency_key)
        # A cancel of one task only is another request than the array's cancel; a plain
        # cancel digests as it always did.
        item: list[Any] = [request.job_id, "only_this_task"] if request.only_this_task else [request.job_id]
        digest = idempotency.request_digest("cancel_job", item)
        async with self.database("cancel_job") as conn:
            done = await self._once(
                conn,
                "cancel_job",
                queries.CANCEL_JOB,
                request.job_id,
                request.only_this_task,
                key=key,
                digest=digest,
            )
        if not done.answer:
            raise NotFound(f"job_id {request.job_id} not found")
        row = done.answer[0]
        state = "cancelling" if row["cancel_requested"] else row["state"]
        if not done.replayed:
            log.get("ingest").info(
                "cancel requested", job_id=request.job_id, state=state, tasks=int(row.get("tasks") or 0)
            )
        return pb.CancelJobReply(state=state, tasks=int(row.get("tasks") or 0))

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        require_worker("register_worker", request.worker_id)
        labels = dict(request.labels)
        validation.check_registration(
            worker_id=request.worker_id,
            address=request.address,
            cpu_millis=request.cpu_millis,
            memory_mb=request.memory_mb,
            labels=labels,
            agent_run_id=request.agent_run_id,
            registration_seq=request.registration_seq,
        )
        held = validation.check_resume(
            resume_incarnation=request.resume_incarnation,
            held_assignment_ids=list(request.held_assignment_ids),
        )
        finished = list(request.finished)
        check_outcomes(finished)
        digest = idempotency.registration_digest(
            address=request.address, cpu_millis=request.cpu_millis, memory_mb=request.memory_mb, labels=labels
        )
        if request.resume_incarnation:
            return await self._resume_worker(request, labels, held, finished, digest)

        async def register(conn: PgConnection) -> tuple[int, bool, Any, Any]:
            # The worker's row first (one lock order): a new incarnation ends the old one, a
            # promise no placement in progress may cross (queries.LOCK_WORKER). Then the
            # outcomes, for the incarnation that is still current: before the new one exists,
            # so the sweep of the old one finds these assignments finished. Before all, the
            # worker's registrations one at a time (queries.LOCK_REGISTRATION).
            await conn.fetchval(queries.LOCK_REGISTRATION, request.worker_id)
            await conn.fetchval(queries.LOCK_WORKER, request.worker_id)
            if finished:
                await conn.fetchval(queries.RECORD_OUTCOMES, request.worker_id, *outcome_arrays(finished))
            # A copy of a registration already applied (a hedged or retried one) is told apart
            # first, under the row's lock: REGISTER_WORKER draws the incarnation from a sequence
            # before its conflict check, so running it for every copy would use up a number each
            # (a storm of copies read as a storm of incarnations). REGISTER_WORKER's own condition
            # still refuses a copy, should one get past this.
            row = await conn.fetchrow(queries.WORKER_REGISTRATION, request.worker_id)
            again: bool = (
                row is not None
                and row["agent_run_id"] == request.agent_run_id
                and row["registration_seq"] >= request.registration_seq
            )
            incarnation: int | None = None
            if not again:
                incarnation = await conn.fetchval(
                    queries.REGISTER_WORKER,
                    request.worker_id,
                    request.address,
                    request.cpu_millis,
                    request.memory_mb,
                    json.dumps(labels),
                    request.agent_run_id,
                    request.registration_seq,
                    digest,
                )
                if incarnation is None:
                    again = True
                    row = await conn.fetchrow(queries.WORKER_REGISTRATION, request.worker_id)
            if again:
                # Its incarnation, if it asks for the same; or one its agent has since replaced,
                # or one that asks for something else under the same key: refused, and the
                # transaction rolls back, outcomes included.
                assert row is not None  # a copy, or the conflict that skipped the update, is on this row
                if row["registration_seq"] != request.registration_seq:
                    raise InvalidArgument(
                        "registration_seq",
                        request.registration_seq,
                        f"must be above {row['registration_seq']}, the latest registration of agent "
                        f"run {request.agent_run_id} of worker {request.worker_id}",
                    )
                stored = row["registration_sha256"]
                if stored is not None and bytes(stored) != digest:
                    raise IdempotencyConflict(
                        idempotency.registration_conflict_message(
                            worker_id=request.worker_id,
                            agent_run_id=request.agent_run_id,
                            registration_seq=request.registration_seq,
                            incarnation=row["incarnation"],
                        )
                    )
                incarnation = row["incarnation"]
            assert incarnation is not None
            await faults.hit("ingest.promise_before_commit")
            # Last, so the worker's silence counts from the commit, not from the start; a copy
            # answered again is an answer too (its agent may hear of its incarnation only now).
            told = await conn.fetchrow(
                queries.STAMP_REGISTRATION, request.worker_id, incarnation, not again, *self._told_defaults()
            )
            return incarnation, again, await conn.fetchrow(queries.EPOCH_AND_CLOCK), told

        async with self.database("register_worker") as conn:
            incarnation, again, clock, told = await conn.run_in_transaction(register, what="register_worker")
        await faults.hit("ingest.register_after_commit")  # tests: an answer lost or late after the commit
        epoch = clock["epoch"]
        if again:
            metrics.INGEST_REPLAYED_REQUESTS.labels("register_worker").inc()
        log.get("ingest").info(
            "worker registered" if not again else "registration answered again",
            worker_id=request.worker_id,
            incarnation=incarnation,
            epoch=epoch,
            address=request.address,
            outcomes=len(finished),
            **outcome_log_keys(finished),
        )
        interval_ms, dead_after_ms = self._told(told)
        return pb.RegisterWorkerReply(
            incarnation=incarnation,
            epoch=epoch,
            database_unix_s=clock["database_unix_s"],
            heartbeat_interval_ms=interval_ms,
            dead_after_ms=dead_after_ms,
        )

    async def _resume_worker(
        self,
        request: pb.RegisterWorkerRequest,
        labels: dict[str, str],
        held: tuple[int, ...],
        finished: list[pb.JobOutcome],
        digest: bytes,
    ) -> pb.RegisterWorkerReply:
        """A restarted agent's registration that asks to continue ``request.resume_incarnation``
        (docs/design.md, "Restarts"), in one transaction: the outcomes first (whatever comes of
        the rest), then the row continued only if it is still alive in that incarnation
        (:data:`actors.queries.CONTINUE_WORKER`), and then the active assignments of it that the
        agent does not hold released and the held ones confirmed. A copy of a continuation
        already applied (same agent run and number) gets ``resumed`` again and releases
        nothing more: assignments placed on the continued incarnation since are its agent's.
        Anything else (the row dead, left, registered again, unknown) continues nothing and is
        answered ``resumed: false``, incarnation 0.

        Raises:
            IdempotencyConflict: a copy of an applied continuation with another address,
                capacity or labels; the transaction rolls back, outcomes included.
        """
        worker_id, incarnation = request.worker_id, request.resume_incarnation

        async def resume(conn: PgConnection) -> tuple[bool, list[int], list[int], Any, Any]:
            # The worker's row first, as heartbeats and registrations take it (one lock order).
            await conn.fetchval(queries.LOCK_WORKER, worker_id)
            if finished:
                await conn.fetchval(queries.RECORD_OUTCOMES, worker_id, *outcome_arrays(finished))
            continued = await conn.fetchval(
                queries.CONTINUE_WORKER,
                worker_id,
                request.address,
                request.cpu_millis,
                request.memory_mb,
                json.dumps(labels),
                request.agent_run_id,
                request.registration_seq,
                digest,
                incarnation,
            )
            released: list[int] = []
            if continued is None:
                row = await conn.fetchrow(queries.WORKER_REGISTRATION, worker_id)
                copy = (
                    row is not None
                    and row["incarnation"] == incarnation
                    and row["state"] == "alive"
                    and row["agent_run_id"] == request.agent_run_id
                    and row["registration_seq"] == request.registration_seq
                )
                if not copy:
                    return False, [], [], await conn.fetchrow(queries.EPOCH_AND_CLOCK), None
                stored = row["registration_sha256"] if row is not None else None
                if stored is not None and bytes(stored) != digest:
                    raise IdempotencyConflict(
                        idempotency.registration_conflict_message(
                            worker_id=worker_id,
                            agent_run_id=request.agent_run_id,
                            registration_seq=request.registration_seq,
                            incarnation=incarnation,
                        )
                    )
                released = list(await conn.fetchval(queries.RELEASED_ASSIGNMENTS, worker_id, incarnation))
            else:
                released = list(
                    await conn.fetchval(
                        queries.RELEASE_UNHELD_ASSIGNMENTS, worker_id, incarnation, list(held)
                    )
                )
            stop = list(
                await conn.fetchval(queries.CONFIRM_HELD_ASSIGNMENTS, worker_id, incarnation, list(held))
            )
            await faults.hit("ingest.promise_before_commit")
            if continued is not None:
                # Last, so the worker's silence counts from the commit, not from the start.
                told = await conn.fetchrow(
                    queries.STAMP_REGISTRATION, worker_id, incarnation, False, *self._told_defaults()
                )
            else:  # a copy answered again: what it tells is recorded too, nothing is stamped
                told = await conn.fetchrow(
                    queries.TELL_WORKER, worker_id, incarnation, *self._told_defaults()
                )
            return True, stop, released, await conn.fetchrow(queries.EPOCH_AND_CLOCK), told

        async with self.database("register_worker") as conn:
            resumed, stop, released, clock, told = await conn.run_in_transaction(
                resume, what="register_worker"
            )
        epoch = clock["epoch"]
        log.get("ingest").info(
            "worker continued its incarnation" if resumed else "worker's incarnation not continued",
            worker_id=worker_id,
            incarnation=incarnation,
            address=request.address,
            epoch=epoch,
            held=len(held),
            released=len(released),
            stop=len(stop),
            outcomes=len(finished),
            held_assignment_ids=list(held),
            released_assignment_ids=released,
            stop_assignment_ids=stop,
            **outcome_log_keys(finished),
        )
        interval_ms, dead_after_ms = self._told(told)
        return pb.RegisterWorkerReply(
            incarnation=incarnation if resumed else 0,
            epoch=epoch,
            heartbeat_interval_ms=interval_ms,
            dead_after_ms=dead_after_ms,
            resumed=resumed,
            stop_assignment_ids=stop,
            released_assignment_ids=released,
            database_unix_s=clock["database_unix_s"],
        )

    def _told_defaults(self) -> tuple[int, int]:
        """The interval and the dead_after (ms) the statements tell while no policy was chosen."""
        return self.told_default.interval_ms, self.told_default.dead_after_ms

    def _told(self, row: Any) -> tuple[int, int]:
        """A registration reply's ``heartbeat_interval_ms`` and ``dead_after_ms`` from the row of
        the statement that recorded what it tells (None: nothing recorded: no interval and the
        defaults' dead_after, which the agent never adopts, since such a reply continues nothing)."""
        if row is None:
            return 0, self.told_default.dead_after_ms
        return row["interval_ms"], row["dead_after_ms"]

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        """Record a worker's heartbeat: liveness, running confirmations, finished outcomes.

        A liveness-only heartbeat (no outcomes, no restart hold) is recorded with the
        heartbeats of other workers in one statement (:attr:`heartbeat_group`;
        docs/design.md, "Grouped heartbeats"); one that carries outcomes or asks for a hold,
        or finds its worker's row locked by another transaction, alone
        (:meth:`_heartbeat_alone`).

        Raises:
            InvalidArgument: a field out of range (nothing is stored).
            DeadlineExceeded, DatabaseUnavailable, Busy: as :meth:`database` (for a group's
                member, what its group's statement raised).
        """
        worker_id = identifiers.check_id(request.worker_id, field="worker_id")
        require_worker("heartbeat", worker_id)
        validation.check_incarnation(request.incarnation)
        hold_ms = validation.check_restart_hold_ms(request.restart_hold_ms)
        finished = list(request.finished)
        check_outcomes(finished)
        reply = await self._record_heartbeat(worker_id, request, finished, hold_ms)
        if not reply.reregister:
            # Only a recorded heartbeat of a live incarnation says a wait.
            self.heartbeat_waits.add(trio.current_time(), worker_id, request.waited_ms)
        return reply

    async def _record_heartbeat(
        self, worker_id: str, request: pb.HeartbeatRequest, finished: list[pb.JobOutcome], hold_ms: int
    ) -> pb.HeartbeatReply:
        """:meth:`heartbeat`'s work once its fields are checked: grouped when it carries only
        liveness, else alone."""
        if self.heartbeat_group is not None and not finished and not hold_ms:
            deadline = rpc_deadline()
            self._check_deadline("heartbeat", deadline)
            answer = await self.heartbeat_group.record(
                GroupedBeat(
                    deadline=deadline,
                    worker_id=worker_id,
                    incarnation=request.incarnation,
                    running_assignment_ids=tuple(request.running_assignment_ids),
                    sent_us=min(request.sent_monotonic_us, MAX_SENT_US),
                    dead_after_in_use_ms=min(request.dead_after_in_use_ms, MAX_DEAD_AFTER_MS),
                )
            )
            if not answer.skipped:
                return self._heartbeat_reply(worker_id, request.incarnation, answer)
        return await self._heartbeat_alone(worker_id, request, finished, hold_ms)

    async def run_heartbeat_group(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Gather liveness-only heartbeats into groups (:attr:`heartbeat_group`, with
        ``settings.heartbeat_group_wait_s`` and ``heartbeat_group_max``) until cancelled; the
        handlers use it once started."""
        grouper = HeartbeatGrouper(
            record_group=self.record_heartbeat_group,
            wait_s=self.settings.heartbeat_group_wait_s,
            max_heartbeats=self.settings.heartbeat_group_max,
            groups_in_flight=self.settings.heartbeat_groups_in_flight,
        )
        self.heartbeat_group = grouper
        try:
            await grouper.run(task_status=task_status)
        finally:
            self.heartbeat_group = None

    async def record_heartbeat_group(self, members: Sequence[GroupMember]) -> list[GroupAnswer | Exception]:
        """Record a group of liveness-only heartbeats (worker ids distinct) in one statement
        (``record_heartbeats`` in schema.sql): one answer per member, in order. A member whose
        client's deadline passed, or whose handler stopped waiting, before the group got its
        connection is not recorded, as a heartbeat alone would not be: its answer is
        DeadlineExceeded.

        Raises:
            DatabaseUnavailable, Busy: as :meth:`database`; nothing of the group was recorded.
        """
        answers: list[GroupAnswer | Exception] = []
        async with self.database("heartbeat") as conn:
            now = trio.current_time()
            left_out = [m.withdrawn or m.beat.deadline <= now for m in members]
            live = [m.beat for m, out in zip(members, left_out, strict=True) if not out]
            running_ids: list[int] = []
            running_members: list[int] = []
            for member, beat in enumerate(live, start=1):
                running_ids.extend(beat.running_assignment_ids)
                running_members.extend([member] * len(beat.running_assignment_ids))
            rows = []
            if live:
                rows = await conn.fetch(
                    queries.RECORD_HEARTBEATS,
                    [b.worker_id for b in live],
                    [b.incarnation for b in live],
                    [b.sent_us for b in live],
                    [b.dead_after_in_use_ms for b in live],
                    running_ids,
                    running_members,
                    *self._told_defaults(),
                )
        recorded = iter(rows)
        for out in left_out:
            if out:
                metrics.INGEST_EXPIRED_REQUESTS.labels("heartbeat").inc()
                answers.append(
                    DeadlineExceeded("heartbeat: the client's deadline passed before the request could start")
                )
                continue
            row = next(recorded)
            answers.append(
                GroupAnswer(
                    alive=row["alive"],
                    skipped=row["skipped"],
                    stop_assignment_ids=tuple(row["stop_assignment_ids"]),
                    current_epoch=row["current_epoch"],
                    database_unix_s=row["database_unix_s"],
                    told_interval_ms=row["told_interval_ms"],
                    told_dead_after_ms=row["told_dead_after_ms"],
                    newer_agent_run_id=row["newer_agent_run_id"],
                    newer_address=row["newer_address"],
                    newer_incarnation=row["newer_incarnation"],
                )
            )
        return answers

    async def _heartbeat_alone(
        self, worker_id: str, request: pb.HeartbeatRequest, finished: list[pb.JobOutcome], hold_ms: int
    ) -> pb.HeartbeatReply:
        """Record one heartbeat in a statement of its own (``record_heartbeat`` in schema.sql),
        and its restart hold after it."""
        held: object = None
        async with self.database("heartbeat") as conn:
            # One statement (record_heartbeat in schema.sql): liveness, outcomes, running
            # confirmations and the assignments to stop, in one round trip and one transaction.
            # Liveness alone skips the WAL flush there; outcomes are committed durably.
            row = await conn.fetchrow(
                queries.HEARTBEAT,
                worker_id,
                request.incarnation,
                list(request.running_assignment_ids),
                *outcome_arrays(finished),
                min(request.sent_monotonic_us, MAX_SENT_US),
                min(request.dead_after_in_use_ms, MAX_DEAD_AFTER_MS),
                *self._told_defaults(),
            )
            assert row is not None
            newer = (
                None
                if row["alive"]
                else await conn.fetchrow(queries.NEWER_REGISTRATION, worker_id, request.incarnation)
            )
            if hold_ms and row["alive"]:
                # A planned restart's hold, recorded after the heartbeat committed: it counts from
                # this statement's now(), after the heartbeat's send (docs/design.md, "Restarts").
                held = await conn.fetchval(
                    queries.SET_RESTART_HOLD, worker_id, request.incarnation, hold_ms / 1000
                )
        if finished:
            # Only a heartbeat that carries outcomes logs (one line, its ids listed): the
            # liveness-only heartbeats, four a second per worker, stay silent.
            log.get("ingest").info(
                "outcomes recorded",
                worker_id=worker_id,
                incarnation=request.incarnation,
                epoch=row["current_epoch"],
                **outcome_log_keys(finished),
            )
        answer = GroupAnswer(
            alive=row["alive"],
            stop_assignment_ids=tuple(row["stop_assignment_ids"]),
            current_epoch=row["current_epoch"],
            database_unix_s=row["database_unix_s"],
            told_interval_ms=row["told_interval_ms"],
            told_dead_after_ms=row["told_dead_after_ms"],
            newer_agent_run_id=None if newer is None else newer["agent_run_id"] or "",
            newer_address=None if newer is None else newer["address"],
            newer_incarnation=None if newer is None else newer["incarnation"],
        )
        reply = self._heartbeat_reply(worker_id, request.incarnation, answer)
        if hold_ms and answer.alive:
            reply.restart_hold_granted = held is not None
            log.get("ingest").info(
                "restart hold recorded" if held is not None else "restart hold not recorded",
                worker_id=worker_id,
                incarnation=request.incarnation,
                hold_s=hold_ms / 1000,
            )
        return reply

    def _heartbeat_reply(self, worker_id: str, incarnation: int, answer: GroupAnswer) -> pb.HeartbeatReply:
        """The reply to a recorded heartbeat (alone or in a group), counted in the metrics."""
        if not answer.alive:
            metrics.HEARTBEATS_REREGISTER.inc()
            reply = pb.HeartbeatReply(
                epoch=answer.current_epoch, reregister=True, database_unix_s=answer.database_unix_s
            )
            if answer.newer_incarnation is not None:  # another registration took the id over
                reply.newer_agent_run_id = answer.newer_agent_run_id or ""
                reply.newer_address = answer.newer_address or ""
                reply.newer_incarnation = answer.newer_incarnation
            return reply
        metrics.HEARTBEATS_RECORDED.inc()
        self.heartbeats_recorded += 1
        if answer.stop_assignment_ids:
            log.get("ingest").info(
                "worker told to stop assignments",
                worker_id=worker_id,
                incarnation=incarnation,
                epoch=answer.current_epoch,
                assignment_ids=list(answer.stop_assignment_ids),
            )
        return pb.HeartbeatReply(
            epoch=answer.current_epoch,
            stop_assignment_ids=list(answer.stop_assignment_ids),
            database_unix_s=answer.database_unix_s,
            heartbeat_interval_ms=answer.told_interval_ms,
            dead_after_ms=answer.told_dead_after_ms,
        )

    async def leave_worker(self, request: pb.LeaveWorkerRequest) -> pb.LeaveWorkerReply:
        """Record a clean stop: the worker's outcomes, then its row ``left`` (an unfenced write,
        like a heartbeat), if the request names the incarnation that is alive now and the
        agent run that registered it. The leader ends that incarnation's assignments as
        stopped and requeues their jobs in its next reconcile pass (a fenced write).

        The agent sends it only once it has stopped every job. Anything else (an earlier
        incarnation, another run, a worker already declared dead or unknown) changes nothing
        and is answered ``left: false`` with the reason; a copy of a leave already applied
        is answered ``left: true`` again.

        Raises:
            InvalidArgument: a field out of range (nothing is stored).
        """
        require_worker("leave_worker", request.worker_id)
        validation.check_leave(
            worker_id=request.worker_id, incarnation=request.incarnation, agent_run_id=request.agent_run_id
        )
        finished = list(request.finished)
        check_outcomes(finished)
        worker_id, incarnation = request.worker_id, request.incarnation

        async def leave(conn: PgConnection) -> tuple[Any, int]:
            # The worker's row first, as heartbeats and registrations take it (one lock order),
            # then the outcomes, recorded whatever the leave's fate (a result is never lost).
            await conn.fetchval(queries.LOCK_WORKER, worker_id)
            if finished:
                await conn.fetchval(queries.RECORD_OUTCOMES, worker_id, *outcome_arrays(finished))
            row = await conn.fetchrow(queries.LEAVE_WORKER, worker_id, incarnation, request.agent_run_id)
            await faults.hit("ingest.promise_before_commit")
            return row, await conn.fetchval(queries.CURRENT_EPOCH)

        async with self.database("leave_worker") as conn:
            row, epoch = await conn.run_in_transaction(leave, what="leave_worker")
        left, detail = leave_verdict(worker_id, incarnation, row)
        log.get("ingest").info(
            "worker left" if left else "leave changed nothing",
            worker_id=worker_id,
            incarnation=incarnation,
            epoch=epoch,
            outcomes=len(finished),
            detail=detail,
            **outcome_log_keys(finished),
        )
        return pb.LeaveWorkerReply(left=left, epoch=epoch, detail=detail)

    async def _worker_schedule(
        self, rpc: str, sql: str, worker_id: str, *args: Any, key: str, items: list[Any]
    ) -> pb.WorkerScheduleReply:
        """Carry out a cordon, uncordon or drain of ``worker_id`` once per idempotency ``key``
        (an unfenced request: the placer and the reconciler act on it while leader).

        Raises:
            NotFound: no worker has that id; nothing was stored.
            IdempotencyConflict, Busy, DatabaseUnavailable: as :meth:`_once`.
        """
        digest = idempotency.request_digest(rpc, items)
        async with self.database(rpc) as conn:
            done = await self._once(
                conn, rpc, sql, worker_id, *args, key=key, digest=digest, lock_worker=worker_id
            )
        if not done.answer:
            raise NotFound(f"worker_id {worker_id!r} not found: no worker ever registered with that id")
        reply = worker_schedule_reply(done.answer[0])
        if not done.replayed:
            log.get("ingest").info(
                rpc.replace("_", " "),
                worker_id=worker_id,
                cordoned=reply.cordoned,
                draining=reply.draining or reply.drained,
                drain_deadline_unix_s=reply.drain_deadline_unix_s or None,
                unhealthy=reply.unhealthy,
                active_jobs=len(reply.job_ids),
            )
        return reply

    async def cordon_worker(self, request: pb.CordonWorkerRequest) -> pb.WorkerScheduleReply:
        """Cordon a worker: no new placement on it; its running jobs go on."""
        worker_id = check_worker_id(request.worker_id)
        key = check_idempotency_key(request.idempotency_key)
        return await self._worker_schedule(
            "cordon_worker", queries.CORDON_WORKER, worker_id, key=key, items=[worker_id]
        )

    async def uncordon_worker(self, request: pb.UncordonWorkerRequest) -> pb.WorkerScheduleReply:
        """End a worker's cordon and any drain of it, and clear its mark as unhealthy: it takes
        placements again."""
        worker_id = check_worker_id(request.worker_id)
        key = check_idempotency_key(request.idempotency_key)
        return await self._worker_schedule(
            "uncordon_worker", queries.UNCORDON_WORKER, worker_id, key=key, items=[worker_id]
        )

    async def drain_worker(self, request: pb.DrainWorkerRequest) -> pb.WorkerScheduleReply:
        """Drain a worker: cordon it, and with a deadline have the leader stop and requeue
        what still runs there once it has passed (see ``schema.sql``, drain and cordon)."""
        worker_id = check_worker_id(request.worker_id)
        deadline_ms = None
        if request.has_deadline:
            deadline_ms = check_drain_deadline_ms(request.deadline_ms)
        key = check_idempotency_key(request.idempotency_key)
        deadline_s = None if deadline_ms is None else deadline_ms / 1000
        return await self._worker_schedule(
            "drain_worker",
            queries.DRAIN_WORKER,
            worker_id,
            deadline_s,
            key=key,
            items=[worker_id, deadline_ms],
        )

    async def status(self, request: pb.StatusRequest) -> Encoded[pb.StatusReply]:
        """The status view; built and encoded in slices inside the turn."""
        async with self.admitted("status"):
            async with self.connection("status") as conn:
                lease = await conn.fetchrow(queries.READ_LEASE)
                cps = await conn.fetch(queries.STATUS_CONTROL_PLANES)
                workers = await conn.fetch(queries.STATUS_WORKERS)
                counts = await conn.fetch(queries.STATUS_JOB_COUNTS)
                stuck = await conn.fetch(queries.STATUS_UNSCHEDULABLE)
                policy = await conn.fetchrow(queries.STATUS_HEARTBEAT_POLICY, *self._told_defaults())
            return await self._encoded(
                *status_reply(
                    self.cp_id,
                    lease,
                    cps,
                    workers,
                    counts,
                    stuck,
                    env_values=reads_env_values(),
                    heartbeat_policy=policy,
                )
            )


CONTROL_PLANE_ACCESS = {
    "read_job_logs": (OPERATOR, VIEWER),
    "submit_job": (OPERATOR,),
    "submit_jobs": (OPERATOR,),
    "cancel_job": (OPERATOR,),
    "get_job": (OPERATOR, VIEWER),
    "get_job_events": (OPERATOR, VIEWER),
    "list_jobs": (OPERATOR, VIEWER),
    "status": (OPERATOR, VIEWER),
    "register_worker": (WORKER,),
    "heartbeat": (WORKER,),
    "leave_worker": (WORKER,),
    "cordon_worker": (OPERATOR,),
    "uncordon_worker": (OPERATOR,),
    "drain_worker": (OPERATOR,),
}
"""Who may call each ControlPlane RPC over mutual TLS (:func:`runtime.aio.trio_service`):
operators change jobs and take workers out of service, viewers and operators read, workers speak only for
themselves (the handlers check that a worker's certificate names the ``worker_id`` it sends)."""

ENV_VALUE_READERS = (OPERATOR,)
"""Who reads the values of a job's environment in GetJob, ListJobs and Status replies:
operators, who may submit and so set them. Every other reader (a viewer) gets the names, each
value :data:`runtime.jobs.HIDDEN_ENV_VALUE`: the values may be secrets (a token, a password).
On a plaintext server (``--insecure``) no identity is checked and everyone reads them."""


def reads_env_values() -> bool:
    """Whether the caller of the RPC being served may read environment values
    (:data:`ENV_VALUE_READERS`)."""
    return rpc_caller().acts_as(ENV_VALUE_READERS)


@attrs.define
class Ingest:
    """The actor: serves :class:`ControlPlaneService` and records this replica's presence.

    Self-contained, so it may run on a trio loop of its own: its pool, its lag monitor
    (``stockade_event_loop_lag_seconds{loop="ingest"}``, which its shedding reads) and its
    server all start inside :meth:`run`.
    """

    cp_id: str
    database_url: str
    listen_host: str
    listen_port: int
    presence_interval_s: float
    settings: IngestSettings = attrs.field(factory=IngestSettings)
    told_default: HeartbeatPolicy = attrs.field(factory=lambda: default_policy(ReconcilerSettings()))
    """The heartbeat interval and the dead_after told to workers while the leader chose none."""
    _cost: HeartbeatCost = attrs.field(factory=lambda: HeartbeatCost())
    advertise_address: str = ""
    console_url: str | None = None
    """The origin of this replica's web console (``https://host:port``), recorded with its
    presence so open pages can move to it; None: it serves none."""
    tls: ssl.SSLContext | None = None
    """Serve over mutual TLS with this server context (:func:`runtime.tls.server_context`),
    checking :data:`CONTROL_PLANE_ACCESS`; None: plaintext, no checks."""
    worker_tls: ClientTls | None = None
    """This replica's client certificate, for reading job output from workers (ReadJobLogs);
    None: plaintext."""
    lag: LoopLag = attrs.field(factory=lambda: LoopLag(loop="ingest"))
    """The ingest loop's lag monitor, run by :meth:`run` (a test may feed it lags)."""
    address: str = ""
    """host:port others reach this replica at; set once serving."""
    service: ControlPlaneService | None = None
    """The handlers; set once serving."""
    _log: Any = attrs.field(factory=lambda: log.get("ingest"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled."""
        pool = await open_pool(self.cp_id, self.database_url, self.settings)
        try:
            self.service = ControlPlaneService(
                cp_id=self.cp_id,
                pool=pool,
                settings=self.settings,
                lag=self.lag,
                told_default=self.told_default,
                logs=LogRelay(cp_id=self.cp_id, settings=self.settings, tls=self.worker_tls),
            )
            service = trio_service(pb.ControlPlaneBase, self.service, access=CONTROL_PLANE_ACCESS)
            async with trio.open_nursery() as nursery:
                await nursery.start(self.lag.run)
                if self.settings.heartbeat_group_wait_s > 0:
                    await nursery.start(self.service.run_heartbeat_group)
                port = await nursery.start(
                    partial(serve_grpc, [service], self.listen_host, self.listen_port, tls=self.tls)
                )
                self.address = self.advertise_address or identifiers.format_address(self.listen_host, port)
                await self._record_presence(self.service)
                nursery.start_soon(self._presence, self.service)
                nursery.start_soon(self._sweep, self.service)
                self._log.info("serving", address=self.address)
                task_status.started()
        finally:
            if self.service is not None and self.service.logs is not None:
                self.service.logs.close()
            await pool.close()

    async def _record_presence(self, service: ControlPlaneService) -> None:
        cost_us = self._cost.measure(time.thread_time(), service.heartbeats_recorded)
        wait_ms = service.heartbeat_waits.p99_ms(trio.current_time())
        metrics.HEARTBEAT_WAIT_P99_SECONDS.set(math.nan if wait_ms is None else wait_ms / 1000)
        async with service.database("presence") as conn:
            await conn.execute(
                queries.RECORD_PRESENCE,
                self.cp_id,
                self.address,
                os.getpid(),
                self.console_url,
                cost_us,
                wait_ms,
            )

    async def _presence(self, service: ControlPlaneService) -> None:
        failing = False
        while True:
            await trio.sleep(self.presence_interval_s)
            try:
                await self._record_presence(service)
                failing = False
            except DatabaseUnavailable as exc:
                # Once per run of failures: the pool logs the database's outage itself.
                if not failing:
                    self._log.warning("presence not recorded", error=str(exc))
                failing = True

    async def _sweep(self, service: ControlPlaneService) -> None:
        """Delete expired idempotency keys every ``idempotency_sweep_interval_s``; every replica
        sweeps (the sweeps skip each other's rows), so the keys' storage stays bounded by the
        retention window while any replica runs."""
        while True:
            await trio.sleep(self.settings.idempotency_sweep_interval_s)
            try:
                await service.sweep_idempotency_keys()
            except (Busy, DeadlineExceeded):
                pass  # shed as any other request: the next sweep catches up
            except DatabaseUnavailable as exc:
                self._log.warning("idempotency keys not swept", error=str(exc))


SCHEMA_PATH = next(
    (
        path
        for path in (
            Path(__file__).resolve().parents[1] / "schema.sql",  # a source tree, or an editable install
            Path(sys.prefix) / "share" / "stockade" / "schema.sql",  # a wheel's (data-files)
        )
        if path.is_file()
    ),
    Path(__file__).resolve().parents[1] / "schema.sql",
)
"""schema.sql: next to the packages in a source tree, else where a wheel installs it."""
SCHEMA_CALL_TIMEOUT_S = 60.0
"""Longest one statement of the schema's application may go unanswered, in seconds: the whole
schema is one statement, and a replica may wait here for another applying it."""


async def apply_schema(database_url: str) -> None:
    """Apply ``schema.sql`` (idempotent), serialised across replicas by an advisory lock, and
    only when the database does not hold this very schema yet (its sha256 is recorded).

    Raises:
        DatabaseUnavailable: the database cannot be reached.
        FileNotFoundError: schema.sql is missing next to the packages.
    """
    sql = SCHEMA_PATH.read_text()
    digest = hashlib.sha256(sql.encode()).hexdigest()
    conn = await PgConnection.connect(
        database_url,
        server_settings={"application_name": "stockade schema"},
        call_timeout_s=SCHEMA_CALL_TIMEOUT_S,
    )
    try:
        await conn.fetchval(queries.APPLY_SCHEMA_LOCK, queries.SCHEMA_LOCK_KEY)
        try:
            await conn.execute(queries.SCHEMA_VERSION_TABLE)
            if await conn.fetchval(queries.SCHEMA_VERSION) != digest:
                await conn.execute(sql)
                await conn.execute(queries.RECORD_SCHEMA_VERSION, digest)
        finally:
            # A connection dropped by the error (a read-only server, a lost link) holds no lock
            # any more; unlocking it would only hide that error behind "connection is closed".
            if not conn.is_closed():
                await conn.fetchval(queries.APPLY_SCHEMA_UNLOCK, queries.SCHEMA_LOCK_KEY)
    finally:
        await conn.close()
