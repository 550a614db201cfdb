"""Ingest's heartbeat handlers: a worker's heartbeat recorded alone or in a group of
liveness-only heartbeats (docs/design.md, "Grouped heartbeats"), and the interval and the
dead_after the statements tell workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import trio

from actors import queries, validation
from actors.heartbeat_group import GroupAnswer, GroupedBeat, GroupMember, HeartbeatGrouper, UsageRow
from actors.heartbeat_policy import (
    MAX_DEAD_AFTER_MS,
    MAX_SENT_US,
    HeartbeatPolicy,
    HeartbeatWaits,
    default_policy,
)
from actors.ingest_gate import DEADLINE_PASSED
from actors.ingest_jobs import JobHandlers
from actors.ingest_replies import check_outcomes, outcome_arrays, outcome_log_keys
from protocol import pb
from runtime import identifiers, log, metrics
from runtime.aio import require_worker, rpc_deadline
from runtime.errors import DeadlineExceeded, InvalidArgument
from runtime.settings.leader import ReconcilerSettings

USAGE_VALUE_TOP = 2**31 - 1
"""A usage sample's ``cpu_millis``, ``memory_mb`` or ``span_ms`` above this (the database's
``integer``) is recorded as this: a measure, not a request, is kept rather than refused."""


def usage_rows(request: pb.HeartbeatRequest) -> tuple[UsageRow, ...]:
    """The usage samples of ``request`` as rows, values capped at :data:`USAGE_VALUE_TOP`.

    Raises:
        InvalidArgument: more samples than one per running assignment plus one.
    """
    most = len(request.running_assignment_ids) + 1
    if len(request.usage) > most:
        raise InvalidArgument(
            "usage",
            f"{len(request.usage)} samples",
            f"must hold at most one per running assignment plus one ({most})",
        )
    top = USAGE_VALUE_TOP
    return tuple(
        (u.assignment_id, min(u.cpu_millis, top), min(u.memory_mb, top), min(u.span_ms, top))
        for u in request.usage
    )


async def record_usage(conn: Any, worker_id: str, usage: Sequence[UsageRow]) -> None:
    """Record ``usage``, the samples of a heartbeat of ``worker_id`` recorded alone and alive, in
    one statement on ``conn`` (none without samples)."""
    if usage:
        columns = [list(column) for column in zip(*usage, strict=True)]
        await conn.execute(queries.RECORD_USAGE, [worker_id] * len(usage), *columns)


def recorded_answer(
    row: Any, newer: tuple[str | None, str | None, int | None], *, skipped: bool = False
) -> GroupAnswer:
    """The answer to a heartbeat from its statement's ``row``; ``newer``: the agent run id,
    address and incarnation of a registration that took the worker's id over (None each: none)."""
    said = {
        k: row[k]
        for k in ("alive", "current_epoch", "database_unix_s", "told_interval_ms", "told_dead_after_ms")
    }
    return GroupAnswer(
        **said,
        skipped=skipped,
        stop_assignment_ids=tuple(row["stop_assignment_ids"]),
        newer_agent_run_id=newer[0],
        newer_address=newer[1],
        newer_incarnation=newer[2],
    )


