"""The scheduler actor on a mock clock (actors/scheduler.py): it wakes at the next slot, fires
it through the ledger under its epoch, and stops when deposed; the database's clock (here tied
to the mock clock) decides what is due."""

from __future__ import annotations

import datetime as dt

import attrs
import trio
import trio.testing

from actors.messages import (
    Deposed,
    Elected,
    FireScheduleSlots,
    LedgerInbox,
    QueryRole,
    RecordedSlot,
    RoleChange,
)
from actors.role import RoleView
from actors.schedule_plan import DueSchedule
from actors.scheduler import Scheduler, ScheduleReading

BASE = dt.datetime(2026, 3, 29, 0, 59, 58, 500_000, tzinfo=dt.UTC)
"""The database's time at trio time 0: half a second past a whole second."""


@attrs.define
class FakeStore:
    """One schedule every 2 s whose cursor the fake ledger moves; ``now`` follows the mock clock."""

    slots_through: dt.datetime = BASE

    async def active_schedules(self) -> ScheduleReading:
        now = BASE + dt.timedelta(seconds=trio.current_time())
        schedule = DueSchedule(
            schedule_id=1,
            name="tick",
            cron="*/2 * * * * *",
            tz="Europe/Berlin",
            concurrency_policy="allow",
            starting_deadline_s=60,
            slots_through=self.slots_through,
        )
        return ScheduleReading(now=now, schedules=(schedule,))

    async def close(self) -> None:
        pass


async def fake_ledger(
    inbox: trio.MemoryReceiveChannel[LedgerInbox],
    store: FakeStore,
    fired: list[tuple[float, int, dt.datetime]],
) -> None:
    """Records each fired slot with the trio time and the epoch, and moves the cursor."""
    async for message in inbox:
        assert isinstance(message, FireScheduleSlots)
        recorded = []
        for firing in message.firings:
            for d in firing.decisions:
                recorded.append(RecordedSlot(schedule_id=1, slot_at=d.slot_at, job_id=7 if d.fire else None))
                if d.fire:
                    fired.append((trio.current_time(), message.epoch, d.slot_at))
            store.slots_through = firing.decisions[-1].slot_at
        message.reply.set(tuple(recorded))


async def test_the_scheduler_wakes_at_the_next_slot_and_fires_it_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Slots every 2 s at database times 01:00:00, :02, :04 (trio 1.5, 3.5, 5.5): each fired
    once, at exactly its time, under the epoch elected; deposed at 6, nothing more fires."""
    store, fired = FakeStore(), list[tuple[float, int, dt.datetime]]()
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](4)
    roles_send, roles_recv = trio.open_memory_channel[RoleChange](4)
    lease_send, lease_recv = trio.open_memory_channel(4)  # type: ignore[var-annotated]
    scheduler = Scheduler(
        store=store, role=RoleView(changes=roles_recv, lease_inbox=lease_send), ledger=ledger_send
    )

    async def lease_keeper() -> None:
        async for query in lease_recv:
            assert isinstance(query, QueryRole)
            query.reply.set(Elected(seq=1, epoch=1))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lease_keeper)
        nursery.start_soon(fake_ledger, ledger_recv, store, fired)
        await nursery.start(scheduler.run)
        await trio.sleep(6.0)
        await roles_send.send(Deposed(seq=2, epoch=1, reason="lost"))
        await trio.sleep(4.0)
        nursery.cancel_scope.cancel()
    second = dt.timedelta(seconds=1)
    assert fired == [
        (1.5, 1, BASE + 1.5 * second),
        (3.5, 1, BASE + 3.5 * second),
        (5.5, 1, BASE + 5.5 * second),
    ]
