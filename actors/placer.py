"""The placer: every round (100 ms), pending jobs x free capacity -> best fit -> fenced commit -> dispatch.

A round reads the live workers (with their allocation) and the pending jobs, decides with the
pure :func:`actors.placement.place`, asks the ledger to commit all placements in one fenced
transaction, and only then hands each worker its batch to the dispatcher (invariant 4: nothing
is sent before it is committed). A refused commit (Deposed) or a failed one sends nothing;
a commit whose outcome is unknown (connection lost at COMMIT) sends nothing either, and the
reconciler re-sends what did commit once it finds it unconfirmed.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any, Protocol

import attrs
import trio

from actors import queries
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    Dispatch,
    DispatcherInbox,
    LedgerInbox,
    Placement,
    WorkerRef,
)
from actors.placement import PendingJob, WorkerRoom, place
from actors.role import RoleView
from runtime import faults, log
from runtime.aio import PgConnection
from runtime.errors import DatabaseUnavailable, Deposed
from runtime.reply import Reply
from runtime.settings import PlacerSettings


@attrs.frozen(kw_only=True)
class LiveWorker:
    """A live worker as the placer reads it."""

    ref: WorkerRef
    room: WorkerRoom


@attrs.frozen(kw_only=True)
class WaitingJob:
    """A pending job and the reason currently stored for it."""

    job: PendingJob
    reason: str


class PlacerStore(Protocol):
    """What a round reads."""

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        """Alive workers heard from within ``fresh_s`` seconds (database time)."""

    async def pending_jobs(self, limit: int) -> list[WaitingJob]:
        """Up to ``limit`` pending jobs, highest priority and oldest first."""


@attrs.define
class PgPlacerStore:
    """:class:`PlacerStore` on a read connection of its own."""

    database_url: str
    application_name: str
    _conn: PgConnection | None = None

    async def _connection(self) -> PgConnection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await PgConnection.connect(
                self.database_url,
                server_settings={"application_name": self.application_name, "statement_timeout": "5000"},
            )
        return self._conn

    async def live_workers(self, fresh_s: float) -> list[LiveWorker]:
        rows = await (await self._connection()).fetch(queries.LIVE_WORKERS, fresh_s)
        return [
            LiveWorker(
                ref=WorkerRef(worker_id=r["id"], address=r["address"], incarnation=int(r["incarnation"])),
                room=WorkerRoom(
                    worker_id=r["id"],
                    cpu_millis=int(r["cpu_millis"]),
                    memory_mb=int(r["memory_mb"]),
                    cpu_allocated_millis=int(r["cpu_allocated_millis"]),
                    memory_allocated_mb=int(r["memory_allocated_mb"]),
                ),
            )
            for r in rows
        ]

    async def pending_jobs(self, limit: int) -> list[WaitingJob]:
        rows = await (await self._connection()).fetch(queries.PENDING_JOBS, limit)
        return [
            WaitingJob(
                job=PendingJob(
                    job_id=int(r["id"]),
                    cpu_millis=int(r["cpu_millis"]),
                    memory_mb=int(r["memory_mb"]),
                    priority=int(r["priority"]),
                ),
                reason=r["reason"],
            )
            for r in rows
        ]

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


@attrs.define
class RoundStats:
    """Durations of recent rounds that did work, in seconds (trio clock), newest last."""

    durations_s: deque[float] = attrs.field(factory=lambda: deque(maxlen=10_000))
    pending_counts: deque[int] = attrs.field(factory=lambda: deque(maxlen=10_000))
    placements: int = 0


@attrs.define
class Placer:
    """The actor."""

    settings: PlacerSettings
    store: PlacerStore
    role: RoleView
    ledger: trio.MemorySendChannel[LedgerInbox]
    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    stats: RoundStats = attrs.field(factory=RoundStats)
    _log: Any = attrs.field(factory=lambda: log.get("placer"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run rounds every ``round_interval_s`` while leader, until cancelled."""
        await self.role.query()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.role.follow)
            task_status.started()
            interval = self.settings.round_interval_s
            next_round = trio.current_time()
            while True:
                if self.role.epoch is None:
                    await self.role.elected.wait()
                    next_round = trio.current_time()
                await trio.sleep_until(next_round)
                epoch = self.role.epoch
                if epoch is not None:
                    try:
                        await self.round(epoch)
                    except Deposed as exc:
                        self._log.info("round refused: deposed", epoch=exc.epoch, epoch_seen=exc.epoch_seen)
                    except DatabaseUnavailable as exc:
                        self._log.warning("round failed", error=str(exc))
                next_round = max(next_round + interval, trio.current_time())

    async def round(self, epoch: int) -> tuple[CommittedAssignment, ...]:
        """One round under ``epoch``: read, decide, commit, dispatch. Returns what committed.

        Raises:
            Deposed: the ledger refused the commit; nothing was sent.
            DatabaseUnavailable: reading or committing failed; nothing was sent.
        """
        started = trio.current_time()
        s = self.settings
        workers = await self.store.live_workers(s.worker_fresh_s)
        waiting = await self.store.pending_jobs(s.max_jobs_per_round)
        if not waiting:
            return ()
        by_id = {w.ref.worker_id: w for w in workers}
        plan = place([w.job for w in waiting], [w.room for w in workers], policy=s.policy)
        sizes = {w.job.job_id: w.job for w in waiting}
        placements = tuple(
            Placement(
                job_id=job_id,
                worker_id=worker_id,
                incarnation=by_id[worker_id].ref.incarnation,
                cpu_millis=sizes[job_id].cpu_millis,
                memory_mb=sizes[job_id].memory_mb,
            )
            for job_id, worker_id in plan.placements
        )
        placed = plan.placements_by_job
        reasons = tuple(
            (w.job.job_id, plan.unschedulable.get(w.job.job_id, ""))
            for w in waiting
            if plan.unschedulable.get(w.job.job_id, "") != w.reason and w.job.job_id not in placed
        )
        if not placements and not reasons:
            return ()
        await faults.hit("placer.before_commit")
        reply: Reply[tuple[CommittedAssignment, ...]] = Reply()
        await self.ledger.send(
            CommitPlacements(epoch=epoch, placements=placements, reasons=reasons, reply=reply)
        )
        committed = await reply.wait()
        batches: dict[str, list[CommittedAssignment]] = defaultdict(list)
        for assignment in committed:
            batches[assignment.worker_id].append(assignment)
        for worker_id, batch in batches.items():
            ref = by_id[worker_id].ref
            await self.dispatcher.send(Dispatch(epoch=epoch, worker=ref, assignments=tuple(batch)))
        elapsed = trio.current_time() - started
        self.stats.durations_s.append(elapsed)
        self.stats.pending_counts.append(len(waiting))
        self.stats.placements += len(committed)
        if committed:
            self._log.debug(
                "round", placed=len(committed), pending=len(waiting), elapsed_ms=round(elapsed * 1000, 2)
            )
        return committed
