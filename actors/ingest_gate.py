"""Ingest's admission plumbing: turns, connections, shedding, and work done in slices.

:class:`AdmittedService` is the base of the ingest's handlers: each first holds a turn
(:meth:`AdmittedService.admitted`), then a connection (docs/design.md, "Ingest" and
"Admission"). This module runs no statement that writes.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from actors import admission, queries
from protocol import wire
from protocol.wire import Encoded
from runtime import log, metrics
from runtime.aio import PgConnection, PgPool, finish_despite_cancel, rpc_deadline
from runtime.aio.pg_reconnect import open_pool_when_reachable
from runtime.errors import Busy, DatabaseUnavailable, DeadlineExceeded
from runtime.lag import LoopLag
from runtime.settings.control_plane import IngestSettings
from runtime.settings.fields import session_ms


def session_settings(settings: IngestSettings) -> dict[str, str]:
    """Session settings of ingest's connections: a replica frozen in a transaction must not keep
    a worker's row locked for long, and others wait for a lock ``lock_timeout_s`` at most."""
    return {
        "statement_timeout": session_ms(settings.statement_timeout_s),
        "idle_in_transaction_session_timeout": session_ms(settings.idle_in_transaction_timeout_s),
        "lock_timeout": session_ms(settings.lock_timeout_s),
    }


SESSION_SETTINGS = session_settings(IngestSettings())
"""Session settings of ingest's connections with the default :class:`IngestSettings`."""

T = TypeVar("T")
DEADLINE_PASSED = "the client's deadline passed before the request could start"


async def run_in_slices(steps: Generator[None, None, T], share: admission.LoopShare | None = None) -> T:
    """Run ``steps`` to its end, letting the loop's other tasks run at each of its yields
    (:mod:`protocol.wire`, :func:`runtime.validation.check_jobs_steps`), and pausing as
    ``share`` says (:class:`actors.admission.LoopShare`; None: no pauses)."""
    while True:
        started = trio.current_time()
        finished = False
        try:
            next(steps)
        except StopIteration as done:
            finished, value = True, done.value
        now = trio.current_time()
        pause_s = 0.0 if share is None else share.spend(now=now, used_s=now - started)
        if finished:
            return value
        if pause_s > 0:
            await trio.sleep(pause_s)
        else:
            await trio.lowlevel.checkpoint()


async def open_pool(cp_id: str, database_url: str, settings: IngestSettings) -> PgPool:
    """The ingest's connections: ``settings.pool_size`` of them, all opened now and kept open,
    waiting while the database cannot be reached. No handler changes session state, so a
    connection given back skips asyncpg's reset query (one round trip fewer per request).

    Raises:
        DatabaseRefused: the database refused this client for good.
    """
    return await open_pool_when_reachable(
        database_url,
        owner="ingest",
        size=settings.pool_size,
        min_size=settings.pool_size,
        idle_close_s=0,
        reset_on_release=False,
        server_settings={"application_name": f"stockade {cp_id} ingest", **session_settings(settings)},
        call_timeout_s=settings.answer_timeout_s,
    )


