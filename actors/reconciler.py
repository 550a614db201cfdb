"""The reconciler: the leader's repair pass, every ``reconcile_interval_s`` (1 s).

Each pass, while leader:

1. Dead workers: every alive worker whose last recorded heartbeat (by any replica, judged by
   database time) is older than ``dead_after_s`` is declared dead in a fenced transaction that
   re-checks the rule, ends its active assignments as lost and requeues their jobs. The same
   transaction ends assignments addressed to an incarnation that is no longer current (the
   agent restarted or re-registered: its old jobs were stopped). A new leader therefore never
   judges from timers of its own: failovers cause no false deaths.
2. Unconfirmed assignments (committed, not yet listed by a heartbeat): re-sent to their worker
   after ``redispatch_after_s`` (at once on the first pass after an election: the previous
   leader may have died between commit and send); the worker deduplicates by id. After
   ``cancel_unconfirmed_after_s`` they are cancelled on the worker and, once it acknowledges,
   ended and requeued.
3. Jobs a user cancelled: cancelled on their worker; once acknowledged, ended as cancelled.

A job is placed again only after its active assignment has ended (invariant 6).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import attrs
import trio

from actors import queries
from actors.ledger import payload_of
from actors.messages import (
    CancelOnWorker,
    CommittedAssignment,
    DeclareDeadWorkers,
    Dispatch,
    DispatcherInbox,
    EndAssignments,
    LedgerInbox,
    ReconcileResult,
    WorkerRef,
)
from actors.role import RoleView
from runtime import log
from runtime.aio import PgConnection, ReconnectingConnection
from runtime.errors import DatabaseUnavailable, Deposed
from runtime.reply import Reply
from runtime.settings import ReconcilerSettings


@attrs.frozen(kw_only=True)
class HeartbeatAge:
    """An alive worker incarnation and the age of its last recorded heartbeat (database time)."""

    worker_id: str
    incarnation: int
    age_s: float


@attrs.frozen(kw_only=True)
class Delivery:
    """An active assignment, where it goes, and how long ago it was committed."""

    assignment: CommittedAssignment
    worker: WorkerRef
    age_s: float


class ReconcilerStore(Protocol):
    """What a pass reads."""

    async def heartbeat_ages(self) -> list[HeartbeatAge]: ...

    async def unconfirmed(self) -> list[Delivery]: ...

    async def cancel_requested(self) -> list[Delivery]: ...


def dead_workers(ages: Iterable[HeartbeatAge], dead_after_s: float) -> tuple[tuple[str, int], ...]:
    """The (worker_id, incarnation) pairs silent for longer than ``dead_after_s`` seconds."""
    return tuple(sorted((a.worker_id, a.incarnation) for a in ages if a.age_s > dead_after_s))


def _delivery(row: Any) -> Delivery:
    return Delivery(
        assignment=CommittedAssignment(
            assignment_id=int(row["assignment_id"]),
            job_id=int(row["job_id"]),
            worker_id=row["worker_id"],
            incarnation=int(row["incarnation"]),
            epoch=int(row["epoch"]),
            payload=payload_of(row),
        ),
        worker=WorkerRef(
            worker_id=row["worker_id"], address=row["address"], incarnation=int(row["incarnation"])
        ),
        age_s=float(row["age_s"]),
    )


@attrs.define
class PgReconcilerStore:
    """:class:`ReconcilerStore` on a read connection of its own."""

    database_url: str
    application_name: str
    _db: ReconnectingConnection = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._db = ReconnectingConnection(
            self.database_url, {"application_name": self.application_name, "statement_timeout": "5000"}
        )

    async def _connection(self) -> PgConnection:
        return await self._db.get()

    async def heartbeat_ages(self) -> list[HeartbeatAge]:
        rows = await (await self._connection()).fetch(queries.HEARTBEAT_AGES)
        return [
            HeartbeatAge(worker_id=r["id"], incarnation=int(r["incarnation"]), age_s=float(r["age_s"]))
            for r in rows
        ]

    async def unconfirmed(self) -> list[Delivery]:
        return [_delivery(r) for r in await (await self._connection()).fetch(queries.UNCONFIRMED_ASSIGNMENTS)]

    async def cancel_requested(self) -> list[Delivery]:
        rows = await (await self._connection()).fetch(queries.CANCEL_REQUESTED_ASSIGNMENTS)
        return [_delivery(r) for r in rows]

    async def close(self) -> None:
        await self._db.close()


def _by_worker(deliveries: Sequence[Delivery]) -> dict[WorkerRef, list[Delivery]]:
    groups: dict[WorkerRef, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        groups[d.worker].append(d)
    return groups


@attrs.define
class Reconciler:
    """The actor."""

    settings: ReconcilerSettings
    store: ReconcilerStore
    role: RoleView
    ledger: trio.MemorySendChannel[LedgerInbox]
    dispatcher: trio.MemorySendChannel[DispatcherInbox]
    _log: Any = attrs.field(factory=lambda: log.get("reconciler"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run a pass every ``reconcile_interval_s`` while leader, until cancelled."""
        await self.role.query()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.role.follow)
            task_status.started()
            interval = self.settings.reconcile_interval_s
            last_epoch: int | None = None
            next_pass = trio.current_time()
            while True:
                if self.role.epoch is None:
                    await self.role.elected.wait()
                    next_pass = trio.current_time()
                await trio.sleep_until(next_pass)
                epoch = self.role.epoch
                if epoch is not None:
                    try:
                        await self.reconcile(epoch, first_pass=epoch != last_epoch)
                        last_epoch = epoch
                    except Deposed as exc:
                        self._log.info("pass refused: deposed", epoch=exc.epoch, epoch_seen=exc.epoch_seen)
                    except DatabaseUnavailable as exc:
                        self._log.warning("pass failed", error=str(exc))
                next_pass = max(next_pass + interval, trio.current_time())

    async def _ask_ledger(self, message_of: Any) -> Any:
        reply: Reply[Any] = Reply()
        await self.ledger.send(message_of(reply))
        return await reply.wait()

    async def reconcile(self, epoch: int, *, first_pass: bool = False) -> ReconcileResult:
        """One pass under ``epoch``. Returns what the fenced dead-worker step changed.

        Raises:
            Deposed: the ledger refused a write.
            DatabaseUnavailable: a read or write failed.
        """
        s = self.settings
        candidates = dead_workers(await self.store.heartbeat_ages(), s.dead_after_s)
        result: ReconcileResult = await self._ask_ledger(
            lambda reply: DeclareDeadWorkers(
                epoch=epoch, workers=candidates, dead_after_s=s.dead_after_s, reply=reply
            )
        )
        if result.dead_worker_ids or result.orphaned_assignment_ids:
            self._log.warning(
                "reconciled",
                dead_workers=list(result.dead_worker_ids),
                requeued_jobs=len(result.requeued_job_ids),
                ended_assignments=len(result.orphaned_assignment_ids),
            )

        unconfirmed = await self.store.unconfirmed()
        withdraw = [d for d in unconfirmed if d.age_s >= s.cancel_unconfirmed_after_s]
        resend = [
            d
            for d in unconfirmed
            if d.age_s < s.cancel_unconfirmed_after_s and (first_pass or d.age_s >= s.redispatch_after_s)
        ]
        for worker, group in _by_worker(resend).items():
            await self.dispatcher.send(
                Dispatch(epoch=epoch, worker=worker, assignments=tuple(d.assignment for d in group))
            )
        cancelled = await self.store.cancel_requested()
        async with trio.open_nursery() as nursery:
            for worker, group in _by_worker(withdraw).items():
                nursery.start_soon(self._cancel, epoch, worker, group, True, "unconfirmed")
            for worker, group in _by_worker(cancelled).items():
                nursery.start_soon(self._cancel, epoch, worker, group, False, "cancelled_by_user")
        return result

    async def _cancel(
        self, epoch: int, worker: WorkerRef, group: list[Delivery], requeue: bool, reason: str
    ) -> None:
        ids = tuple(d.assignment.assignment_id for d in group)
        reply: Reply[tuple[int, ...]] = Reply()
        await self.dispatcher.send(
            CancelOnWorker(epoch=epoch, worker=worker, assignment_ids=ids, reply=reply)
        )
        acknowledged = await reply.wait()
        if not acknowledged:
            return
        ended = await self._ask_ledger(
            lambda reply: EndAssignments(
                epoch=epoch, assignment_ids=acknowledged, requeue=requeue, reason=reason, reply=reply
            )
        )
        self._log.info("ended assignments", worker_id=worker.worker_id, reason=reason, count=len(ended))
