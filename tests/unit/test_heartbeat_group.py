"""The heartbeat grouper (actors.heartbeat_group) on trio's mock clock, against a scripted
stand-in for the group's database statement."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
import trio
import trio.testing

from actors.heartbeat_group import GroupAnswer, GroupedBeat, GroupMember, HeartbeatGrouper
from runtime.errors import DatabaseBusy, DatabaseUnavailable, InvalidArgument
from runtime.settings.control_plane import IngestSettings

WAIT_S = 0.005


@attrs.define
class ScriptedStatement:
    """Records each group (its start time and its beats); answers each member with its own
    running ids as the ids to stop and the group's number as the epoch, after ``delay_s``;
    raises ``error`` instead while it is set."""

    delay_s: float = 0.0
    error: Exception | None = None
    groups: list[tuple[float, list[GroupedBeat]]] = attrs.field(factory=list)

    async def __call__(self, members: Sequence[GroupMember]) -> list[GroupAnswer | Exception]:
        beats = [m.beat for m in members]
        self.groups.append((trio.current_time(), list(beats)))
        number = len(self.groups)
        await trio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return [
            GroupAnswer(alive=True, stop_assignment_ids=b.running_assignment_ids, current_epoch=number)
            for b in beats
        ]


def beat(worker: str, *running: int) -> GroupedBeat:
    return GroupedBeat(worker_id=worker, incarnation=1, running_assignment_ids=running)


async def started(
    nursery: trio.Nursery, statement: ScriptedStatement, max_heartbeats: int = 500
) -> HeartbeatGrouper:
    grouper = HeartbeatGrouper(record_group=statement, wait_s=WAIT_S, max_heartbeats=max_heartbeats)
    await nursery.start(grouper.run)
    return grouper


async def test_a_group_closes_its_wait_after_its_first_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats arriving within the wait after the first are recorded together, when the
    wait ends; one arriving after it opens the next group."""
    statement = ScriptedStatement()
    answers: dict[str, GroupAnswer] = {}

    async def send(at_s: float, b: GroupedBeat) -> None:
        await trio.sleep_until(at_s)
        answers[b.worker_id] = await grouper.record(b)

    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        start = trio.current_time()
        async with trio.open_nursery() as senders:
            for offset_s, worker in ((0.0, "w-1"), (0.002, "w-2"), (0.004, "w-3"), (0.006, "w-4")):
                senders.start_soon(send, start + offset_s, beat(worker))
        nursery.cancel_scope.cancel()
    assert [(at - start, sorted(b.worker_id for b in bs)) for at, bs in statement.groups] == [
        (pytest.approx(WAIT_S), ["w-1", "w-2", "w-3"]),
        (pytest.approx(0.006 + WAIT_S), ["w-4"]),
    ]
    assert {w: a.current_epoch for w, a in answers.items()} == {"w-1": 1, "w-2": 1, "w-3": 1, "w-4": 2}


async def test_a_full_group_is_recorded_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """A group that reaches its most members is recorded without waiting; the rest go to
    the next group, which waits as any."""
    statement = ScriptedStatement()
    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement, max_heartbeats=3)
        start = trio.current_time()
        async with trio.open_nursery() as senders:
            for n in range(5):
                senders.start_soon(grouper.record, beat(f"w-{n}"))
        nursery.cancel_scope.cancel()
    assert [(at - start, len(bs)) for at, bs in statement.groups] == [(0.0, 3), (pytest.approx(WAIT_S), 2)]


async def test_each_waiter_gets_its_own_row(autojump_clock: trio.testing.MockClock) -> None:
    """Members of one group each get the answer for their own heartbeat."""
    statement = ScriptedStatement(delay_s=0.003)
    answers: dict[str, tuple[int, ...]] = {}

    async def send(b: GroupedBeat) -> None:
        answers[b.worker_id] = (await grouper.record(b)).stop_assignment_ids

    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        async with trio.open_nursery() as senders:
            senders.start_soon(send, beat("w-1", 11, 12))
            senders.start_soon(send, beat("w-2"))
            senders.start_soon(send, beat("w-3", 31))
        nursery.cancel_scope.cancel()
    assert len(statement.groups) == 1
    assert answers == {"w-1": (11, 12), "w-2": (), "w-3": (31,)}


