"""Ingest's worker handlers: registrations (a new incarnation, or a restarted agent's
continuation of its own), clean stops, and an operator's cordons, uncordons and drains.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from actors import idempotency, queries, validation
from actors.ingest_heartbeats import HeartbeatHandlers
from actors.ingest_replies import (
    check_outcomes,
    leave_verdict,
    outcome_arrays,
    outcome_log_keys,
    worker_schedule_reply,
)
from protocol import pb
from runtime import faults, log, metrics
from runtime.aio import PgConnection, require_worker
from runtime.errors import IdempotencyConflict, InvalidArgument, NotFound
from runtime.resources import check_offered
from runtime.validation import check_drain_deadline_ms, check_idempotency_key, check_worker_id

_CHECKED_AS_SENT = ("worker_id", "address", "cpu_millis", "memory_mb", "agent_run_id", "registration_seq")
"""The fields of a registration that :func:`actors.validation.check_registration` takes as sent."""


def registration_args(
    request: pb.RegisterWorkerRequest, labels: dict[str, str], digest: bytes
) -> tuple[Any, ...]:
    """The parameters REGISTER_WORKER and CONTINUE_WORKER begin with, in their order."""
    asked = (request.worker_id, request.address, request.cpu_millis, request.memory_mb, json.dumps(labels))
    return (*asked, request.agent_run_id, request.registration_seq, digest)


def same_registration(row: Any, request: pb.RegisterWorkerRequest, digest: bytes) -> int:
    """The incarnation of the registration stored in ``row``, which ``request`` is a copy of.

    Raises:
        IdempotencyConflict: the stored one asked for another address, capacity or labels.
    """
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
    return int(row["incarnation"])


async def lock_and_record(conn: PgConnection, worker_id: str, finished: list[pb.JobOutcome]) -> None:
    """Lock the worker's row first, as heartbeats and registrations take it (one lock order),
    then record its ``finished`` outcomes, whatever comes of the rest (a result is never lost)."""
    await conn.fetchval(queries.LOCK_WORKER, worker_id)
    if finished:
        await conn.fetchval(queries.RECORD_OUTCOMES, worker_id, *outcome_arrays(finished))


@attrs.define
class WorkerHandlers(HeartbeatHandlers):
    """The worker RPCs of :class:`actors.ingest.ControlPlaneService` but Heartbeat."""

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        require_worker("register_worker", request.worker_id)
        labels = dict(request.labels)
        validation.check_registration(**{f: getattr(request, f) for f in _CHECKED_AS_SENT}, labels=labels)
        held = validation.check_resume(
            resume_incarnation=request.resume_incarnation,
            held_assignment_ids=list(request.held_assignment_ids),
        )
        finished = list(request.finished)
        check_outcomes(finished)
        names = [r.name for r in request.resources]
        if len(set(names)) != len(names):
            raise InvalidArgument("resources", names, "must name each resource once")
        offered = check_offered({r.name: list(r.units) for r in request.resources})
        offered_json = json.dumps(offered)
        digest = idempotency.registration_digest(
            address=request.address,
            cpu_millis=request.cpu_millis,
            memory_mb=request.memory_mb,
            labels=labels,
            resources=offered,
        )
        if request.resume_incarnation:
            return await self._resume_worker(request, labels, held, finished, digest, offered_json)

        async def register(conn: PgConnection) -> tuple[int, bool, Any, Any]:
            # The worker's row first (one lock order): a new incarnation ends the old one, a
            # promise no placement in progress may cross (queries.LOCK_WORKER). Then the
            # outcomes, for the incarnation that is still current: before the new one exists,
            # so the sweep of the old one finds these assignments finished. Before all, the
            # worker's registrations one at a time (queries.LOCK_REGISTRATION).
            await conn.fetchval(queries.LOCK_REGISTRATION, request.worker_id)
            await lock_and_record(conn, request.worker_id, finished)
            # A copy of an applied registration is told apart first, under the row's lock:
            # REGISTER_WORKER draws the incarnation from a sequence before its conflict check,
            # so each copy would use up a number.
            row = await conn.fetchrow(queries.WORKER_REGISTRATION, request.worker_id)
            again: bool = (
                row is not None
                and row["agent_run_id"] == request.agent_run_id
                and row["registration_seq"] >= request.registration_seq
            )
            incarnation: int | None = None
            if not again:
                incarnation = await conn.fetchval(
                    queries.REGISTER_WORKER, *registration_args(request, labels, digest), offered_json
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
                incarnation = same_registration(row, request, digest)
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
        offered_json: str = "{}",
    ) -> pb.RegisterWorkerReply:
        """A restarted agent's registration that asks to continue ``request.resume_incarnation``
        (docs/design.md, "Restarts"), in one transaction: the outcomes, then the row continued
        only if still alive in that incarnation, the unheld assignments released and the held
        ones confirmed. A copy of an applied continuation gets ``resumed`` again and releases
        nothing more; anything else is answered ``resumed: false``, incarnation 0.

        Raises:
            IdempotencyConflict: a copy of an applied continuation with another address,
                capacity or labels; the transaction rolls back, outcomes included.
        """
        worker_id, incarnation = request.worker_id, request.resume_incarnation

        async def resume(conn: PgConnection) -> tuple[bool, list[int], list[int], Any, Any]:
            await lock_and_record(conn, worker_id, finished)
            continued = await conn.fetchval(
                queries.CONTINUE_WORKER,
                *registration_args(request, labels, digest),
                incarnation,
                offered_json,
            )
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
                same_registration(row, request, digest)
                released = list(await conn.fetchval(queries.RELEASED_ASSIGNMENTS, worker_id, incarnation))
            else:
                sql = queries.RELEASE_UNHELD_ASSIGNMENTS
                released = list(await conn.fetchval(sql, worker_id, incarnation, list(held)))
            sql = queries.CONFIRM_HELD_ASSIGNMENTS
            stop = list(await conn.fetchval(sql, worker_id, incarnation, list(held)))
            await faults.hit("ingest.promise_before_commit")
            defaults = self._told_defaults()
            if continued is not None:
                # Last, so the worker's silence counts from the commit, not from the start.
                told = await conn.fetchrow(
                    queries.STAMP_REGISTRATION, worker_id, incarnation, False, *defaults
                )
            else:  # a copy answered again: what it tells is recorded too, nothing is stamped
                told = await conn.fetchrow(queries.TELL_WORKER, worker_id, incarnation, *defaults)
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
            **log.counted("assignment_ids", held=held, released=released, stop=stop),
            outcomes=len(finished),
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

    async def leave_worker(self, request: pb.LeaveWorkerRequest) -> pb.LeaveWorkerReply:
        """Record a clean stop, sent once the agent stopped every job: the worker's outcomes,
        then its row ``left`` if the request names the alive incarnation and the agent run that
        registered it (the leader then ends its assignments and requeues their jobs). Anything
        else changes nothing and is answered ``left: false`` with the reason; a copy of an
        applied leave is answered ``left: true`` again.

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
            await lock_and_record(conn, worker_id, finished)
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
        self,
        rpc: str,
        sql: str,
        worker_id: str,
        *args: Any,
        key: str,
        items: list[Any],
        arguments: dict[str, Any] | None = None,
    ) -> pb.WorkerScheduleReply:
        """Carry out a cordon, uncordon or drain of ``worker_id`` once per idempotency ``key``.

        Raises:
            NotFound: no worker has that id; nothing was stored.
            IdempotencyConflict, Busy, DatabaseUnavailable: as :meth:`_once`.
        """
        digest = idempotency.request_digest(rpc, items)
        async with self.database(rpc) as conn:
            done = await self._once(
                conn,
                rpc,
                sql,
                worker_id,
                *args,
                key=key,
                digest=digest,
                arguments=arguments,
                lock_worker=worker_id,
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
        return await self._cordon("cordon_worker", queries.CORDON_WORKER, request)

    async def uncordon_worker(self, request: pb.UncordonWorkerRequest) -> pb.WorkerScheduleReply:
        """End a worker's cordon and any drain of it, and clear its mark as unhealthy: it takes
        placements again."""
        return await self._cordon("uncordon_worker", queries.UNCORDON_WORKER, request)

    async def _cordon(
        self, rpc: str, sql: str, request: pb.CordonWorkerRequest | pb.UncordonWorkerRequest
    ) -> pb.WorkerScheduleReply:
        worker_id = check_worker_id(request.worker_id)
        key = check_idempotency_key(request.idempotency_key)
        return await self._worker_schedule(rpc, sql, worker_id, key=key, items=[worker_id])

    async def drain_worker(self, request: pb.DrainWorkerRequest) -> pb.WorkerScheduleReply:
        """Drain a worker: cordon it, and with a deadline have the leader stop and requeue
        what still runs there once it has passed (see ``schema.sql``, drain and cordon)."""
        worker_id = check_worker_id(request.worker_id)
        deadline_ms = check_drain_deadline_ms(request.deadline_ms) if request.has_deadline else None
        key = check_idempotency_key(request.idempotency_key)
        deadline_s = None if deadline_ms is None else deadline_ms / 1000
        return await self._worker_schedule(
            "drain_worker",
            queries.DRAIN_WORKER,
            worker_id,
            deadline_s,
            key=key,
            items=[worker_id, deadline_ms],
            arguments={"deadline_s": deadline_s},
        )
