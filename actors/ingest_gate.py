"""Ingest's admission plumbing: turns, connections, shedding, and work done in slices.

:class:`AdmittedService` is the base of the ingest's handlers
(:class:`actors.ingest.ControlPlaneService`): every handler first holds a turn
(:meth:`AdmittedService.admitted`) and then a connection (:meth:`AdmittedService.connection`),
as docs/design.md, "Ingest" and "Admission", say. This module runs no statement that writes:
the handlers, and so the unfenced writes, stay in the ingest's modules.
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
    """Session settings of ingest's connections.

    A replica frozen in the middle of a transaction (a registration) must not keep that
    worker's row locked: its session ends after ``idle_in_transaction_timeout_s`` idle in the
    transaction, and others wait for a lock ``lock_timeout_s`` at most (the worker then tries
    the next replica). A heartbeat is one statement, so it never leaves a transaction open
    between round trips.
    """
    return {
        "statement_timeout": session_ms(settings.statement_timeout_s),
        "idle_in_transaction_session_timeout": session_ms(settings.idle_in_transaction_timeout_s),
        "lock_timeout": session_ms(settings.lock_timeout_s),
    }


SESSION_SETTINGS = session_settings(IngestSettings())
"""Session settings of ingest's connections with the default :class:`IngestSettings`."""

T = TypeVar("T")


async def run_in_slices(steps: Generator[None, None, T], share: admission.LoopShare | None = None) -> T:
    """Run ``steps`` to its end, letting the loop's other tasks run at each of its yields
    (:mod:`protocol.wire`, :func:`runtime.validation.check_jobs_steps`), and pausing as
    ``share`` says (:class:`actors.admission.LoopShare`; None: no pauses)."""
    while True:
        started = trio.current_time()
        try:
            next(steps)
        except StopIteration as done:
            if share is not None:
                share.spend(now=trio.current_time(), used_s=trio.current_time() - started)
            return done.value
        pause_s = 0.0
        if share is not None:
            now = trio.current_time()
            pause_s = share.spend(now=now, used_s=now - started)
        if pause_s > 0:
            await trio.sleep(pause_s)
        else:
            await trio.lowlevel.checkpoint()


async def open_pool(cp_id: str, database_url: str, settings: IngestSettings) -> PgPool:
    """The ingest's connections: ``settings.pool_size`` of them, all opened now and kept open
    (a replica under load opens none), with :func:`session_settings`.

    No handler changes session state (no ``SET`` outside a transaction, no advisory lock, no
    ``LISTEN``, no cursor), so a connection given back skips asyncpg's reset query: one round
    trip fewer per request. While the database cannot be reached it waits, trying again with
    backoff and logging the outage once per change
    (:func:`runtime.aio.pg_reconnect.open_pool_when_reachable`);
    each call on a pooled connection goes unanswered for ``settings.answer_timeout_s`` at most.

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
    """Admission for the RPC handlers of one replica's ingest.

    Args:
        cp_id: this replica's id, named in busy answers.
        pool: the ingest's connections (``settings.pool_size`` of them).
        settings: capacity and shedding limits.
        lag: the ingest loop's lag monitor (its :attr:`~runtime.lag.LoopLag.recent_max_s`).
    """

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
        self.gate = admission.AdmissionGate(
            size=self.settings.pool_size,
            reserved=self.settings.liveness_reserved_connections,
            max_other=self.settings.max_requests_in_progress,
        )
        self.wire_share = admission.LoopShare(
            share=self.settings.max_wire_work_share, burst_s=self.settings.wire_work_burst_s
        )

    @asynccontextmanager
    async def admitted(self, rpc: str) -> AsyncIterator[None]:
        """Hold a turn for ``rpc``'s work for the body of the block, if the request is to be
        served at all (:mod:`actors.admission`). Work other than liveness keeps its turn until
        its reply is encoded: do all of it, reply included, inside the block.

        Raises:
            DeadlineExceeded: the client's deadline passed before the work could start.
            Busy: ``rpc`` is not liveness work and the replica is overloaded
                (:func:`actors.admission.shed_reason`), or it waited ``max_admission_wait_s``
                for its turn in vain (:func:`actors.admission.turn_timeout_reason`); nothing
                was done.
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
            reason = admission.turn_timeout_reason(
                rpc,
                waited_s=trio.current_time() - arrived,
                in_progress=self.gate.held_other,
                cp_id=self.cp_id,
                settings=self.settings,
            )
            self._record_shed(rpc, reason)
            raise Busy(reason)
        try:
            yield
        finally:
            self.gate.release(liveness=liveness)

    @asynccontextmanager
    async def connection(self, rpc: str) -> AsyncIterator[PgConnection]:
        """A connection for ``rpc``'s database work; use inside :meth:`admitted` (a turn
        guarantees a free connection).

        The body runs to its end even if the client gives up meanwhile (bounded by
        ``settings.answer_timeout_s``), so its connection is never terminated for that. The
        time from asking for the connection to the block's end is observed as
        ``stockade_ingest_stage_seconds{stage="database"}`` (the turn's wait as ``"turn"``).

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
            raise DeadlineExceeded(f"{rpc}: the client's deadline passed before the request could start")

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
        "Admission", rule 4); counts the queue again when the count is older than
        ``pending_count_max_age_s``. Use inside :meth:`admitted`.

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
