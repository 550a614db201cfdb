"""Ingest's job handlers: submissions (one job or a batch), cancels, job queries, and the
sweep of expired idempotency keys; every mutating call carried out once per idempotency key
(:meth:`JobHandlers._once`). docs/design.md, "Ingest".
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs

from actors import dependencies, idempotency, queries
from actors.ingest_gate import AdmittedService, run_in_slices
from actors.ingest_replies import array_counts, attempt_info, job_events_reply, job_info, usage_now
from protocol import pb, wire
from protocol.wire import Encoded
from runtime import faults, log, metrics
from runtime.aio import PgConnection, audit_params, rpc_caller, takes_encoded_request, visible_account
from runtime.errors import Busy, DatabaseBusy, DuplicateKey, IdempotencyConflict, InvalidArgument, NotFound
from runtime.jobs import JobSpec
from runtime.tls import OPERATOR, USER
from runtime.validation import check_idempotency_key, check_job_id, check_jobs_steps, check_list
from runtime.wire_jobs import job_spec_from_pb


@attrs.frozen(kw_only=True)
class Once:
    """What a mutating call's statement gave (:meth:`JobHandlers._once`)."""

    answer: list[dict[str, Any]]
    """The rows its effect returned, the first time (JSON objects, by column name)."""
    replayed: bool
    """True when the call had been carried out already and this is the stored answer."""