@attrs.define
class AdmittedService:
    """Admission for the RPC handlers of one replica's ingest (``lag``: the loop's lag monitor,
    which shedding reads)."""

    cp_id: str
    pool: PgPool
    settings: IngestSettings = attrs.field(factory=IngestSettings)
    lag: LoopLag = attrs.field(factory=lambda: LoopLag(loop="ingest"))
    gate: admission.AdmissionGate = attrs.field(init=False)
    """Turns for the requests, some reserved for liveness work (a test may hold them)."""
    wire_share: admission.LoopShare = attrs.field(init=False)
    """The loop time the slices of large messages may take."""
    pending_jobs: int = attrs.field(init=False, default=0)
    """The pending queue's length as last counted, plus what this replica stored since."""
    pending_counted_at: float = attrs.field(init=False, default=-math.inf)
    """Trio time of that count."""
    _shed_since_log: dict[str, int] = attrs.field(init=False, factory=dict)
    _shed_logged_at: float = attrs.field(init=False, default=-math.inf)
    _log: Any = attrs.field(init=False, factory=lambda: log.get("ingest"))

    def __attrs_post_init__(self) -> None:
        s = self.settings
        self.gate = admission.AdmissionGate(
            s.pool_size, s.liveness_reserved_connections, s.max_requests_in_progress
        )
        self.wire_share = admission.LoopShare(share=s.max_wire_work_share, burst_s=s.wire_work_burst_s)

    @asynccontextmanager
    async def admitted(self, rpc: str) -> AsyncIterator[None]:
        """Hold a turn for ``rpc``'s work for the body of the block, if the request is to be
        served at all (:mod:`actors.admission`); do all of it, reply encoding included, inside.

        Raises:
            DeadlineExceeded: the client's deadline passed before the work could start.
            Busy: not liveness work, and the replica is overloaded or the turn did not come
                within ``max_admission_wait_s``; nothing was done.
            DatabaseUnavailable: liveness work got no connection within
                ``settings.liveness_connection_wait_s``.
        """
        liveness = rpc in admission.LIVENESS_RPCS
        deadline = rpc_deadline()
        self._check_deadline(rpc, deadline)
        load = admission.Load(
            lag_s=self.lag.recent_max_s,
            in_progress=self.gate.held_other,
            waiting=self.gate.waiting_other,
            would_wait=self.gate.would_wait(liveness=liveness),
        )
        reason = admission.shed_reason(rpc, load, cp_id=self.cp_id, settings=self.settings)
        if reason is not None:
            self._record_shed(rpc, reason)
            raise Busy(reason)
        arrived = trio.current_time()
        wait_s = admission.admission_wait_s(
            now=arrived, deadline=deadline, liveness=liveness, settings=self.settings
        )
        acquired = False
        with trio.move_on_after(wait_s):
            await self.gate.acquire(liveness=liveness)
            acquired = True
        metrics.INGEST_STAGE_SECONDS.labels(rpc, "turn").observe(trio.current_time() - arrived)
        if not acquired:
            self._check_deadline(rpc, deadline)
            if liveness:
                raise DatabaseUnavailable(
                    f"no database connection within {self.settings.liveness_connection_wait_s:g} s"
                )
            waited_s, in_progress = trio.current_time() - arrived, self.gate.held_other
            reason = admission.turn_timeout_reason(
                rpc, waited_s=waited_s, in_progress=in_progress, cp_id=self.cp_id, settings=self.settings
            )
            self._record_shed(rpc, reason)
            raise Busy(reason)
        try:
            yield
        finally:
            self.gate.release(liveness=liveness)

    @asynccontextmanager
    async def connection(self, rpc: str) -> AsyncIterator[PgConnection]:
        """A connection for ``rpc``'s database work; use inside :meth:`admitted`. The body runs
        to its end even if the client gives up meanwhile (bounded by ``answer_timeout_s``).

        Raises:
            DeadlineExceeded: the client's deadline passed before the work could start.
            DatabaseUnavailable: the database failed, or the work outlasted
                ``settings.answer_timeout_s``.
        """
        began = trio.current_time()
        try:
            async with self.pool.acquire() as conn:
                self._check_deadline(rpc, rpc_deadline())
                with finish_despite_cancel(self.settings.answer_timeout_s):
                    yield conn
        finally:
            metrics.INGEST_STAGE_SECONDS.labels(rpc, "database").observe(trio.current_time() - began)

    @asynccontextmanager
    async def database(self, rpc: str) -> AsyncIterator[PgConnection]:
        """:meth:`admitted` and :meth:`connection` together, for work whose reply is small.

        Raises:
            DeadlineExceeded, Busy, DatabaseUnavailable: as those two.
        """
        async with self.admitted(rpc), self.connection(rpc) as conn:
            yield conn

    async def _encoded(self, reply: wire.M, elements: dict[str, Any] | None = None) -> Encoded[wire.M]:
        """``reply`` encoded in slices (:func:`protocol.wire.encode_steps`; ``elements``: lists
        of it built lazily, in the same slices)."""
        steps = wire.encode_steps(reply, step_messages=self.settings.wire_step_messages, elements=elements)
        return Encoded(type(reply), await run_in_slices(steps, self.wire_share))

    def _check_deadline(self, rpc: str, deadline: float) -> None:
        if trio.current_time() >= deadline:
            metrics.INGEST_EXPIRED_REQUESTS.labels(rpc).inc()
            raise DeadlineExceeded(f"{rpc}: {DEADLINE_PASSED}")

    def _record_shed(self, rpc: str, reason: str) -> None:
        metrics.INGEST_SHED_REQUESTS.labels(rpc).inc()
        self._shed_since_log[rpc] = self._shed_since_log.get(rpc, 0) + 1
        now = trio.current_time()
        if now - self._shed_logged_at >= self.settings.shed_log_every_s:
            self._log.warning("shedding new work", reason=reason, shed=dict(self._shed_since_log))
            self._shed_logged_at = now
            self._shed_since_log.clear()

    async def _refuse_when_queue_full(self, rpc: str) -> None:
        """Refuse a submission while the pending queue holds ``max_pending_jobs`` (docs/design.md,
        "Admission", rule 4), counting it again when older than ``pending_count_max_age_s``.

        Raises:
            Busy: the queue is full; nothing was stored.
        """
        if not self.settings.max_pending_jobs:
            return
        if trio.current_time() - self.pending_counted_at > self.settings.pending_count_max_age_s:
            async with self.connection(rpc) as conn:
                self.pending_jobs = int(await conn.fetchval(queries.COUNT_PENDING))
            self.pending_counted_at = trio.current_time()
        reason = admission.queue_full_reason(
            pending=self.pending_jobs,
            counted_s_ago=trio.current_time() - self.pending_counted_at,
            cp_id=self.cp_id,
            settings=self.settings,
        )
        if reason is not None:
            self._record_shed(rpc, reason)
            raise Busy(reason)
