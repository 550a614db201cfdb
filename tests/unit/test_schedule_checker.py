"""The checker's judgement of schedules (ops/invariants.py, schedule_slot_errors): every slot
between a schedule's creation and the end of its window recorded exactly once, a fired one with
its job."""

from __future__ import annotations

import datetime as dt

from ops.checker_records import ScheduleRecord, SlotRecord
from ops.invariants import schedule_slot_errors

T0 = dt.datetime(2026, 3, 29, 0, 0, tzinfo=dt.UTC).timestamp()


def every_2s(*, through_s: float, end_s: float) -> ScheduleRecord:
    return ScheduleRecord(
        schedule_id=1,
        name="tick",
        cron="*/2 * * * * *",
        tz="Europe/Berlin",
        created_at=T0 + 0.5,
        slots_through=T0 + through_s,
        ended_at=T0 + end_s,
    )


def fired(at_s: float, job_id: int) -> SlotRecord:
    return SlotRecord(schedule_id=1, slot_at=T0 + at_s, outcome="fired", reason="", job_id=job_id)


def skipped(at_s: float, reason: str = "missed: 70 s late") -> SlotRecord:
    return SlotRecord(schedule_id=1, slot_at=T0 + at_s, outcome="skipped", reason=reason, job_id=None)


def test_every_slot_recorded_once_passes() -> None:
    """Slots 2, 4, 6, 8 recorded (one skipped with its reason), cursor at 8, window ends at 9."""
    slots = [fired(2, 11), skipped(4), fired(6, 12), fired(8, 13)]
    assert (
        schedule_slot_errors([every_2s(through_s=8, end_s=9)], slots, {11: "succeeded", 12: "x", 13: "x"})
        == []
    )


def test_a_missing_slot_a_stray_one_and_a_fired_one_without_its_job_are_found() -> None:
    """Slot 4 missing below the cursor, a record at 5 (no slot), slot 6's job unknown, a skip
    with no reason: one line each."""
    slots = [
        fired(2, 11),
        SlotRecord(schedule_id=1, slot_at=T0 + 5, outcome="fired", reason="", job_id=12),
        fired(6, 99),
        skipped(8, reason=""),
    ]
    errors = schedule_slot_errors([every_2s(through_s=8, end_s=9)], slots, {11: "succeeded", 12: "succeeded"})
    assert len(errors) == 4
    assert any("never recorded" in e for e in errors)
    assert any("no slot of" in e for e in errors)
    assert any("its job is missing" in e for e in errors)
    assert any("no reason" in e for e in errors)


def test_a_cursor_that_stopped_long_before_the_end_is_found() -> None:
    """The cursor stopped at 4 while the window ran to 20: the slots 6-14 (older than the 5 s
    slack) are reported as never recorded."""
    errors = schedule_slot_errors(
        [every_2s(through_s=4, end_s=20)], [fired(2, 1), fired(4, 2)], {1: "s", 2: "s"}
    )
    assert len(errors) == 1 and "5 slots from" in errors[0]