@attrs.define
class JobHandlers(AdmittedService):
    """The job RPCs of :class:`actors.ingest.ControlPlaneService`, and the once-per-key
    execution its mutating calls share."""

    async def _once(
        self,
        conn: PgConnection,
        rpc: str,
        sql: str,
        *args: Any,
        key: str,
        digest: bytes,
        arguments: Mapping[str, Any] | None = None,
        lock_worker: str | None = None,
    ) -> Once:
        """Carry out a mutating call's statement (made by :func:`actors.queries.once`) once per
        idempotency ``key``: the effect, or, for a copy of a call already carried out, the
        stored answer and no effect (:mod:`actors.idempotency`).

        Args:
            rpc: the call, e.g. ``"submit_job"``.
            sql: its statement; ``args`` its effect's parameters.
            digest: the checked request's sha256 (:func:`actors.idempotency.request_digest`).
            arguments: the call's key arguments, for its audit row (written with the effect,
                naming the RPC's caller: :func:`runtime.aio.audit_params`).
            lock_worker: a promise about this worker's future (a cordon or drain): its row is
                locked first in the same transaction, so no placement commits onto it after.

        Raises:
            IdempotencyConflict: ``key`` was first used for another request; nothing was stored.
            Busy: the database gave up on the statement (a copy in progress held the key, or a
                timeout); nothing was stored.
            DatabaseUnavailable: the database failed.
        """

        args = (*args, *audit_params(arguments or {}))
        scope = rpc_caller().scope
        digest = idempotency.scoped_digest(digest, scope)

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
                    idempotency.conflict_message(
                        key=key, rpc=rpc, first_rpc=row["rpc"], answer=answer, shown=scope is None
                    )
                )
            metrics.INGEST_REPLAYED_REQUESTS.labels(rpc).inc()
            return Once(answer=answer, replayed=True)
        await faults.hit("ingest.after_commit")
        return Once(answer=answer, replayed=False)

    async def submit_job(self, request: pb.SubmitJobRequest) -> pb.SubmitJobReply:
        job = job_spec_from_pb(request.spec).check()
        if job.after_names:
            raise InvalidArgument(
                "after_names",
                list(job.after_names),
                "must be empty in SubmitJob (name jobs of the same SubmitJobs request; give ids in after)",
            )
        key = check_idempotency_key(request.idempotency_key)
        digest = idempotency.request_digest("submit_job", [idempotency.job_item(job)])
        async with self.admitted("submit_job"):
            await self._refuse_when_queue_full("submit_job")
            if job.tasks is not None:
                await self._refuse_gang_beyond_cluster("submit_job", job.tasks, job.spread, job)
            done = await self._store_jobs(
                "submit_job",
                queries.SUBMIT_JOB,
                (
                    *attrs.astuple(queries.job_columns(job)),
                    rpc_caller().account,
                    rpc_caller().scope,
                    job.priority if rpc_caller().priority_capped else None,
                    queries.resources_json(job),
                    job.tasks,
                    job.spread,
                ),
                key=key,
                digest=digest,
                arguments={"name": job.name},
                missing=lambda conn: self._missing_dependencies(conn, "after", job.after),
            )
            if not done.replayed:
                # An array counts as its tasks against the queue's limit.
                self.pending_jobs += int(done.answer[0].get("tasks", 1))
        job_id = int(done.answer[0]["id"])
        if not done.replayed:
            log.get("ingest").info("job submitted", job_id=job_id, name=job.name)
        return pb.SubmitJobReply(job_id=job_id)

    async def _refuse_gang_beyond_cluster(
        self, rpc: str, tasks: int, spread: bool, job: JobSpec, field: str = "tasks"
    ) -> None:
        """Refuse a gang of ``tasks`` tasks of ``job``'s size that the workers this cluster knows
        could never hold at once (:func:`gang_beyond_cluster`); nothing is stored.

        Raises:
            InvalidArgument: naming ``field``, the gang's size and what the workers hold.
        """
        async with self.connection(rpc) as conn:
            row = await conn.fetchrow(queries.GANG_ROOM, job.cpu_millis, job.memory_mb)
        assert row is not None  # an aggregate has one row
        refusal = gang_beyond_cluster(
            field, tasks, spread, job.cpu_millis, job.memory_mb, known=row["known"], able=row["able"],
            holds=row["holds"],
        )  # fmt: skip
        if refusal is not None:
            raise refusal

    async def _store_jobs(
        self,
        rpc: str,
        sql: str,
        args: Sequence[Any],
        *,
        key: str,
        digest: bytes,
        arguments: Mapping[str, Any],
        missing: Callable[[PgConnection], Awaitable[InvalidArgument]],
    ) -> Once:
        """Carry out a submission's statement once per ``key`` (:meth:`_once`), inside its turn.

        Raises:
            InvalidArgument: a job names a dependency that does not exist (``missing`` says
                which); nothing was stored.
            IdempotencyConflict, Busy, DatabaseUnavailable: as :meth:`_once`.
        """
        async with self.connection(rpc) as conn:
            done = await self._once(conn, rpc, sql, *args, key=key, digest=digest, arguments=arguments)
            if not done.answer:
                raise await missing(conn)
        return done

    async def _missing_dependencies(
        self, conn: PgConnection, field: str, after: tuple[int, ...]
    ) -> InvalidArgument:
        """The error of a submission that stored nothing because of ``after``, naming the jobs
        that do not exist."""
        missing = [int(i) for i in await conn.fetchval(queries.MISSING_JOBS, list(after), rpc_caller().scope)]
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
                check_jobs_steps(batch.specs, spec_of=job_spec_from_pb, step_jobs=step), self.wire_share
            )
            key = check_idempotency_key(batch.idempotency_key)
            for index, job in enumerate(jobs):
                if job.tasks is not None:
                    await self._refuse_gang_beyond_cluster(
                        "submit_jobs", job.tasks, job.spread, job, field=f"specs[{index}].tasks"
                    )
            items = (idempotency.job_item(j) for j in jobs)
            digest = await run_in_slices(
                idempotency.digest_steps("submit_jobs", items, step_items=step), self.wire_share
            )

            async def first_missing(conn: PgConnection) -> InvalidArgument:
                named = sorted({i for j in jobs for i in j.after})
                missing = {
                    int(i) for i in await conn.fetchval(queries.MISSING_JOBS, named, rpc_caller().scope)
                }
                index = next((n for n, j in enumerate(jobs) if missing & set(j.after)), 0)
                return await self._missing_dependencies(conn, f"specs[{index}].after", jobs[index].after)

            highest = max((j.priority for j in jobs), default=0)
            try:
                done = await self._store_jobs(
                    "submit_jobs",
                    queries.SUBMIT_JOBS,
                    (
                        *queries.job_column_arrays(jobs),
                        rpc_caller().account,
                        rpc_caller().scope,
                        highest if rpc_caller().priority_capped else None,
                        [queries.resources_json(j) for j in jobs],
                        [j.tasks for j in jobs],
                        [j.spread for j in jobs],
                    ),
                    key=key,
                    digest=digest,
                    arguments={"jobs": len(jobs)},
                    missing=first_missing,
                )
            except InvalidArgument as exc:
                if exc.field != "priority":
                    raise
                # The database names the batch's highest priority: say which job has it.
                index = next(n for n, j in enumerate(jobs) if j.priority == highest)
                raise InvalidArgument(
                    f"specs[{index}].priority", exc.value, exc.rule, detail=exc.detail
                ) from None
            if not done.replayed:
                # An array or a gang counts as its tasks against the queue's limit.
                self.pending_jobs += sum(int(r.get("tasks", 1)) for r in done.answer)
        # In the request's order (answers stored before the batch's positions: ids in order).
        job_ids = [int(r["id"]) for r in sorted(done.answer, key=lambda r: (r.get("n", 0), r["id"]))]
        if not done.replayed:
            # One line per batch, listing its ids (a 10,000-job batch: one line, not 10,000).
            log.get("ingest").info("jobs submitted", count=len(job_ids), job_ids=sorted(job_ids))
        return pb.SubmitJobsReply(job_ids=job_ids)

    async def sweep_idempotency_keys(self) -> int:
        """Delete the idempotency keys older than ``idempotency_key_retention_s``,
        ``idempotency_sweep_rows`` per admitted statement; returns how many.

        Raises:
            Busy, DeadlineExceeded: the replica is busy; the rest waits for the next sweep.
            DatabaseUnavailable: the database failed.
        """
        retention_s = self.settings.idempotency_key_retention_s
        return await self.sweep("sweep_idempotency_keys", queries.SWEEP_IDEMPOTENCY_KEYS, retention_s)

    async def sweep_usage_samples(self) -> int:
        """Delete the usage samples older than ``usage_retention_s``; returns how many; raises
        as :meth:`sweep_idempotency_keys`."""
        retention_s = self.settings.usage_retention_s
        return await self.sweep("sweep_usage_samples", queries.SWEEP_USAGE_SAMPLES, retention_s)

    async def sweep(self, call: str, sql: str, retention_s: float) -> int:
        """Run the sweep statement ``sql`` (``$1`` retention in seconds, ``$2`` most rows; it
        returns how many it deleted) as ``call`` until one deletes fewer than
        ``idempotency_sweep_rows``; returns how many in all; raises as
        :meth:`sweep_idempotency_keys`."""
        swept, rows = 0, self.settings.idempotency_sweep_rows
        while True:
            async with self.database(call) as conn:
                count = int(await conn.fetchval(sql, retention_s, rows))
            swept += count
            if count < rows:
                return swept

    async def get_job(self, request: pb.GetJobRequest) -> pb.JobInfo:
        check_job_id(request.job_id)
        scope = visible_account("get_job", "")
        async with self.database("get_job") as conn:
            row = await conn.fetchrow(queries.GET_JOB, request.job_id, scope)
            attempts = [] if row is None else await conn.fetch(queries.JOB_ATTEMPTS, request.job_id)
            array_id = None if row is None else row["array_id"]
            counts = [] if array_id is None else await conn.fetch(queries.ARRAY_COUNTS, array_id)
            used = None if row is None else await conn.fetchval(queries.JOB_USAGE_NOW, request.job_id)
        if row is None:
            raise NotFound(f"job_id {request.job_id} not found")
        info = job_info(row, env_values=reads_env_values())
        info.usage = usage_now(used)
        info.attempt_history = [attempt_info(a) for a in attempts]
        info.array_counts = array_counts(counts)
        return info

    async def get_job_events(self, request: pb.GetJobEventsRequest) -> pb.GetJobEventsReply:
        """The job's history, oldest first, rebuilt from the tables in one read; raises
        InvalidArgument for a ``job_id`` outside 1..2**63-1, NotFound for no such job."""
        check_job_id(request.job_id)
        scope = visible_account("get_job_events", "")
        async with self.database("get_job_events") as conn:
            rows = await conn.fetch(queries.JOB_EVENTS, request.job_id, scope)
        if not rows:
            raise NotFound(f"job_id {request.job_id} not found")
        return job_events_reply(request.job_id, rows)

    async def list_jobs(self, request: pb.ListJobsRequest) -> Encoded[pb.ListJobsReply]:
        """Up to ``limit`` jobs, newest first, of ``account`` (or of every account the caller may
        see: :func:`runtime.aio.visible_account`); the reply is built and encoded in slices
        inside the turn."""
        state, limit = check_list(request.state, request.limit)
        account = visible_account("list_jobs", request.account)
        async with self.admitted("list_jobs"):
            async with self.connection("list_jobs") as conn:
                rows = await conn.fetch(queries.LIST_JOBS, state, limit, account)
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
        # A user cancels only its own jobs: another account's is as no job (NotFound).
        scope = visible_account("cancel_job", "")
        arguments = {"only_this_task": request.only_this_task}
        async with self.database("cancel_job") as conn:
            args = (request.job_id, request.only_this_task, scope)
            done = await self._once(
                conn, "cancel_job", queries.CANCEL_JOB, *args, key=key, digest=digest, arguments=arguments
            )
        if not done.answer:
            raise NotFound(f"job_id {request.job_id} not found")
        row = done.answer[0]
        state, tasks = "cancelling" if row["cancel_requested"] else row["state"], int(row.get("tasks") or 0)
        if not done.replayed:
            log.get("ingest").info("cancel requested", job_id=request.job_id, state=state, tasks=tasks)
        return pb.CancelJobReply(state=state, tasks=tasks)


