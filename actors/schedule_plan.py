"""What the scheduler decides for one schedule in one pass: which of its due slots fire and
which are recorded skipped, and why (:func:`plan_schedule`, pure). docs/schedules.md.
"""

from __future__ import annotations

import datetime as dt

import attrs

from runtime.schedules import MAX_CATCH_UP_SLOTS, next_slot, parse_cron, slots_between, zone

MAX_SLOTS_PER_PASS = 500
"""Most slots of one schedule one pass decides (after a long outage the rest wait for the next
passes, each recorded once)."""


@attrs.frozen(kw_only=True)
class DueSchedule:
    """A schedule as the scheduler reads it (``queries.ACTIVE_SCHEDULES``)."""

    schedule_id: int
    name: str
    cron: str
    tz: str
    concurrency_policy: str
    """``allow``, ``forbid`` or ``replace`` (runtime.schedules.CONCURRENCY_POLICIES)."""
    starting_deadline_s: int
    slots_through: dt.datetime
    """Every slot at or before it is recorded (aware)."""
    open_job_ids: tuple[int, ...] = ()
    """Jobs it fired that have not ended (waiting, pending, assigned or running)."""


@attrs.frozen(kw_only=True)
class SlotDecision:
    """One slot recorded: fired (a job is inserted for it) or skipped with ``reason``."""

    slot_at: dt.datetime
    fire: bool
    reason: str = ""


@attrs.frozen(kw_only=True)
class ScheduleFiring:
    """One schedule's part of a fenced firing (``queries.FIRE_SCHEDULE_SLOTS``)."""

    schedule_id: int
    slots_through: dt.datetime
    """The cursor as read: the write does nothing if it moved meanwhile (a resume, a remove)."""
    decisions: tuple[SlotDecision, ...]
    """Oldest first; the cursor moves to the last."""
    cancel_job_ids: tuple[int, ...] = ()
    """``replace``: the open jobs cancelled as the new one fires."""


@attrs.frozen(kw_only=True)
class SchedulePlan:
    """:func:`plan_schedule`'s answer."""

    firing: ScheduleFiring | None
    """None: no slot is due."""
    next_slot_at: dt.datetime | None
    """The first slot after ``now`` (None: none within the horizon); when to look again."""


def plan_schedule(
    schedule: DueSchedule, now: dt.datetime, *, max_slots: int = MAX_SLOTS_PER_PASS
) -> SchedulePlan:
    """Decide the slots of ``schedule`` due at ``now`` (the database's time), oldest first, at
    most ``max_slots``:

    - a slot more than ``starting_deadline_s`` before ``now`` is skipped (``missed``);
    - ``allow``: the newest :data:`runtime.schedules.MAX_CATCH_UP_SLOTS` slots within the
      deadline fire, older ones are skipped (``catch-up limit``);
    - ``forbid``, ``replace``: only the newest slot within the deadline may fire, older ones are
      skipped (``superseded``); ``forbid`` skips it too while a job of the schedule is open,
      ``replace`` cancels those jobs and fires (Kubernetes CronJob's concurrencyPolicy);
    - when more than ``max_slots`` are due, this pass fires none: it records the oldest
      ``max_slots`` as missed or superseded, and a later pass goes on.

    Raises:
        InvalidArgument: the stored cron or tz no longer parses (a schedule stored by a newer
            version); the caller skips the schedule.
    """
    cron, tz = parse_cron(schedule.cron), zone(schedule.tz)
    due = slots_between(cron, tz, schedule.slots_through, now, limit=max_slots + 1)
    truncated = len(due) > max_slots
    due = due[:max_slots]
    # More due: the next pass comes at once.
    later = now if truncated else next_slot(cron, tz, now)
    if not due:
        return SchedulePlan(firing=None, next_slot_at=later)
    deadline = now - dt.timedelta(seconds=schedule.starting_deadline_s)
    within = [s for s in due if s >= deadline]
    if truncated:
        firing_slots: list[dt.datetime] = []
    elif schedule.concurrency_policy == "allow":
        firing_slots = within[-MAX_CATCH_UP_SLOTS:]
    else:
        firing_slots = within[-1:]
    cancel: tuple[int, ...] = ()
    blocked = ""
    if firing_slots and schedule.open_job_ids and schedule.concurrency_policy != "allow":
        if schedule.concurrency_policy == "forbid":
            jobs = ", ".join(str(j) for j in schedule.open_job_ids)
            blocked = f"forbid: job {jobs} of this schedule has not ended"
        else:
            cancel = schedule.open_job_ids
    decisions: list[SlotDecision] = []
    for slot in due:
        if slot < deadline:
            # Tenths, so that a slot 3.4 s late never reads "3 s late, past starting_deadline_s 3".
            late = f"{(now - slot).total_seconds():.1f}".removesuffix(".0")
            reason = f"missed: {late} s late, past starting_deadline_s {schedule.starting_deadline_s}"
            decisions.append(SlotDecision(slot_at=slot, fire=False, reason=reason))
        elif slot in firing_slots:
            decisions.append(SlotDecision(slot_at=slot, fire=not blocked, reason=blocked))
        elif schedule.concurrency_policy == "allow" and not truncated:
            reason = f"catch-up limit: only the newest {MAX_CATCH_UP_SLOTS} due slots fire"
            decisions.append(SlotDecision(slot_at=slot, fire=False, reason=reason))
        else:
            reason = f"superseded: a later slot was due ({schedule.concurrency_policy})"
            decisions.append(SlotDecision(slot_at=slot, fire=False, reason=reason))
    firing = ScheduleFiring(
        schedule_id=schedule.schedule_id,
        slots_through=schedule.slots_through,
        decisions=tuple(decisions),
        cancel_job_ids=cancel,
    )
    return SchedulePlan(firing=firing, next_slot_at=later)
