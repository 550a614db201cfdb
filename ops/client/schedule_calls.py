"""The client's calls on schedules (add, list, pause, resume, remove): :class:`ScheduleCalls`, a
part of :class:`ops.client.Client` (docs/schedules.md).
"""

from __future__ import annotations

from ops.client.admin_results import Schedule, schedule_info_from_pb
from ops.client.checks import check_account, check_key
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument
from runtime.jobs import JobSpec


class ScheduleCalls:
    """:class:`ops.client.Client`'s calls on schedules, over its connections ``_cp``."""

    _cp: ControlPlaneClient

    async def add_schedule(
        self,
        name: str,
        *,
        cron: str,
        job: JobSpec,
        tz: str = "UTC",
        concurrency_policy: str = "allow",
        starting_deadline_s: int | None = None,
        idempotency_key: str | None = None,
    ) -> Schedule:
        """Add a periodic job owned by this caller's account (docs/schedules.md): the leader
        fires one job of ``job`` per slot of ``cron`` in ``tz``, each slot once.

        Args:
            name: the schedule's name (the id rules), unique in the cluster.
            cron: 5 fields, or 6 with a leading second field, or @hourly and the like.
            job: the job each slot fires (no ``after``, no ``array``).
            tz: an IANA time zone name.
            concurrency_policy: ``allow``, ``forbid`` or ``replace`` (Kubernetes CronJob's).
            starting_deadline_s: how late a slot may still fire, 1 to 604,800 s; None: 60.
            idempotency_key: this call's key, as in :meth:`ops.client.Client.submit`.

        Raises:
            InvalidArgument: a field breaks its rule (the cron does not parse or never fires,
                the zone is unknown, ...); nothing was sent.
            FailedPrecondition: a schedule of that name exists; nothing was stored.
            IdempotencyConflict, NoControlPlaneReachable, ClusterBusy, PermissionDenied: as
                :meth:`ops.client.Client.submit`.
        """
        import datetime as dt

        from protocol import pb
        from runtime.schedules import check_schedule
        from runtime.wire_jobs import job_spec_to_pb

        rules = check_schedule(
            name=name,
            cron=cron,
            tz=tz,
            concurrency_policy=concurrency_policy,
            starting_deadline_s=starting_deadline_s,
            now=dt.datetime.now(dt.UTC),
        )
        checked = job.check()
        for field, value in (
            ("job.after", checked.after),
            ("job.array", checked.array),
            ("job.tasks", checked.tasks),
        ):
            if value:
                raise InvalidArgument(
                    field, value, "must be empty for a schedule's job (no dependencies, array or gang)"
                )
        spec = pb.ScheduleSpec(
            name=rules.name,
            cron=rules.cron.expression,
            tz=rules.tz,
            job=job_spec_to_pb(checked),
            concurrency_policy=rules.concurrency_policy,
            starting_deadline_s=rules.starting_deadline_s,
        )
        request = pb.AddScheduleRequest(spec=spec, idempotency_key=check_key(idempotency_key))
        reply: pb.ScheduleInfo = await self._cp.call("add_schedule", request)
        return schedule_info_from_pb(reply)

    async def schedules(self, *, account: str | None = None) -> tuple[Schedule, ...]:
        """Every schedule by name, of ``account`` (None: every account the caller may see).

        Raises:
            InvalidArgument: a bad ``account``; nothing was sent.
            NoControlPlaneReachable, ClusterBusy, PermissionDenied: as :meth:`ops.client.Client.submit`.
        """
        from protocol import pb

        check_account(account)
        request = pb.ListSchedulesRequest(account=account or "")
        reply: pb.ListSchedulesReply = await self._cp.call("list_schedules", request)
        return tuple(schedule_info_from_pb(s) for s in reply.schedules)

    async def pause_schedule(self, name: str, *, idempotency_key: str | None = None) -> Schedule:
        """Pause a schedule: none of its slots fires or is recorded until :meth:`resume_schedule`.

        Raises:
            InvalidArgument: a bad ``name`` or key; nothing was sent.
            NotFound: no such schedule (another account's is none).
            IdempotencyConflict, NoControlPlaneReachable, ClusterBusy, PermissionDenied: as
                :meth:`ops.client.Client.submit`.
        """
        return await self._schedule_change("pause_schedule", name, idempotency_key)

    async def resume_schedule(self, name: str, *, idempotency_key: str | None = None) -> Schedule:
        """Resume a paused schedule: its slots start again after now.

        Raises:
            the errors of :meth:`pause_schedule`.
        """
        return await self._schedule_change("resume_schedule", name, idempotency_key)

    async def remove_schedule(self, name: str, *, idempotency_key: str | None = None) -> Schedule:
        """Remove a schedule (the jobs it fired stay); returns it as it was.

        Raises:
            the errors of :meth:`pause_schedule`.
        """
        return await self._schedule_change("remove_schedule", name, idempotency_key)

    async def _schedule_change(self, rpc: str, name: str, key: str | None) -> Schedule:
        from protocol import pb
        from runtime.identifiers import check_id

        check_id(name, field="name")
        request = pb.ScheduleNameRequest(name=name, idempotency_key=check_key(key))
        reply: pb.ScheduleInfo = await self._cp.call(rpc, request)
        return schedule_info_from_pb(reply)
