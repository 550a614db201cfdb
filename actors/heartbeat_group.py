"""The heartbeat grouper: liveness-only heartbeats gathered for a few milliseconds and recorded
together, in one statement (``record_heartbeats`` in schema.sql; docs/design.md, "Grouped
heartbeats").

A handler hands its heartbeat over (:meth:`HeartbeatGrouper.record`) and waits for its own
answer. A group closes ``wait_s`` after its first heartbeat, or at ``max_heartbeats``, and is
recorded in a task of its own; while ``groups_in_flight`` statements run, the next keeps
gathering, so a saturated database gets fewer, larger statements. A worker appears at most once
in a group. When the statement fails, every member gets (a copy of) its error.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Awaitable, Callable, Sequence

import attrs
import trio

from runtime import metrics
from runtime.errors import DatabaseUnavailable

__all__ = ["GroupAnswer", "GroupMember", "GroupedBeat", "HeartbeatGrouper", "RecordGroup", "UsageRow"]

UsageRow = tuple[int, int, int, int]
"""One usage sample of a heartbeat: (assignment id, 0 for all the worker's jobs; cpu_millis;
memory_mb; span_ms), as the protocol's ``UsageSample``."""


@attrs.frozen(kw_only=True)
class GroupedBeat:
    """One liveness-only heartbeat, as a group records it."""

    worker_id: str
    incarnation: int
    running_assignment_ids: tuple[int, ...] = ()
    sent_us: int = 0
    """Its send time (the worker's monotonic clock, µs)."""
    dead_after_in_use_ms: int = 0
    """The dead_after the worker's fence is derived from, in ms (0: none)."""
    usage: tuple[UsageRow, ...] = ()
    """Its usage samples, recorded after it in the group's statements when it was alive."""
    deadline: float = math.inf
    """Trio time at which its client stops waiting for the answer (inf: never)."""


@attrs.frozen(kw_only=True)
class GroupAnswer:
    """What the group's statement recorded for one member."""

    alive: bool
    """False: the incarnation is not alive (re-register)."""
    skipped: bool = False
    """Its worker's row was locked by another transaction: nothing recorded (record it alone)."""
    stop_assignment_ids: tuple[int, ...] = ()
    current_epoch: int = 0
    database_unix_s: float = 0.0
    told_interval_ms: int = 0
    told_dead_after_ms: int = 0
    newer_agent_run_id: str | None = None
    newer_address: str | None = None
    newer_incarnation: int | None = None
    """The registration that replaced a member told to re-register (None: none)."""


RecordGroup = Callable[[Sequence["GroupMember"]], Awaitable[Sequence[GroupAnswer | Exception]]]
"""Records a group (worker ids distinct) and returns one answer per member, in order: its row,
or the error of a member left out (withdrawn, or its deadline passed, when the statement began)."""


@attrs.define
class GroupMember:
    """One heartbeat waiting in a group, and its answer once settled."""

    beat: GroupedBeat
    withdrawn: bool = False
    """Its handler stopped waiting: a group that has not started recording leaves it out."""
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: GroupAnswer | None = None
    error: BaseException | None = None

    def settle(self, answer: GroupAnswer | None, error: BaseException | None) -> None:
        if not self.done.is_set():
            self.answer, self.error = answer, error
            self.done.set()


@attrs.define
class HeartbeatGrouper:
    """Gathers heartbeats into groups and records each group with one ``record_group`` call
    (see the module docstring); ``queue_heartbeats``: heartbeats waiting for a group beyond
    which :meth:`record` waits for room."""

    record_group: RecordGroup
    wait_s: float
    max_heartbeats: int
    queue_heartbeats: int = 10_000
    groups_in_flight: int = 2
    _send: trio.MemorySendChannel[GroupMember] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[GroupMember] = attrs.field(init=False)
    _slots: trio.Semaphore = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[GroupMember](self.queue_heartbeats)
        self._slots = trio.Semaphore(self.groups_in_flight)

    async def record(self, beat: GroupedBeat) -> GroupAnswer:
        """Record ``beat`` with the next group; its own answer once the group's statement ended.

        Raises:
            whatever ``record_group`` raised for the group (a copy: the error of each member is
            its own); DatabaseUnavailable when the grouper stopped before recording it.
        """
        member = GroupMember(beat)
        try:
            await self._send.send(member)
            await member.done.wait()
        except BaseException:
            member.withdrawn = True
            raise
        if member.error is not None:
            raise member.error
        assert member.answer is not None
        return member.answer

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Gather and record groups until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            carried: list[GroupMember] = []
            while True:
                group, carried = await self._gather(carried)
                nursery.start_soon(self._record, group)

    async def _gather(self, carried: list[GroupMember]) -> tuple[list[GroupMember], list[GroupMember]]:
        """The next group and the heartbeats left for the one after it, those ``carried`` over
        from the last first. Returns holding one statement slot, which :meth:`_record` gives back."""
        group: list[GroupMember] = []
        workers: set[str] = set()
        later: list[GroupMember] = []

        def take(member: GroupMember) -> None:
            if member.withdrawn:
                return
            if member.beat.worker_id in workers or len(group) >= self.max_heartbeats:
                later.append(member)
            else:
                group.append(member)
                workers.add(member.beat.worker_id)

        for member in carried:
            take(member)
        while not group:
            take(await self._receive.receive())
        with trio.move_on_after(self.wait_s):
            while len(group) < self.max_heartbeats:
                take(await self._receive.receive())

        async def take_more() -> None:
            # Until a statement slot frees (the caller cancels this then): receiving is
            # cancel-safe, so no heartbeat is lost.
            while len(group) < self.max_heartbeats:
                take(await self._receive.receive())
            await trio.sleep_forever()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(take_more)
            await self._slots.acquire()
            nursery.cancel_scope.cancel()
        return group, later

    async def _record(self, gathered: list[GroupMember]) -> None:
        """Record ``gathered`` (its withdrawn members left out), holding one of the statement
        slots its gathering acquired, and give the slot back."""
        group = [member for member in gathered if not member.withdrawn]
        try:
            if not group:
                return
            metrics.HEARTBEAT_GROUP_HEARTBEATS.observe(len(group))
            try:
                answers = await self.record_group(group)
                if len(answers) != len(group):
                    raise RuntimeError(f"a group of {len(group)} heartbeats got {len(answers)} answers")
            except Exception as exc:
                metrics.HEARTBEAT_GROUP_STATEMENTS.labels("failed").inc()
                for member in group:
                    member.settle(None, _own_copy(exc))
                return
            metrics.HEARTBEAT_GROUP_STATEMENTS.labels("recorded").inc()
            for member, answer in zip(group, answers, strict=True):
                if isinstance(answer, Exception):
                    member.settle(None, answer)
                else:
                    member.settle(answer, None)
        finally:
            # Cancelled (the ingest stops): nobody is left waiting.
            for member in group:
                member.settle(None, DatabaseUnavailable("heartbeat not recorded: the ingest is stopping"))
            self._slots.release()


def _own_copy(exc: Exception) -> Exception:
    """A copy of ``exc`` for one member (raising one instance in many tasks would pile every
    task's traceback onto it); ``exc`` itself when it does not copy faithfully."""
    try:
        mine = copy.copy(exc)
    except Exception:
        return exc
    if type(mine) is not type(exc) or str(mine) != str(exc):
        return exc
    mine.__cause__ = exc.__cause__
    mine.__traceback__ = exc.__traceback__
    return mine