ENV_VALUE_READERS = (OPERATOR, USER)
"""Who reads the values of a job's environment in GetJob, ListJobs and Status replies: operators,
who may set them, and users, who set them and read only their own jobs. Every other reader gets
each value as :data:`runtime.jobs.HIDDEN_ENV_VALUE` (they may be secrets); on a plaintext server
(``--insecure``) everyone reads them."""


def gang_beyond_cluster(
    field: str,
    tasks: int,
    spread: bool,
    cpu_millis: int,
    memory_mb: int,
    *,
    known: int,
    able: int,
    holds: int,
) -> InvalidArgument | None:
    """The refusal of a gang of ``tasks`` tasks of ``cpu_millis`` and ``memory_mb`` that the
    ``known`` workers (live or dead, not left) could never hold at once, even empty: with
    ``spread`` more tasks than the ``able`` workers with room for one, else more than the
    ``holds`` tasks they hold in all; None when they could, or when no worker is known yet (the
    gang waits, as a job does before its workers register). As Slurm refuses a job no
    configured node could ever run; constraints, containers and devices are judged by the
    placer's pending reason."""
    if known == 0:
        return None
    size = f"{cpu_millis} cpu_millis and {memory_mb} memory_mb"
    if (able if spread else holds) == 0:
        return InvalidArgument(
            field,
            tasks,
            f"must fit the workers this cluster knows, and none of its {known} has room for one "
            f"task of {size}",
        )
    if spread and tasks > able:
        return InvalidArgument(
            field,
            tasks,
            f"must be at most {able}: a spread gang needs a worker per task with room for {size}, "
            f"and {able} of the {known} workers this cluster knows have it",
        )
    if not spread and tasks > holds:
        return InvalidArgument(
            field,
            tasks,
            f"must be at most {holds}: the {known} workers this cluster knows hold {holds} tasks "
            f"of {size} at once",
        )
    return None


def reads_env_values() -> bool:
    """Whether the caller of the RPC being served may read environment values
    (:data:`ENV_VALUE_READERS`)."""
    return rpc_caller().acts_as(ENV_VALUE_READERS)