@attrs.define
class HeartbeatHandlers(JobHandlers):
    """The Heartbeat RPC of :class:`actors.ingest.ControlPlaneService`; ``told_default``: the
    interval and the dead_after told to workers while the leader chose none."""

    told_default: HeartbeatPolicy = attrs.field(factory=lambda: default_policy(ReconcilerSettings()))
    heartbeats_recorded: int = 0
    """Heartbeats this service recorded (the denominator of its measured heartbeat cost)."""
    heartbeat_waits: HeartbeatWaits = attrs.field(factory=HeartbeatWaits)
    """The waits its heartbeats reported (their 99th percentile goes with its presence)."""
    heartbeat_group: HeartbeatGrouper | None = None
    """Records liveness-only heartbeats in groups (started by :class:`actors.ingest.Ingest` when
    ``settings.heartbeat_group_wait_s`` > 0); None: each heartbeat in a statement of its own."""

    def _told_defaults(self) -> tuple[int, int]:
        """The interval and the dead_after (ms) the statements tell while no policy was chosen."""
        return self.told_default.interval_ms, self.told_default.dead_after_ms

    def _told(self, row: Any) -> tuple[int, int]:
        """A registration reply's ``heartbeat_interval_ms`` and ``dead_after_ms`` from the row of
        the statement that recorded what it tells (None: no interval, the defaults' dead_after)."""
        if row is None:
            return 0, self.told_default.dead_after_ms
        return row["interval_ms"], row["dead_after_ms"]

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        """Record a worker's heartbeat: liveness, running confirmations, finished outcomes; a
        liveness-only one in a group (:attr:`heartbeat_group`) unless its worker's row is locked.

        Raises:
            InvalidArgument: a field out of range (nothing is stored).
            DeadlineExceeded, DatabaseUnavailable, Busy: as :meth:`database` (for a group's
                member, what its group's statement raised).
        """
        worker_id = identifiers.check_id(request.worker_id, field="worker_id")
        require_worker("heartbeat", worker_id)
        validation.check_incarnation(request.incarnation)
        hold_ms = validation.check_restart_hold_ms(request.restart_hold_ms)
        finished = list(request.finished)
        check_outcomes(finished)
        usage = usage_rows(request)
        reply = None
        if not finished and not hold_ms:
            reply = await self._grouped_heartbeat(worker_id, request, usage)
        if reply is None:
            reply = await self._heartbeat_alone(worker_id, request, finished, hold_ms, usage)
        if not reply.reregister:
            # Only a recorded heartbeat of a live incarnation says a wait.
            self.heartbeat_waits.add(trio.current_time(), worker_id, request.waited_ms)
        return reply

    async def _grouped_heartbeat(
        self, worker_id: str, request: pb.HeartbeatRequest, usage: tuple[UsageRow, ...]
    ) -> pb.HeartbeatReply | None:
        """A liveness-only heartbeat recorded in a group; None: no group runs, or the group
        skipped it (its worker's row was locked), so it goes in a statement of its own."""
        if self.heartbeat_group is not None:
            deadline = rpc_deadline()
            self._check_deadline("heartbeat", deadline)
            answer = await self.heartbeat_group.record(
                GroupedBeat(
                    deadline=deadline,
                    worker_id=worker_id,
                    incarnation=request.incarnation,
                    running_assignment_ids=tuple(request.running_assignment_ids),
                    sent_us=min(request.sent_monotonic_us, MAX_SENT_US),
                    dead_after_in_use_ms=min(request.dead_after_in_use_ms, MAX_DEAD_AFTER_MS),
                    usage=usage,
                )
            )
            if not answer.skipped:
                return self._heartbeat_reply(worker_id, request.incarnation, answer)
        return None

    async def run_heartbeat_group(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Gather liveness-only heartbeats into groups (:attr:`heartbeat_group`) until cancelled."""
        grouper = HeartbeatGrouper(
            record_group=self.record_heartbeat_group,
            wait_s=self.settings.heartbeat_group_wait_s,
            max_heartbeats=self.settings.heartbeat_group_max,
            groups_in_flight=self.settings.heartbeat_groups_in_flight,
        )
        self.heartbeat_group = grouper
        try:
            await grouper.run(task_status=task_status)
        finally:
            self.heartbeat_group = None

    async def record_heartbeat_group(self, members: Sequence[GroupMember]) -> list[GroupAnswer | Exception]:
        """Record a group of liveness-only heartbeats (worker ids distinct), and the usage samples
        of those recorded alive, in one statement: one answer per member, in order; a member whose
        deadline passed or whose handler stopped waiting before the group got its connection is
        not recorded (answer: DeadlineExceeded).

        Raises:
            DatabaseUnavailable, Busy: as :meth:`database`; nothing of the group was recorded.
        """
        answers: list[GroupAnswer | Exception] = []
        async with self.database("heartbeat") as conn:
            now = trio.current_time()
            left_out = [m.withdrawn or m.beat.deadline <= now for m in members]
            live = [m.beat for m, out in zip(members, left_out, strict=True) if not out]
            running_ids = [a for beat in live for a in beat.running_assignment_ids]
            running_members = [n for n, beat in enumerate(live, start=1) for _ in beat.running_assignment_ids]
            used = [(n, *sample) for n, beat in enumerate(live, start=1) for sample in beat.usage]
            rows = []
            if live:
                rows = await conn.fetch(
                    queries.RECORD_HEARTBEATS_AND_USAGE if used else queries.RECORD_HEARTBEATS,
                    [b.worker_id for b in live],
                    [b.incarnation for b in live],
                    [b.sent_us for b in live],
                    [b.dead_after_in_use_ms for b in live],
                    running_ids,
                    running_members,
                    *self._told_defaults(),
                    *([list(column) for column in zip(*used, strict=True)] if used else []),
                )
        recorded = iter(rows)
        for out in left_out:
            if out:
                metrics.INGEST_EXPIRED_REQUESTS.labels("heartbeat").inc()
                answers.append(DeadlineExceeded(f"heartbeat: {DEADLINE_PASSED}"))
                continue
            row = next(recorded)
            newer = (row["newer_agent_run_id"], row["newer_address"], row["newer_incarnation"])
            answers.append(recorded_answer(row, newer, skipped=row["skipped"]))
        return answers

    async def _heartbeat_alone(
        self,
        worker_id: str,
        request: pb.HeartbeatRequest,
        finished: list[pb.JobOutcome],
        hold_ms: int,
        usage: tuple[UsageRow, ...],
    ) -> pb.HeartbeatReply:
        """Record one heartbeat in a statement of its own (``record_heartbeat`` in schema.sql: one
        round trip, one transaction), and its usage samples and restart hold after it."""
        held: object = None
        async with self.database("heartbeat") as conn:
            row = await conn.fetchrow(
                queries.HEARTBEAT,
                worker_id,
                request.incarnation,
                list(request.running_assignment_ids),
                *outcome_arrays(finished),
                min(request.sent_monotonic_us, MAX_SENT_US),
                min(request.dead_after_in_use_ms, MAX_DEAD_AFTER_MS),
                *self._told_defaults(),
            )
            assert row is not None
            if row["alive"]:
                await record_usage(conn, worker_id, usage)
            newer: tuple[str | None, str | None, int | None] = (None, None, None)
            found = None
            if not row["alive"]:
                found = await conn.fetchrow(queries.NEWER_REGISTRATION, worker_id, request.incarnation)
            if found is not None:
                newer = (found["agent_run_id"] or "", found["address"], found["incarnation"])
            if hold_ms and row["alive"]:
                # A planned restart's hold, recorded after the heartbeat committed: it counts from
                # this statement's now(), after the heartbeat's send (docs/design.md, "Restarts").
                held = await conn.fetchval(
                    queries.SET_RESTART_HOLD, worker_id, request.incarnation, hold_ms / 1000
                )
        if finished:
            # Only a heartbeat that carries outcomes logs: liveness-only ones stay silent.
            log.get("ingest").info(
                "outcomes recorded",
                worker_id=worker_id,
                incarnation=request.incarnation,
                epoch=row["current_epoch"],
                **outcome_log_keys(finished),
            )
        answer = recorded_answer(row, newer)
        reply = self._heartbeat_reply(worker_id, request.incarnation, answer)
        if hold_ms and answer.alive:
            reply.restart_hold_granted = held is not None
            log.get("ingest").info(
                "restart hold recorded" if held is not None else "restart hold not recorded",
                worker_id=worker_id,
                incarnation=request.incarnation,
                hold_s=hold_ms / 1000,
            )
        return reply

    def _heartbeat_reply(self, worker_id: str, incarnation: int, answer: GroupAnswer) -> pb.HeartbeatReply:
        """The reply to a recorded heartbeat (alone or in a group), counted in the metrics."""
        if not answer.alive:
            metrics.HEARTBEATS_REREGISTER.inc()
            reply = pb.HeartbeatReply(
                epoch=answer.current_epoch, reregister=True, database_unix_s=answer.database_unix_s
            )
            if answer.newer_incarnation is not None:  # another registration took the id over
                reply.newer_agent_run_id = answer.newer_agent_run_id or ""
                reply.newer_address = answer.newer_address or ""
                reply.newer_incarnation = answer.newer_incarnation
            return reply
        metrics.HEARTBEATS_RECORDED.inc()
        self.heartbeats_recorded += 1
        if answer.stop_assignment_ids:
            log.get("ingest").info(
                "worker told to stop assignments",
                worker_id=worker_id,
                incarnation=incarnation,
                epoch=answer.current_epoch,
                assignment_ids=list(answer.stop_assignment_ids),
            )
        return pb.HeartbeatReply(
            epoch=answer.current_epoch,
            stop_assignment_ids=list(answer.stop_assignment_ids),
            database_unix_s=answer.database_unix_s,
            heartbeat_interval_ms=answer.told_interval_ms,
            dead_after_ms=answer.told_dead_after_ms,
        )