async def test_a_failed_statement_fails_every_member_with_its_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every member of a group whose statement failed gets that error (type and message);
    the next group is recorded as usual."""
    statement = ScriptedStatement(error=DatabaseBusy("canceling statement due to lock timeout"))
    errors: list[BaseException] = []

    async def send(b: GroupedBeat) -> None:
        try:
            await grouper.record(b)
        except DatabaseBusy as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        async with trio.open_nursery() as senders:
            for n in range(3):
                senders.start_soon(send, beat(f"w-{n}"))
        statement.error = None
        answer = await grouper.record(beat("w-0"))
        nursery.cancel_scope.cancel()
    assert [str(e) for e in errors] == ["canceling statement due to lock timeout"] * 3
    assert len({id(e) for e in errors}) == 3  # each member raises its own copy
    assert answer.alive and answer.current_epoch == 2


async def test_a_cancelled_waiter_does_not_break_its_group(autojump_clock: trio.testing.MockClock) -> None:
    """A handler that stops waiting (its client gave up) while its group's statement runs
    leaves the others their answers, and its heartbeat is recorded with the group."""
    statement = ScriptedStatement(delay_s=0.05)
    answers: dict[str, GroupAnswer] = {}

    async def send(b: GroupedBeat) -> None:
        answers[b.worker_id] = await grouper.record(b)

    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        async with trio.open_nursery() as senders:
            senders.start_soon(send, beat("w-1"))
            with trio.move_on_after(WAIT_S + 0.01) as gave_up:  # inside the statement
                async with trio.open_nursery() as impatient:
                    impatient.start_soon(send, beat("w-2"))
                    senders.start_soon(send, beat("w-3"))
        nursery.cancel_scope.cancel()
    assert gave_up.cancelled_caught
    assert [sorted(b.worker_id for b in bs) for _, bs in statement.groups] == [["w-1", "w-2", "w-3"]]
    assert sorted(answers) == ["w-1", "w-3"]


async def test_a_second_heartbeat_of_a_worker_waits_for_the_next_group(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker appears once per group: its second heartbeat is recorded by the next group,
    and both are answered."""
    statement = ScriptedStatement()
    answers: list[int] = []

    async def send(b: GroupedBeat) -> None:
        answers.append((await grouper.record(b)).current_epoch)

    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        async with trio.open_nursery() as senders:
            senders.start_soon(send, beat("w-1", 1))
            senders.start_soon(send, beat("w-2"))
            senders.start_soon(send, beat("w-1", 2))
        nursery.cancel_scope.cancel()
    assert [sorted(b.worker_id for b in bs) for _, bs in statement.groups] == [["w-1", "w-2"], ["w-1"]]
    first_of_w1 = [b.running_assignment_ids for b in statement.groups[0][1] if b.worker_id == "w-1"]
    assert sorted([*first_of_w1, statement.groups[1][1][0].running_assignment_ids]) == [(1,), (2,)]
    assert sorted(answers) == [1, 1, 2]


async def test_members_of_a_group_cut_short_by_a_stop_are_told_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """When the grouper stops (the ingest stops) while a group's statement runs, its
    members are answered with DatabaseUnavailable rather than left waiting."""
    statement = ScriptedStatement(delay_s=1.0)
    errors: list[str] = []

    async def send(b: GroupedBeat) -> None:
        try:
            await grouper.record(b)
        except DatabaseUnavailable as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as senders, trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        senders.start_soon(send, beat("w-1"))
        await trio.sleep(WAIT_S + 0.1)
        nursery.cancel_scope.cancel()
    assert errors == ["heartbeat not recorded: the ingest is stopping"]


async def test_a_waiter_that_gives_up_before_its_group_closes_is_left_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler that stops waiting before its group's statement starts is not recorded (a
    request that has not started does no database work); the rest of its group is."""
    statement = ScriptedStatement()
    async with trio.open_nursery() as nursery:
        grouper = await started(nursery, statement)
        async with trio.open_nursery() as senders:
            senders.start_soon(grouper.record, beat("w-1"))
            with trio.move_on_after(WAIT_S / 2):
                await grouper.record(beat("w-2"))
        nursery.cancel_scope.cancel()
    assert [[b.worker_id for b in bs] for _, bs in statement.groups] == [["w-1"]]


def test_settings_refuse_a_group_wait_or_size_past_their_limits() -> None:
    """A group wait above 0.1 s or a group of more than 5000 heartbeats is refused, naming the
    setting, its value and the limit; a wait of 0 (no groups) is taken."""
    with pytest.raises(InvalidArgument, match=r"heartbeat_group_wait_s must be at most 0\.1 s .*got 0\.2"):
        IngestSettings(heartbeat_group_wait_s=0.2)
    with pytest.raises(InvalidArgument, match=r"heartbeat_group_max must be at most 5000, got 5001"):
        IngestSettings(heartbeat_group_max=5001)
    assert IngestSettings(heartbeat_group_wait_s=0).heartbeat_group_wait_s == 0


async def test_a_group_keeps_gathering_while_every_statement_slot_is_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With one statement at a time, heartbeats arriving while it runs join the next group
    until it ends, past that group's own wait: under load groups grow rather than queue."""
    statement = ScriptedStatement(delay_s=0.050)
    answers: dict[str, int] = {}

    async def send(at_s: float, b: GroupedBeat) -> None:
        await trio.sleep_until(at_s)
        answers[b.worker_id] = (await grouper.record(b)).current_epoch

    async with trio.open_nursery() as nursery:
        grouper = HeartbeatGrouper(
            record_group=statement, wait_s=WAIT_S, max_heartbeats=500, groups_in_flight=1
        )
        await nursery.start(grouper.run)
        start = trio.current_time()
        async with trio.open_nursery() as senders:
            for offset_s, worker in ((0.0, "w-1"), (0.010, "w-2"), (0.030, "w-3"), (0.060, "w-4")):
                senders.start_soon(send, start + offset_s, beat(worker))
        nursery.cancel_scope.cancel()
    assert [(at - start, sorted(b.worker_id for b in bs)) for at, bs in statement.groups] == [
        (pytest.approx(WAIT_S), ["w-1"]),
        (pytest.approx(WAIT_S + 0.050), ["w-2", "w-3"]),
        (pytest.approx(WAIT_S + 0.100), ["w-4"]),
    ]
    assert answers == {"w-1": 1, "w-2": 2, "w-3": 2, "w-4": 3}
