"""The scheduler actor on a mock clock (actors/scheduler.py): it wakes at the next slot, fires
it through the ledger under its epoch, and stops when deposed; the database's clock (here its
start plus the mock clock's time) decides what is due."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import attrs
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

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
from actors.scheduler import Scheduler, ScheduleReading, SchedulerSettings

BASE = dt.datetime(2026, 3, 29, 0, 59, 58, 500_000, tzinfo=dt.UTC)
"""The database's time at trio time 0: half a second past a whole second, 1.5 s before
Europe/Berlin's spring change."""

Fired = list[tuple[float, int, dt.datetime]]
"""(trio time, epoch, slot) of each slot fired."""


@attrs.define
class FakeStore:
    """One schedule in Europe/Berlin (every 2 s unless told) whose cursor the fake ledger moves;
    the database's ``now`` is ``base`` plus the mock clock's time."""

    base: dt.datetime = BASE
    cron: str = "*/2 * * * * *"
    slots_through: dt.datetime | None = None

    async def active_schedules(self) -> ScheduleReading:
        now = self.base + dt.timedelta(seconds=trio.current_time())
        schedule = DueSchedule(
            schedule_id=1,
            name="tick",
            cron=self.cron,
            tz="Europe/Berlin",
            concurrency_policy="allow",
            starting_deadline_s=60,
            slots_through=self.slots_through or self.base,
        )
        return ScheduleReading(now=now, schedules=(schedule,))

    async def close(self) -> None:
        pass


@attrs.define
class Cluster:
    """A scheduler with a scripted lease keeper (epoch 1 elected) and ledger (records what
    fires, moves the cursor)."""

    store: FakeStore
    settings: SchedulerSettings = attrs.field(factory=SchedulerSettings)
    fired: Fired = attrs.field(factory=list)
    roles: trio.MemorySendChannel[RoleChange] = attrs.field(init=False)

    async def run(self, *, for_s: float, deposed_at_s: float | None = None) -> None:
        ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](4)
        self.roles, roles_recv = trio.open_memory_channel[RoleChange](4)
        lease_send, lease_recv = trio.open_memory_channel[QueryRole](4)
        scheduler = Scheduler(
            store=self.store,
            role=RoleView(changes=roles_recv, lease_inbox=lease_send),  # type: ignore[arg-type]
            ledger=ledger_send,
            settings=self.settings,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._lease_keeper, lease_recv)
            nursery.start_soon(self._ledger, ledger_recv)
            await nursery.start(scheduler.run)
            if deposed_at_s is not None:
                await trio.sleep(deposed_at_s)
                await self.roles.send(Deposed(seq=2, epoch=1, reason="lost"))
                for_s -= deposed_at_s
            await trio.sleep(for_s)
            nursery.cancel_scope.cancel()

    async def _lease_keeper(self, inbox: trio.MemoryReceiveChannel[QueryRole]) -> None:
        async for query in inbox:
            query.reply.set(Elected(seq=1, epoch=1))

    async def _ledger(self, inbox: trio.MemoryReceiveChannel[LedgerInbox]) -> None:
        async for message in inbox:
            assert isinstance(message, FireScheduleSlots)
            recorded = []
            for firing in message.firings:
                for d in firing.decisions:
                    recorded.append(
                        RecordedSlot(schedule_id=1, slot_at=d.slot_at, job_id=7 if d.fire else None)
                    )
                    if d.fire:
                        self.fired.append((trio.current_time(), message.epoch, d.slot_at))
                self.store.slots_through = firing.decisions[-1].slot_at
            message.reply.set(tuple(recorded))


async def test_the_scheduler_wakes_at_the_next_slot_and_fires_it_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Slots every 2 s at database times 01:00:00, :02, :04 (trio 1.5, 3.5, 5.5; the first is
    Berlin's 03:00 CEST, where the skipped hour's slots are one): each fired once, at exactly its
    time, under the epoch elected, and counted in stockade_schedule_slots_total; deposed at 6,
    nothing more fires."""
    fired_before = REGISTRY.get_sample_value("stockade_schedule_slots_total", {"outcome": "fired"}) or 0.0
    cluster = Cluster(FakeStore())
    await cluster.run(for_s=10.0, deposed_at_s=6.0)
    second = dt.timedelta(seconds=1)
    assert cluster.fired == [
        (1.5, 1, BASE + 1.5 * second),
        (3.5, 1, BASE + 3.5 * second),
        (5.5, 1, BASE + 5.5 * second),
    ]
    fired_after = REGISTRY.get_sample_value("stockade_schedule_slots_total", {"outcome": "fired"})
    assert fired_after == fired_before + 3


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (
            dt.datetime(2026, 3, 27, 0, 0, tzinfo=dt.UTC),
            [
                "2026-03-27T02:30:00+01:00",
                "2026-03-28T02:30:00+01:00",
                "2026-03-29T03:00:00+02:00",
                "2026-03-30T02:30:00+02:00",
            ],
        ),
        (
            dt.datetime(2026, 10, 23, 0, 0, tzinfo=dt.UTC),
            [
                "2026-10-23T02:30:00+02:00",
                "2026-10-24T02:30:00+02:00",
                "2026-10-25T02:30:00+02:00",
                "2026-10-26T02:30:00+01:00",
            ],
        ),
    ],
    ids=["spring", "autumn"],
)
async def test_a_daily_schedule_across_berlins_clock_changes_fires_once_a_day(
    autojump_clock: trio.testing.MockClock, start: dt.datetime, expected: list[str]
) -> None:
    """30 2 * * * in Europe/Berlin over four days around each change, on the mock clock (the
    scheduler sleeps until the next slot: its poll interval is ten days): one job a day, fired at
    the instant the daylight-saving rule gives (the skipped 02:30 at 03:00 CEST; the repeated
    02:30 at its first occurrence), each at exactly its time."""
    cluster = Cluster(
        FakeStore(base=start, cron="30 2 * * *"), SchedulerSettings(poll_interval_s=10 * 86400.0)
    )
    await cluster.run(for_s=4 * 86400.0)
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    assert [slot.astimezone(berlin).isoformat() for _, _, slot in cluster.fired] == expected
    assert [at for at, _, _ in cluster.fired] == [
        (slot - start).total_seconds() for _, _, slot in cluster.fired
    ]
