"""The ledger: the one connection that runs fenced writes, and owns the epoch share lock.

Every decision is a request to :class:`Ledger` carrying the epoch the decider acts under; it
runs in a fenced transaction (placements: one fenced statement) of at most
``max_rows_per_fenced_write`` rows, and a refused one is recorded and reported to the lease
keeper. docs/design.md, "How decisions are fenced" and "The ledger".
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import attrs
import trio

from actors import queries
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    DeclareDeadWorkers,
    EndAssignments,
    EndDrainedAssignments,
    EndOrphanedAssignments,
    EndPreemptedAssignments,
    EpochSuperseded,
    FireScheduleSlots,
    LeaseInbox,
    LedgerInbox,
    Placement,
    PreemptAssignments,
    ReconcileResult,
    RecordedSlot,
    RecordWorkerHealth,
    SetHeartbeatPolicy,
    SettledJobs,
    SettleWaitingJobs,
)
from runtime import faults, log, metrics
from runtime.aio import PgConnection, ReconnectingConnection
from runtime.errors import DatabaseUnavailable, InvalidArgument, StaleEpoch
from runtime.reply import Reply
from runtime.settings.fields import session_ms
from runtime.settings.leader import LedgerSettings

T = TypeVar("T")

# Test-only switch for the negative control (tests/e2e/unfenced_launcher.py flips it): with
# fencing off a frozen old leader's write commits when it wakes. Not reachable from the CLI,
# the settings or the environment.
_FENCING_ENABLED = True


def _unit_rows(placements: Sequence[Placement]) -> tuple[list[int], list[str], list[str]]:
    """The device units of ``placements`` as queries.COMMIT_PLACEMENTS' parameters $8-$10: one
    (job id, resource, unit) row per unit, as three parallel lists."""
    rows = [(p.job_id, name, unit) for p in placements for name, ids in p.units for unit in ids]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def decision_log_keys(message: LedgerInbox) -> dict[str, Any]:
    """The ids a fenced decision is about, as log keys (``job_ids``, ``worker_ids``,
    ``assignment_ids``; runtime/log.py: a line about a batch lists its ids)."""
    match message:
        case CommitPlacements(placements=placements):
            return {
                "job_ids": [p.job_id for p in placements],
                "worker_ids": [p.worker_id for p in placements],
            }
        case DeclareDeadWorkers(workers=workers):
            return {"worker_ids": [worker_id for worker_id, _ in workers]}
        case (
            EndAssignments(assignment_ids=ids)
            | EndDrainedAssignments(assignment_ids=ids)
            | EndPreemptedAssignments(assignment_ids=ids)
        ):
            return {"assignment_ids": list(ids)}
        case PreemptAssignments(preemptions=preemptions):
            return {
                "assignment_ids": [a for a, _ in preemptions],
                "job_ids": sorted({job_id for _, job_id in preemptions}),
            }
        case SettleWaitingJobs(release=release, cancel=cancel):
            return {"job_ids": [*release, *(job_id for job_id, _ in cancel)]}
        case RecordWorkerHealth(changes=changes):
            return {"worker_ids": [worker_id for worker_id, *_ in changes]}
        case FireScheduleSlots(firings=firings):
            return {"schedule_ids": [f.schedule_id for f in firings]}
        case _:
            return {}


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
            "idle_in_transaction_session_timeout": session_ms(s.idle_in_transaction_timeout_s),
            # The longest a fenced statement holds the lease's share lock, row-lock waits included.
            "statement_timeout": session_ms(s.statement_timeout_s),
            "lock_timeout": session_ms(s.statement_timeout_s),
            # Plan each prepared statement once (planning the placement statement cost 0.4 ms).
            "plan_cache_mode": "force_generic_plan",
            # A statement whose client dropped it is ended by the server within this long.
            "client_connection_check_interval": session_ms(s.client_check_interval_s),
        }
        if not _FENCING_ENABLED:
            server_settings["idle_in_transaction_session_timeout"] = "0"
        self._db = ReconnectingConnection(
            self.database_url,
            server_settings,
            owner="ledger",
            # A fenced write is bounded as a whole by _answer_deadline; this bounds the other calls.
            call_timeout_s=s.answer_timeout_s,
        )

    async def _connection(self) -> PgConnection:
        return await self._db.get()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve fenced-write requests one at a time until cancelled; starts once connected
        (waiting with backoff while the database is unreachable)."""
        await self._db.wait_connected()
        task_status.started()
        try:
            async for message in self.inbox:
                await self._handle(message)
        finally:
            await self._db.close()

    def _decision(self, message: LedgerInbox) -> tuple[str, int, str]:
        """What ``message`` asks the ledger to write: a short description (``stale_writes``,
        logs), its rows, and the field that holds them."""
        match message:
            case CommitPlacements(placements=placements, reasons=reasons):
                return (
                    f"commit {len(placements)} placements",
                    len(placements) + len(reasons),
                    "placements + reasons",
                )
            case DeclareDeadWorkers(max_ended=rows):
                return "declare dead workers", rows, "max_ended"
            case EndOrphanedAssignments(max_ended=rows):
                return "end orphaned assignments", rows, "max_ended"
            case EndAssignments(assignment_ids=ids, reason=reason):
                return f"end {len(ids)} assignments ({reason})", len(ids), "assignment_ids"
            case EndDrainedAssignments(assignment_ids=ids):
                return f"end {len(ids)} assignments (drained)", len(ids), "assignment_ids"
            case PreemptAssignments(preemptions=preemptions):
                return f"preempt {len(preemptions)} assignments", len(preemptions), "preemptions"
            case EndPreemptedAssignments(assignment_ids=ids):
                return f"end {len(ids)} assignments (preempted)", len(ids), "assignment_ids"
            case SettleWaitingJobs(release=release, cancel=cancel):
                rows = len(release) + len(cancel)
                return f"settle {rows} waiting jobs", rows, "release + cancel"
            case RecordWorkerHealth(changes=changes):
                return f"record the health of {len(changes)} workers", len(changes), "changes"
            case SetHeartbeatPolicy():
                return "set the heartbeat interval", 1, "policy"
            case FireScheduleSlots(firings=firings):
                rows = sum(len(f.decisions) + len(f.cancel_job_ids) for f in firings)
                return f"record {rows} schedule slots", rows, "firings"

    async def _handle(self, message: LedgerInbox) -> None:
        reply: Reply[Any] = message.reply
        what, rows, field = self._decision(message)
        limit = self.settings.max_rows_per_fenced_write
        if rows > limit:
            # A decider's bug: answered, not run; the asker fails loudly.
            rule = f"must be <= max_rows_per_fenced_write = {limit} (slice the decision into several writes)"
            too_large = InvalidArgument(field, rows, rule)
            self._log.error("fenced write refused: too large", error=str(too_large))
            reply.fail(too_large)
            return
        # The decision's kind (fault points, metrics) is its message's name in snake case, and
        # its writes the method of that name.
        kind = re.sub(r"(?<!^)(?=[A-Z])", "_", type(message).__name__).lower()
        write = getattr(self, f"_{kind}")
        try:
            result = await self.fenced(
                message.epoch,
                what,
                lambda c: write(c, message),
                kind=kind,
                log_keys=decision_log_keys(message),
                # Placements carry the fence in their one statement.
                statement=isinstance(message, CommitPlacements),
            )
        except (StaleEpoch, DatabaseUnavailable) as exc:
            reply.fail(exc)
        except Exception as exc:
            # Any other failure (a deadlock abort, a constraint) is answered too, so the asker
            # never waits forever; then the ledger restarts with a fresh connection.
            reply.fail(DatabaseUnavailable(f"{what} failed: {exc!r}"))
            raise
        else:
            reply.set(result)

    async def fenced(
        self,
        epoch: int,
        what: str,
        op: Callable[[PgConnection], Awaitable[Any]],
        *,
        kind: str = "write",
        log_keys: Mapping[str, Any] | None = None,
        statement: bool = False,
    ) -> Any:
        """Run ``op`` so that it commits only if ``epoch`` is current: in one transaction that
        checks the epoch under ``FOR KEY SHARE`` first or, with ``statement``, as one statement
        that carries the fence itself and returns (the epoch it saw, its result).

        Args:
            what: a short description, for ``stale_writes`` and logs.
            kind: names the fault points ``ledger.<kind>.before_transaction`` and
                ``ledger.<kind>.after_epoch_check``, or ``ledger.<kind>.before_statement``.
            log_keys: the decision's ids, for the line that logs a refusal.

        Returns:
            ``op``'s result (with ``statement``: the second of its pair).

        Raises:
            StaleEpoch: ``epoch`` is not the current one, or the session ended while a newer
                epoch took over; nothing was written.
            DatabaseUnavailable: the connection failed; the writes may or may not have
                committed (callers treat the outcome as unknown).
        """
        conn = await self._connection()
        await faults.hit(f"ledger.{kind}.before_{'statement' if statement else 'transaction'}")
        try:
            with self._answer_deadline(what):
                if not statement:
                    return await self._transaction(conn, epoch, op, kind)
                seen, result = await op(conn)
            if seen != epoch and _FENCING_ENABLED:
                raise StaleEpoch(epoch, seen)
            return result
        except StaleEpoch as exc:
            await self._refused(
                epoch, exc.epoch_seen, what, kind=kind, reason="stale_epoch", log_keys=log_keys
            )
            raise
        except DatabaseUnavailable:
            await self._deposed_if_superseded(epoch, what, kind, log_keys)
            raise

    async def _transaction(
        self, conn: PgConnection, epoch: int, op: Callable[[PgConnection], Awaitable[T]], kind: str
    ) -> T:
        async def body(conn: PgConnection) -> T:
            seen = int(
                await conn.fetchval(queries.FENCE_EPOCH if _FENCING_ENABLED else queries.CURRENT_EPOCH)
            )
            await faults.hit("ledger.after_epoch_check")
            await faults.hit(f"ledger.{kind}.after_epoch_check")
            if seen != epoch and _FENCING_ENABLED:
                raise StaleEpoch(epoch, seen)
            result = await op(conn)
            await faults.hit("ledger.before_commit")
            return result

        # Run again whole, fence included, when a schema change invalidated a cached statement.
        return await conn.run_in_transaction(body, what=f"ledger.{kind}")

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

    async def _deposed_if_superseded(
        self, epoch: int, what: str, kind: str, log_keys: Mapping[str, Any] | None = None
    ) -> None:
        """After a connection loss: if a newer epoch holds the lease, record the write as
        refused and raise StaleEpoch (from None); else return, leaving the outcome unknown."""
        seen_after = await self._current_epoch()
        if seen_after is not None and seen_after != epoch:
            await self._refused(
                epoch,
                seen_after,
                f"{what} (session ended)",
                kind=kind,
                reason="session_ended",
                log_keys=log_keys,
            )
            raise StaleEpoch(epoch, seen_after) from None

    async def _current_epoch(self) -> int | None:
        try:
            conn = await self._connection()
            return int(await conn.fetchval(queries.CURRENT_EPOCH))
        except DatabaseUnavailable:
            return None

    async def _refused(
        self,
        epoch: int,
        epoch_seen: int,
        what: str,
        *,
        kind: str,
        reason: str,
        log_keys: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a refused write (``stale_writes``, ``stockade_fenced_writes_refused{write=kind,
        reason}``, a log line with the decision's ``log_keys``) and tell the lease keeper that
        ``epoch_seen`` superseded ``epoch``."""
        metrics.FENCED_WRITES_REFUSED.labels(kind, reason).inc()
        self._log.warning(
            "fenced write refused", epoch=epoch, epoch_seen=epoch_seen, what=what, **(log_keys or {})
        )
        try:
            conn = await self._connection()
            await conn.execute(queries.RECORD_STALE_WRITE, self.cp_id, epoch, epoch_seen, what)
        except DatabaseUnavailable as exc:
            self._log.warning("could not record refused write", error=str(exc))
        with suppress(trio.WouldBlock):
            self.lease_inbox.send_nowait(EpochSuperseded(epoch=epoch, epoch_seen=epoch_seen))

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
            *_unit_rows(message.placements),
        )
        placed = [row for row in rows if row["assignment_id"] is not None]
        units = {p.job_id: p.units for p in message.placements if p.units}
        argvs: dict[int, dict[str, Any]] = {}
        commands = [int(row["id"]) for row in placed if row["has_payload"]]
        if commands:
            # After the statement, which holds no lock any more: a leader frozen while this
            # large answer comes in keeps no takeover waiting.
            argvs = {int(r["id"]): dict(r) for r in await conn.fetch(queries.JOB_ARGVS, commands)}
        committed = tuple(
            CommittedAssignment(
                assignment_id=int(row["assignment_id"]),
                job_id=int(row["id"]),
                worker_id=row["worker_id"],
                incarnation=int(row["incarnation"]),
                epoch=message.epoch,
                spec=queries.job_spec_of({**row, **argvs.get(int(row["id"]), {"argv": None, "image": None})}),
                array_index=argvs.get(int(row["id"]), {}).get("array_index"),
                array_id=argvs.get(int(row["id"]), {}).get("array_id"),
                placed_before=bool(row["placed_before"]),
                units=units.get(int(row["id"]), ()),
                gang=queries.gang_seat_of(argvs.get(int(row["id"]), {})),
            )
            for row in placed
        )
        return int(rows[0]["epoch_seen"]), committed

    async def _declare_dead_workers(self, conn: PgConnection, message: DeclareDeadWorkers) -> ReconcileResult:
        dead = []
        if message.workers:
            dead = await conn.fetch(
                queries.DECLARE_DEAD_WORKERS,
                message.epoch,
                message.dead_after_s,
                [worker_id for worker_id, _ in message.workers],
                [incarnation for _, incarnation in message.workers],
                message.silence_floor_unix_s,
            )
        orphans = await self._end_orphaned_assignments(conn, message)
        return attrs.evolve(orphans, dead_worker_ids=tuple(r["id"] for r in dead))

    async def _end_orphaned_assignments(
        self, conn: PgConnection, message: DeclareDeadWorkers | EndOrphanedAssignments
    ) -> ReconcileResult:
        row = await conn.fetchrow(
            queries.END_ORPHANED_ASSIGNMENTS,
            message.epoch,
            list(message.requeue_backoff_caps_s),
            message.max_ended,
        )
        assert row is not None
        return ReconcileResult(
            dead_worker_ids=(),
            requeued_job_ids=tuple(int(i) for i in row["requeued_ids"]),
            orphaned_assignment_ids=tuple(int(i) for i in row["ended_ids"]),
            orphaned_job_ids=tuple(int(i) for i in row["ended_job_ids"]),
            orphaned_worker_ids=tuple(row["ended_worker_ids"]),
            more_orphans=bool(row["more"]),
        )

    async def _end_assignments(self, conn: PgConnection, message: EndAssignments) -> tuple[int, ...]:
        if message.timed_out:
            rows = await conn.fetch(
                queries.END_TIMED_OUT_ASSIGNMENTS, message.epoch, list(message.assignment_ids)
            )
            return tuple(int(r["id"]) for r in rows)
        rows = await conn.fetch(
            queries.END_CANCELLED_ASSIGNMENTS,
            message.epoch,
            list(message.assignment_ids),
            message.reason,
            message.requeue,
            list(message.requeue_backoff_caps_s),
        )
        return tuple(int(r["id"]) for r in rows)

    async def _settle_waiting_jobs(self, conn: PgConnection, message: SettleWaitingJobs) -> SettledJobs:
        row = await conn.fetchrow(
            queries.SETTLE_WAITING_JOBS,
            list(message.release),
            [job_id for job_id, _ in message.cancel],
            [dependency for _, dependency in message.cancel],
        )
        assert row is not None
        return SettledJobs(
            released_job_ids=tuple(int(i) for i in row["released_ids"]),
            cancelled_job_ids=tuple(int(i) for i in row["cancelled_ids"]),
        )

    async def _end_drained_assignments(
        self, conn: PgConnection, message: EndDrainedAssignments
    ) -> tuple[int, ...]:
        rows = await conn.fetch(queries.END_DRAINED_ASSIGNMENTS, message.epoch, list(message.assignment_ids))
        return tuple(int(r["id"]) for r in rows)

    async def _preempt_assignments(self, conn: PgConnection, message: PreemptAssignments) -> tuple[int, ...]:
        rows = await conn.fetch(
            queries.PREEMPT_ASSIGNMENTS,
            [assignment_id for assignment_id, _ in message.preemptions],
            [job_id for _, job_id in message.preemptions],
            message.cooldown_s,
        )
        return tuple(sorted(int(r["id"]) for r in rows))

    async def _end_preempted_assignments(
        self, conn: PgConnection, message: EndPreemptedAssignments
    ) -> tuple[int, ...]:
        rows = await conn.fetch(
            queries.END_PREEMPTED_ASSIGNMENTS, message.epoch, list(message.assignment_ids)
        )
        requeued = {
            int(r["job_id"]): int(r["preempted_by"])
            for r in rows
            if r["requeued"] and r["preempted_by"] is not None  # None: a gang's stop
        }
        if requeued:
            await conn.execute(
                queries.PREEMPTED_REASONS,
                list(requeued),
                [f"preempted by job {by}" for by in requeued.values()],
            )
        return tuple(int(r["id"]) for r in rows)

    async def _record_worker_health(
        self, conn: PgConnection, message: RecordWorkerHealth
    ) -> tuple[tuple[str, bool], ...]:
        changes = message.changes
        rows = await conn.fetch(
            queries.RECORD_WORKER_HEALTH,
            [worker_id for worker_id, _, _, _ in changes],
            [version for _, version, _, _ in changes],
            [unhealthy for _, _, unhealthy, _ in changes],
            [reason for _, _, _, reason in changes],
            message.probe_after_s,
        )
        return tuple(sorted((r["id"], bool(r["unhealthy"])) for r in rows))

    async def _set_heartbeat_policy(self, conn: PgConnection, message: SetHeartbeatPolicy) -> None:
        p = message.policy
        await conn.execute(
            queries.SET_HEARTBEAT_POLICY,
            message.epoch,
            p.interval_ms,
            p.dead_after_ms,
            p.workers,
            p.cpu_per_heartbeat_us,
            p.reason,
        )

    async def _fire_schedule_slots(
        self, conn: PgConnection, message: FireScheduleSlots
    ) -> tuple[RecordedSlot, ...]:
        recorded: list[RecordedSlot] = []
        for firing in message.firings:
            decisions = firing.decisions
            rows = await conn.fetch(
                queries.FIRE_SCHEDULE_SLOTS,
                firing.schedule_id,
                firing.slots_through,
                [d.slot_at for d in decisions],
                [d.fire for d in decisions],
                [d.reason for d in decisions],
                message.epoch,
                list(firing.cancel_job_ids),
            )
            recorded += (
                RecordedSlot(
                    schedule_id=firing.schedule_id,
                    slot_at=r["slot_at"],
                    job_id=None if r["job_id"] is None else int(r["job_id"]),
                )
                for r in rows
            )
        return tuple(recorded)
