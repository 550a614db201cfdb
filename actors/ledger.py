"""The ledger: the one connection that runs fenced writes, and owns the epoch share lock.

Every decision (placements, dead-worker declarations, ended assignments) is a request to this
actor carrying the epoch the decider acts under. The reconciler's decisions run as::

    BEGIN
    SELECT epoch FROM lease WHERE id = 1 FOR SHARE   -- same transaction as the writes
      epoch != ours -> ROLLBACK, Deposed
    <the decision's writes>
    COMMIT

A placer round's placements, the hot path, run as one statement that is its own transaction:
the same ``SELECT epoch FROM lease WHERE id = 1 FOR SHARE`` inside it gates every row it
writes, and it returns the epoch it saw (``queries.COMMIT_PLACEMENTS``): one round trip instead
of four, and no moment at which the share lock waits on this process.

The share lock makes a takeover's ``UPDATE lease`` wait until the fenced transaction ends, so
there is no window between the check and the writes. The session runs with
``idle_in_transaction_session_timeout`` (2 s by default): a leader frozen inside a transaction
loses its session, the takeover proceeds, and the COMMIT it sends on waking fails. A leader
frozen before it sends a placement statement sends it on waking under its old epoch, and the
statement writes nothing.

A refused write (stale epoch at the check, or a session ended under a newer epoch) is recorded
in ``stale_writes`` in a separate transaction and reported to the lease keeper.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import attrs
import trio

from actors import queries
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    DeclareDeadWorkers,
    EndAssignments,
    EpochSuperseded,
    JobPayload,
    LeaseInbox,
    LedgerInbox,
    ReconcileResult,
)
from runtime import faults, log
from runtime.aio import PgConnection, ReconnectingConnection
from runtime.errors import DatabaseUnavailable, Deposed
from runtime.settings import LedgerSettings

T = TypeVar("T")

# Test-only switch for the negative control (tests/e2e/unfenced_launcher.py flips it in a
# control-plane process it starts): with fencing off there is no epoch check and no share
# lock, no idle-in-transaction timeout, and placements claim jobs whatever their state, so a
# frozen old leader's write commits when it wakes. Not reachable from the CLI, the settings or
# the environment.
_FENCING_ENABLED = True


def payload_of(row: Any) -> JobPayload:
    """A :class:`JobPayload` from a row with name, cpu_millis, memory_mb, priority, sleep_ms, argv."""
    argv = row["argv"]
    return JobPayload(
        name=row["name"],
        cpu_millis=int(row["cpu_millis"]),
        memory_mb=int(row["memory_mb"]),
        priority=int(row["priority"]),
        sleep_ms=None if row["sleep_ms"] is None else int(row["sleep_ms"]),
        argv=None if argv is None else tuple(argv),
    )


@attrs.define
class Ledger:
    """The actor. ``lease_inbox`` receives :class:`EpochSuperseded` when a write is refused."""

    cp_id: str
    database_url: str
    settings: LedgerSettings
    inbox: trio.MemoryReceiveChannel[LedgerInbox]
    lease_inbox: trio.MemorySendChannel[LeaseInbox]
    _db: ReconnectingConnection = attrs.field(init=False)
    _log: Any = attrs.field(factory=lambda: log.get("ledger"))

    def __attrs_post_init__(self) -> None:
        s = self.settings
        server_settings = {
            "application_name": f"stockade {self.cp_id} ledger",
            "idle_in_transaction_session_timeout": str(int(s.idle_in_transaction_timeout_s * 1000)),
            "statement_timeout": str(int(s.statement_timeout_s * 1000)),
            # Never sit on the lease's share lock waiting for a row a frozen replica holds.
            "lock_timeout": "1000",
            # Plan each prepared statement once: its plan does not depend on the arrays passed,
            # and planning the placement statement again every round cost about 0.4 ms.
            "plan_cache_mode": "force_generic_plan",
            # A statement whose client dropped it (answer deadline, lost connection) is ended
            # by the server within this long instead of running on to its end.
            "client_connection_check_interval": "250",
        }
        if not _FENCING_ENABLED:
            server_settings["idle_in_transaction_session_timeout"] = "0"
        self._db = ReconnectingConnection(self.database_url, server_settings)

    async def _connection(self) -> PgConnection:
        return await self._db.get()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve fenced-write requests one at a time until cancelled."""
        await self._connection()
        task_status.started()
        try:
            async for message in self.inbox:
                await self._handle(message)
        finally:
            await self._db.close()

    async def _handle(self, message: LedgerInbox) -> None:
        result: Any
        try:
            match message:
                case CommitPlacements(epoch=epoch, reply=reply):
                    what = f"commit {len(message.placements)} placements"
                    result = await self.fenced_statement(
                        epoch, what, lambda c: self._commit_placements(c, message), kind="commit_placements"
                    )
                case DeclareDeadWorkers(epoch=epoch, reply=reply):
                    what = "declare dead workers"
                    result = await self.fenced(
                        epoch, what, lambda c: self._declare_dead(c, message), kind="declare_dead_workers"
                    )
                case EndAssignments(epoch=epoch, reply=reply):
                    what = f"end {len(message.assignment_ids)} assignments ({message.reason})"
                    result = await self.fenced(
                        epoch, what, lambda c: self._end_assignments(c, message), kind="end_assignments"
                    )
        except (Deposed, DatabaseUnavailable) as exc:
            reply.fail(exc)
        except Exception as exc:
            # Any other failure (a deadlock abort, a constraint) is answered too, so the asker
            # never waits forever; then the ledger restarts with a fresh connection.
            reply.fail(DatabaseUnavailable(f"{what} failed: {exc!r}"))
            raise
        else:
            reply.set(result)

    async def fenced(
        self, epoch: int, what: str, op: Callable[[PgConnection], Awaitable[T]], *, kind: str = "write"
    ) -> T:
        """Run ``op`` in one transaction that commits only if ``epoch`` is current.

        Args:
            epoch: the epoch the decision was made under.
            what: a short description, for ``stale_writes`` and logs.
            op: the decision's writes, given the connection inside the transaction.
            kind: names the fault point ``ledger.<kind>.after_epoch_check`` (tests park one
                kind of decision there; ``ledger.after_epoch_check`` catches every kind).

        Raises:
            Deposed: ``epoch`` is not the current one (checked under ``FOR SHARE``), or the
                session ended while a newer epoch took over.
            DatabaseUnavailable: the connection failed; the writes may or may not have
                committed (callers treat the outcome as unknown).
        """
        conn = await self._connection()
        try:
            with self._answer_deadline(what):
                return await self._transaction(conn, epoch, op, kind)
        except Deposed as exc:
            await self._refused(epoch, exc.epoch_seen, what)
            raise
        except DatabaseUnavailable:
            await self._deposed_if_superseded(epoch, what)
            raise

    async def _transaction(
        self, conn: PgConnection, epoch: int, op: Callable[[PgConnection], Awaitable[T]], kind: str
    ) -> T:
        async with conn.transaction():
            seen = int(
                await conn.fetchval(queries.FENCE_EPOCH if _FENCING_ENABLED else queries.CURRENT_EPOCH)
            )
            await faults.hit("ledger.after_epoch_check")
            await faults.hit(f"ledger.{kind}.after_epoch_check")
            if seen != epoch and _FENCING_ENABLED:
                raise Deposed(epoch, seen)
            result = await op(conn)
            await faults.hit("ledger.before_commit")
        return result

    @contextmanager
    def _answer_deadline(self, what: str) -> Iterator[None]:
        """Give up on a write unanswered after ``answer_timeout_s``: cancelling it drops the
        connection (see :class:`runtime.aio.PgConnection`), and the outcome is unknown.

        Raises:
            DatabaseUnavailable: the deadline passed.
        """
        limit_s = self.settings.answer_timeout_s
        with trio.move_on_after(limit_s) as scope:
            yield
        if scope.cancelled_caught:
            raise DatabaseUnavailable(f"{what}: no answer within {limit_s:g} s, connection dropped")

    async def fenced_statement(
        self,
        epoch: int,
        what: str,
        op: Callable[[PgConnection], Awaitable[tuple[int, T]]],
        *,
        kind: str = "write",
    ) -> T:
        """Run ``op``: one statement that carries the fence itself and returns the epoch it saw
        under ``FOR SHARE`` with its result; it wrote nothing unless that epoch is ``epoch``.

        Args:
            epoch: the epoch the decision was made under.
            what: a short description, for ``stale_writes`` and logs.
            op: sends the statement outside any transaction; returns (epoch seen, result).
            kind: names the fault point ``ledger.<kind>.before_statement``.

        Raises:
            Deposed: the statement saw a newer epoch and wrote nothing.
            DatabaseUnavailable: the connection failed; the statement may or may not have
                committed (callers treat the outcome as unknown).
        """
        conn = await self._connection()
        await faults.hit(f"ledger.{kind}.before_statement")
        try:
            with self._answer_deadline(what):
                seen, result = await op(conn)
        except DatabaseUnavailable:
            await self._deposed_if_superseded(epoch, what)
            raise
        if seen != epoch and _FENCING_ENABLED:
            await self._refused(epoch, seen, what)
            raise Deposed(epoch, seen)
        return result

    async def _deposed_if_superseded(self, epoch: int, what: str) -> None:
        """After a connection loss: if a newer epoch holds the lease, record the write as
        refused and raise Deposed (from None); else return, leaving the outcome unknown."""
        seen_after = await self._current_epoch()
        if seen_after is not None and seen_after != epoch:
            await self._refused(epoch, seen_after, f"{what} (session ended)")
            raise Deposed(epoch, seen_after) from None

    async def _current_epoch(self) -> int | None:
        try:
            conn = await self._connection()
            return int(await conn.fetchval(queries.CURRENT_EPOCH))
        except DatabaseUnavailable:
            return None

    async def _refused(self, epoch: int, epoch_seen: int, what: str) -> None:
        self._log.warning("fenced write refused", epoch=epoch, epoch_seen=epoch_seen, what=what)
        try:
            conn = await self._connection()
            await conn.execute(queries.RECORD_STALE_WRITE, self.cp_id, epoch, epoch_seen, what)
        except DatabaseUnavailable as exc:
            self._log.warning("could not record refused write", error=str(exc))
        try:
            self.lease_inbox.send_nowait(EpochSuperseded(epoch=epoch, epoch_seen=epoch_seen))
        except trio.WouldBlock:
            pass

    # ------------------------------------------------------------ the decisions' writes

    async def _commit_placements(
        self, conn: PgConnection, message: CommitPlacements
    ) -> tuple[int, tuple[CommittedAssignment, ...]]:
        rows = await conn.fetch(
            queries.COMMIT_PLACEMENTS,
            [p.job_id for p in message.placements],
            [p.worker_id for p in message.placements],
            [p.incarnation for p in message.placements],
            message.epoch,
            _FENCING_ENABLED,
            [job_id for job_id, _ in message.reasons],
            [reason for _, reason in message.reasons],
        )
        placed = [row for row in rows if row["assignment_id"] is not None]
        argvs: dict[int, tuple[str, ...]] = {}
        commands = [int(row["id"]) for row in placed if row["has_argv"]]
        if commands:
            # After the statement, which holds no lock any more: a leader frozen while this
            # large answer comes in keeps no takeover waiting.
            argvs = {int(r["id"]): tuple(r["argv"]) for r in await conn.fetch(queries.JOB_ARGVS, commands)}
        committed = tuple(
            CommittedAssignment(
                assignment_id=int(row["assignment_id"]),
                job_id=int(row["id"]),
                worker_id=row["worker_id"],
                incarnation=int(row["incarnation"]),
                epoch=message.epoch,
                payload=attrs.evolve(payload_of({**row, "argv": None}), argv=argvs.get(int(row["id"]))),
            )
            for row in placed
        )
        return int(rows[0]["epoch_seen"]), committed

    async def _declare_dead(self, conn: PgConnection, message: DeclareDeadWorkers) -> ReconcileResult:
        dead = []
        if message.workers:
            dead = await conn.fetch(
                queries.DECLARE_DEAD_WORKERS,
                message.epoch,
                message.dead_after_s,
                [worker_id for worker_id, _ in message.workers],
                [incarnation for _, incarnation in message.workers],
            )
        row = await conn.fetchrow(
            queries.END_ORPHANED_ASSIGNMENTS, message.epoch, list(message.requeue_backoff_caps_s)
        )
        assert row is not None
        return ReconcileResult(
            dead_worker_ids=tuple(r["id"] for r in dead),
            requeued_job_ids=tuple(int(i) for i in row["requeued_ids"]),
            orphaned_assignment_ids=tuple(int(i) for i in row["ended_ids"]),
        )

    async def _end_assignments(self, conn: PgConnection, message: EndAssignments) -> tuple[int, ...]:
        rows = await conn.fetch(
            queries.END_CANCELLED_ASSIGNMENTS,
            message.epoch,
            list(message.assignment_ids),
            message.reason,
            message.requeue,
            list(message.requeue_backoff_caps_s),
        )
        return tuple(int(r["id"]) for r in rows)
