"""Ingest: the ControlPlane gRPC service that clients and workers call, on every replica.

:class:`ControlPlaneService` is its handlers, one module per kind of call, on the admission of
:mod:`actors.ingest_gate`; :class:`Ingest` is the actor that serves it and records this
replica's presence. It records what is not a decision (unfenced writes), with or without a
leader: docs/design.md, "Ingest".
"""

from __future__ import annotations

import math
import os
import ssl
import time
from functools import partial
from typing import Any

import attrs
import trio

from actors import queries
from actors.heartbeat_policy import HeartbeatCost, HeartbeatPolicy, default_policy
from actors.ingest_gate import open_pool
from actors.ingest_jobs import reads_env_values
from actors.ingest_replies import status_reply
from actors.ingest_schedules import ScheduleHandlers
from actors.logs import LogRelay, check_read_job_logs, log_source
from protocol import pb
from protocol.bases import ControlPlaneBase
from protocol.wire import Encoded
from runtime import identifiers, log, metrics
from runtime.aio import Send, serve_grpc, trio_service, visible_account
from runtime.errors import Busy, DatabaseUnavailable, DeadlineExceeded
from runtime.lag import LoopLag
from runtime.settings.control_plane import IngestSettings
from runtime.settings.leader import ReconcilerSettings
from runtime.tls import OPERATOR, USER, VIEWER, WORKER, ClientTls
from runtime.validation import check_audit_query

__all__ = ["ControlPlaneService", "Ingest"]


@attrs.define
class ControlPlaneService(ScheduleHandlers):
    """The RPC handlers (trio coroutines), served through :func:`runtime.aio.trio_service`,
    built with the fields of :class:`actors.ingest_gate.AdmittedService`."""

    logs: LogRelay | None = None
    """Relays job output from workers (ReadJobLogs); None: one of its own, plaintext."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.logs is None:
            self.logs = LogRelay(cp_id=self.cp_id, settings=self.settings)

    async def read_job_logs(self, request: pb.ReadJobLogsRequest, send: Send) -> None:
        """Stream a job's output from the worker that keeps it, holding no database connection
        while relaying; raises as :func:`actors.logs.log_source` and :meth:`LogRelay.relay`."""
        checked = check_read_job_logs(request)
        assert self.logs is not None
        self.logs.admit()
        scope = visible_account("read_job_logs", "")
        async with self.database("read_job_logs") as conn:
            row = await conn.fetchrow(queries.LOG_SOURCE, checked.job_id, checked.assignment_id, scope)
        source = log_source(checked.job_id, row, checked.assignment_id)
        await self.logs.relay(source, checked, send)

    async def list_audit(self, request: pb.ListAuditRequest) -> pb.ListAuditReply:
        """Up to ``limit`` rows of the audit trail, newest first, of ``account`` (a user's own,
        a scoped viewer's: :func:`runtime.aio.visible_account`), ``action`` and the last
        ``since_s`` seconds; raises InvalidArgument as
        :func:`runtime.validation.check_audit_query`, PermissionDenied for another account."""
        since_s = request.since_s if request.has_since_s else None
        action, since_s, limit = check_audit_query(request.action, since_s, request.limit)
        account = visible_account("list_audit", request.account)
        async with self.database("list_audit") as conn:
            rows = await conn.fetch(queries.LIST_AUDIT, account, action, since_s, limit)
        return pb.ListAuditReply(entries=[pb.AuditEntry(**dict(row)) for row in rows])

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
    "read_job_logs": (OPERATOR, VIEWER, USER),
    "submit_job": (OPERATOR, USER),
    "submit_jobs": (OPERATOR, USER),
    "cancel_job": (OPERATOR, USER),
    "get_job": (OPERATOR, VIEWER, USER),
    "get_job_events": (OPERATOR, VIEWER, USER),
    "list_jobs": (OPERATOR, VIEWER, USER),
    "list_audit": (OPERATOR, VIEWER, USER),
    "status": (OPERATOR, VIEWER),
    "register_worker": (WORKER,),
    "heartbeat": (WORKER,),
    "leave_worker": (WORKER,),
    "cordon_worker": (OPERATOR,),
    "uncordon_worker": (OPERATOR,),
    "drain_worker": (OPERATOR,),
    "set_account": (OPERATOR,),
    "get_account": (OPERATOR, VIEWER, USER),
    "list_accounts": (OPERATOR, VIEWER, USER),
    "add_schedule": (OPERATOR, USER),
    "list_schedules": (OPERATOR, VIEWER, USER),
    "pause_schedule": (OPERATOR, USER),
    "resume_schedule": (OPERATOR, USER),
    "remove_schedule": (OPERATOR, USER),
}
"""Who may call each ControlPlane RPC over mutual TLS (docs/accounts.md); a worker speaks only for
itself (the handlers check that its certificate names the ``worker_id`` it sends), and a user, or
a viewer scoped to an account, reads and cancels only that account's jobs and audit rows (the
handlers pass :func:`runtime.aio.visible_account` to their statements)."""


@attrs.define
class Ingest:
    """The actor: serves :class:`ControlPlaneService` and records this replica's presence.
    Self-contained (its pool, lag monitor and server start inside :meth:`run`), so it may run on
    a trio loop of its own."""

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
    """The origin of this replica's web console, recorded with its presence; None: none."""
    tls: ssl.SSLContext | None = None
    """Serve over mutual TLS, checking :data:`CONTROL_PLANE_ACCESS`; None: plaintext."""
    worker_tls: ClientTls | None = None
    """This replica's client certificate, for reading job output from workers; None: plaintext."""
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
            service = trio_service(ControlPlaneBase, self.service, access=CONTROL_PLANE_ACCESS)
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
            args = (self.cp_id, self.address, os.getpid(), self.console_url, cost_us, wait_ms)
            await conn.execute(queries.RECORD_PRESENCE, *args)

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
        """Delete expired idempotency keys and usage samples every
        ``idempotency_sweep_interval_s`` (every replica sweeps; the sweeps skip each other's rows)."""
        while True:
            await trio.sleep(self.settings.idempotency_sweep_interval_s)
            for sweep, what in (
                (service.sweep_idempotency_keys, "idempotency keys"),
                (service.sweep_usage_samples, "usage samples"),
            ):
                try:
                    await sweep()
                except (Busy, DeadlineExceeded):
                    pass  # shed as any other request: the next sweep catches up
                except DatabaseUnavailable as exc:
                    self._log.warning(f"{what} not swept", error=str(exc))
