"""Ingest's schedule handlers: AddSchedule, ListSchedules, PauseSchedule, ResumeSchedule and
RemoveSchedule (docs/schedules.md). Unfenced writes, each once per idempotency key and audited;
the leader's scheduler fires the slots (:mod:`actors.scheduler`).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import attrs

from actors import idempotency, queries
from actors.ingest_accounts import AccountHandlers
from actors.ingest_jobs import reads_env_values
from protocol import pb
from runtime import log
from runtime.aio import rpc_caller, visible_account
from runtime.errors import FailedPrecondition, InvalidArgument, NotFound
from runtime.identifiers import check_id
from runtime.jobs import JobSpec
from runtime.schedules import ScheduleRules, check_schedule, next_slot, parse_cron, zone
from runtime.validation import check_idempotency_key
from runtime.wire_jobs import job_spec_from_pb, job_spec_to_pb


def _ms(at: dt.datetime | None) -> int:
    return 0 if at is None else round(at.timestamp() * 1000)


def check_schedule_job(message: pb.JobSpec | None) -> JobSpec:
    """A schedule's job, checked as a job's (:meth:`JobSpec.check`), without dependencies, an
    array or a gang's tasks.

    Raises:
        InvalidArgument: the spec breaks a job's rule, or names ``after``, ``after_names``,
            ``array`` or ``tasks``.
    """
    job = job_spec_from_pb(message).check()
    if job.after:
        raise InvalidArgument("job.after", list(job.after), "must be empty for a schedule's job")
    if job.after_names:
        raise InvalidArgument("job.after_names", list(job.after_names), "must be empty for a schedule's job")
    if job.array is not None:
        raise InvalidArgument("job.array", str(job.array), "must be empty for a schedule's job")
    if job.tasks is not None:
        raise InvalidArgument("job.tasks", job.tasks, "must be unset for a schedule's job (no gang)")
    return job


def schedule_info(row: Any, *, env_values: bool) -> pb.ScheduleInfo:
    """A row of ``queries.LIST_SCHEDULES`` (or ``REMOVE_SCHEDULE``'s answer) as a ScheduleInfo;
    the next slot is the first after the later of its cursor and the database's now (none while
    paused)."""
    job = queries.job_spec_of_template(row["job"])
    if not env_values:
        job = job.env_values_hidden()
    spec = pb.ScheduleSpec(
        name=row["name"],
        cron=row["cron"],
        tz=row["tz"],
        job=job_spec_to_pb(job),
        concurrency_policy=row["concurrency_policy"],
        starting_deadline_s=int(row["starting_deadline_s"]),
    )
    info = pb.ScheduleInfo(id=int(row["id"]), spec=spec, paused=bool(row["paused"]), owner=row["owner"])
    if row.get("fired") is not None:  # a listed row, or a removal's answer: its slots' counts
        info.fired = int(row["fired"])
        info.skipped = int(row["skipped"])
    if row.get("slots_through") is not None:  # a listed row, not a removal's answer
        info.created_at_ms = _ms(row["created_at"])
        info.last_slot_at_ms = _ms(row["last_slot_at"])
        info.last_job_id = int(row["last_job_id"] or 0)
        info.last_skip_reason = row["last_skip_reason"] or ""
        if not row["paused"]:
            try:
                after = max(row["slots_through"], row["now"])
                info.next_slot_at_ms = _ms(next_slot(parse_cron(row["cron"]), zone(row["tz"]), after))
            except InvalidArgument:
                pass  # stored by a newer version: shown without a next slot
    return info


@attrs.define
class ScheduleHandlers(AccountHandlers):
    """The schedule RPCs of :class:`actors.ingest.ControlPlaneService`."""

    async def add_schedule(self, request: pb.AddScheduleRequest) -> pb.ScheduleInfo:
        """Store a schedule owned by the caller's account, once per idempotency key, audited as
        ``schedule_add``; its first slot is the first after now (database time).

        Raises:
            InvalidArgument: a field breaks its rule (:func:`runtime.schedules.check_schedule`,
                :func:`check_schedule_job`), or the job's priority is above the account's
                ``max_priority``; nothing stored.
            FailedPrecondition: a schedule of that name exists; nothing stored.
            IdempotencyConflict, Busy, DatabaseUnavailable: as :meth:`_once`.
        """
        spec = request.spec or pb.ScheduleSpec()
        job = check_schedule_job(spec.job)
        key = check_idempotency_key(request.idempotency_key)
        async with self.database("add_schedule") as conn:
            now = await conn.fetchval(queries.DATABASE_NOW)
            rules: ScheduleRules = check_schedule(
                name=spec.name,
                cron=spec.cron,
                tz=spec.tz,
                concurrency_policy=spec.concurrency_policy,
                starting_deadline_s=spec.starting_deadline_s or None,  # 0 on the wire: none given
                now=now,
            )
            items = [
                rules.name,
                rules.cron.expression,
                rules.tz,
                rules.concurrency_policy,
                rules.starting_deadline_s,
                idempotency.job_item(job),
            ]
            caller = rpc_caller()
            done = await self._once(
                conn,
                "add_schedule",
                queries.ADD_SCHEDULE,
                rules.name,
                rules.cron.expression,
                rules.tz,
                queries.job_template(job),
                rules.concurrency_policy,
                rules.starting_deadline_s,
                caller.account,
                job.priority if caller.priority_capped else None,
                key=key,
                digest=idempotency.request_digest("add_schedule", items),
                arguments={"name": rules.name, "cron": rules.cron.expression, "tz": rules.tz},
            )
            if not done.answer:
                raise FailedPrecondition(
                    f"schedule {rules.name!r} exists: nothing was stored; remove it first "
                    f"(stockade schedule remove {rules.name}) or choose another name"
                )
            row = await conn.fetchrow(queries.LIST_SCHEDULES, None, rules.name)
        if row is None:  # removed at once by another call
            raise NotFound(f"schedule {rules.name!r} not found")
        if not done.replayed:
            log.get("ingest").info("schedule added", schedule=rules.name, cron=rules.cron.expression)
        return schedule_info(row, env_values=reads_env_values())

    async def list_schedules(self, request: pb.ListSchedulesRequest) -> pb.ListSchedulesReply:
        """Every schedule, by name, of ``account`` (a user's or a scoped viewer's own only)."""
        account = visible_account("list_schedules", request.account)
        async with self.database("list_schedules") as conn:
            rows = await conn.fetch(queries.LIST_SCHEDULES, account, None)
        env_values = reads_env_values()
        return pb.ListSchedulesReply(schedules=[schedule_info(r, env_values=env_values) for r in rows])

    async def pause_schedule(self, request: pb.ScheduleNameRequest) -> pb.ScheduleInfo:
        """Pause a schedule: no slot of it fires or is recorded until it is resumed (audited as
        ``schedule_pause``). Raises NotFound for no such schedule (another account's is none)."""
        return await self._change("pause_schedule", queries.PAUSE_SCHEDULE, request)

    async def resume_schedule(self, request: pb.ScheduleNameRequest) -> pb.ScheduleInfo:
        """Resume a paused schedule: its slots start again after now; those of its pause are
        none of its slots (audited as ``schedule_resume``). Raises as :meth:`pause_schedule`."""
        return await self._change("resume_schedule", queries.RESUME_SCHEDULE, request)

    async def remove_schedule(self, request: pb.ScheduleNameRequest) -> pb.ScheduleInfo:
        """Remove a schedule and its slots' records; the jobs it fired stay (audited as
        ``schedule_remove``). Answers the schedule as it was. Raises as :meth:`pause_schedule`."""
        return await self._change("remove_schedule", queries.REMOVE_SCHEDULE, request)

    async def _change(self, rpc: str, sql: str, request: pb.ScheduleNameRequest) -> pb.ScheduleInfo:
        name = check_id(request.name, field="name")
        key = check_idempotency_key(request.idempotency_key)
        scope = visible_account(rpc, "")
        async with self.database(rpc) as conn:
            done = await self._once(
                conn,
                rpc,
                sql,
                name,
                scope,
                key=key,
                digest=idempotency.request_digest(rpc, [name]),
                arguments={"name": name},
            )
            if not done.answer:
                raise NotFound(f"schedule {name!r} not found")
            row: Any = None
            if rpc != "remove_schedule":
                row = await conn.fetchrow(queries.LIST_SCHEDULES, scope, name)
        if row is None:
            if rpc != "remove_schedule":  # removed since, by another call
                raise NotFound(f"schedule {name!r} not found")
            removed = dict(done.answer[0])
            removed["job"] = json.dumps(removed["job"])
            return schedule_info(removed, env_values=reads_env_values())
        if not done.replayed:
            log.get("ingest").info(rpc.replace("_", " "), schedule=name)
        return schedule_info(row, env_values=reads_env_values())
