"""The scheduler: while leader, fires the due slots of the schedules (docs/schedules.md).

Each pass reads the database's ``now()`` and the active schedules, decides each one's due
slots (:func:`actors.schedule_plan.plan_schedule`) and records them in one fenced write
(:class:`actors.messages.FireScheduleSlots`), then sleeps (trio's clock) until the next slot or
``poll_interval_s``, whichever comes first. The database's clock decides what is due, so
replicas never compare clocks; the fence and the slot's primary key make each slot fire once.
"""

from __future__ import annotations

import datetime as dt
import math
from functools import partial
from typing import Any, Protocol

import attrs
import trio

from actors import queries
from actors.messages import FireScheduleSlots, RecordedSlot
from actors.role import RoleView
from actors.schedule_plan import MAX_SLOTS_PER_PASS, DueSchedule, ScheduleFiring, plan_schedule
from actors.write_size import FencedWrites
from runtime import log, metrics
from runtime.aio import ReadStore
from runtime.errors import DatabaseUnavailable, InvalidArgument, StaleEpoch
from runtime.reply import Reply

OPEN_JOBS_LOOKED_AT = 10
"""How many of a schedule's last fired jobs ``queries.ACTIVE_SCHEDULES`` reads for the open ones
(the most a ``replace`` firing cancels)."""


@attrs.frozen(kw_only=True)
class SchedulerSettings:
    """The scheduler's timing."""

    poll_interval_s: float = 1.0
    """Longest sleep between passes (a schedule added, resumed or removed is seen within it)."""
    min_sleep_s: float = 0.01
    """Shortest sleep between passes (a slot due now is fired by this pass)."""


@attrs.frozen(kw_only=True)
class ScheduleReading:
    """One read: the database's time and the schedules that are not paused."""

    now: dt.datetime
    schedules: tuple[DueSchedule, ...]


class SchedulerStore(Protocol):
    """What a pass reads."""

    async def active_schedules(self) -> ScheduleReading: ...

    async def close(self) -> None: ...


@attrs.define
class PgSchedulerStore(ReadStore):
    """:class:`SchedulerStore` on a read connection of its own."""

    async def active_schedules(self) -> ScheduleReading:
        conn = await self._connection()
        rows = await conn.fetch(queries.ACTIVE_SCHEDULES)
        now = rows[0]["now"] if rows else await conn.fetchval(queries.DATABASE_NOW)
        return ScheduleReading(
            now=now,
            schedules=tuple(
                DueSchedule(
                    schedule_id=int(r["id"]),
                    name=r["name"],
                    cron=r["cron"],
                    tz=r["tz"],
                    concurrency_policy=r["concurrency_policy"],
                    starting_deadline_s=int(r["starting_deadline_s"]),
                    slots_through=r["slots_through"],
                    open_job_ids=tuple(int(i) for i in r["open_job_ids"]),
                )
                for r in rows
            ),
        )


@attrs.define
class Scheduler(FencedWrites):
    """The actor."""

    store: SchedulerStore
    role: RoleView
    settings: SchedulerSettings = attrs.field(factory=SchedulerSettings)
    _failed_passes: int = 0
    """Passes failed in a row (the database away): logged once per streak."""
    _log: Any = attrs.field(factory=lambda: log.get("scheduler"))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run passes while leader, until cancelled."""
        await self.role.every_interval_while_leader(
            self.settings.poll_interval_s, self._passes, task_status=task_status
        )

    async def _passes(self, epoch: int) -> None:
        """Passes under ``epoch`` until the next one is not due within ``poll_interval_s`` (the
        leader loop then calls again at its next tick)."""
        began = trio.current_time()
        while True:
            try:
                wait_s = await self.fire_due(epoch)
            except StaleEpoch as exc:
                self._log.info("firing refused: deposed", epoch=exc.epoch, epoch_seen=exc.epoch_seen)
                return
            except DatabaseUnavailable as exc:
                if not self._failed_passes:
                    self._log.warning("pass failed", error=str(exc))
                self._failed_passes += 1
                return
            if self._failed_passes:
                self._log.info("passes succeed again", failed_passes=self._failed_passes)
                self._failed_passes = 0
            wake = trio.current_time() + max(wait_s, self.settings.min_sleep_s)
            if wake >= began + self.settings.poll_interval_s or self.role.epoch != epoch:
                return
            await trio.sleep_until(wake)
            if self.role.epoch != epoch:
                return

    async def fire_due(self, epoch: int) -> float:
        """One pass under ``epoch``: record every due slot; returns the seconds until the next
        slot (``inf``: none).

        Raises:
            StaleEpoch: deposed; nothing of this pass was written.
            DatabaseUnavailable: the read or the write failed (the write's outcome unknown:
                the next pass reads what it did).
        """
        reading = await self.store.active_schedules()
        firings: list[ScheduleFiring] = []
        next_at: dt.datetime | None = None
        # One schedule's firing is one write: its slots and its cancels within the ledger's limit.
        most = max(1, min(MAX_SLOTS_PER_PASS, self.max_rows_per_fenced_write - OPEN_JOBS_LOOKED_AT))
        for schedule in reading.schedules:
            await trio.lowlevel.checkpoint()  # many schedules: the placer's rounds go on between them
            try:
                plan = plan_schedule(schedule, reading.now, max_slots=most)
            except InvalidArgument as exc:
                self._log.error("schedule skipped: unreadable", schedule=schedule.name, error=str(exc))
                continue
            if plan.firing is not None:
                firings.append(plan.firing)
            if plan.next_slot_at is not None and (next_at is None or plan.next_slot_at < next_at):
                next_at = plan.next_slot_at
        for batch in self._batches(firings):
            recorded: tuple[RecordedSlot, ...] = await self.write(partial(self._message, epoch, batch))
            fired = [r for r in recorded if r.job_id is not None]
            metrics.SCHEDULE_SLOTS.labels("fired").inc(len(fired))
            metrics.SCHEDULE_SLOTS.labels("skipped").inc(len(recorded) - len(fired))
            if recorded:
                self._log.info(
                    "schedule slots recorded",
                    epoch=epoch,
                    fired=len(fired),
                    skipped=len(recorded) - len(fired),
                    job_ids=[r.job_id for r in fired],
                )
        if next_at is None:
            return math.inf
        return max(0.0, (next_at - reading.now).total_seconds())

    @staticmethod
    def _message(
        epoch: int, firings: tuple[ScheduleFiring, ...], reply: Reply[tuple[RecordedSlot, ...]]
    ) -> FireScheduleSlots:
        return FireScheduleSlots(epoch=epoch, firings=firings, reply=reply)

    def _batches(self, firings: list[ScheduleFiring]) -> list[tuple[ScheduleFiring, ...]]:
        """``firings`` in writes of at most :meth:`write_size` rows (a firing is never split: it
        holds at most ``MAX_SLOTS_PER_PASS`` slots, below the ledger's limit)."""
        batches: list[tuple[ScheduleFiring, ...]] = []
        batch: list[ScheduleFiring] = []
        rows, most = 0, self.write_size().rows
        for firing in firings:
            size = len(firing.decisions) + len(firing.cancel_job_ids)
            if batch and rows + size > most:
                batches.append(tuple(batch))
                batch, rows = [], 0
            batch.append(firing)
            rows += size
        if batch:
            batches.append(tuple(batch))
        return batches
