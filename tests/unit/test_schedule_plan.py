"""What the scheduler decides for one schedule's due slots (actors/schedule_plan.py): the
starting deadline, the catch-up limit and the concurrency policies."""

from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.schedule_plan import DueSchedule, plan_schedule
from runtime.schedules import MAX_CATCH_UP_SLOTS, UTC

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def every_minute(
    *, back_min: int, policy: str = "allow", deadline_s: int = 300, open_jobs: tuple[int, ...] = ()
) -> DueSchedule:
    return DueSchedule(
        schedule_id=7,
        name="m",
        cron="* * * * *",
        tz="UTC",
        concurrency_policy=policy,
        starting_deadline_s=deadline_s,
        slots_through=T0 - dt.timedelta(minutes=back_min),
        open_job_ids=open_jobs,
    )


def test_nothing_due_gives_only_the_next_slot() -> None:
    """With the cursor at now, nothing is recorded; the next slot is the next minute."""
    plan = plan_schedule(every_minute(back_min=0), T0 + dt.timedelta(seconds=30))
    assert plan.firing is None
    assert plan.next_slot_at == T0 + dt.timedelta(minutes=1)


def test_slots_past_the_deadline_are_missed_the_rest_fire() -> None:
    """20 minutes down, deadline 5 minutes: slots more than 5 minutes late are missed, those at
    most 5 minutes late (the boundary included) fire."""
    plan = plan_schedule(every_minute(back_min=20), T0)
    assert plan.firing is not None
    decisions = plan.firing.decisions
    assert [d.slot_at for d in decisions] == [T0 - dt.timedelta(minutes=m) for m in range(19, -1, -1)]
    assert [d.fire for d in decisions] == [False] * 14 + [True] * 6
    assert decisions[0].reason == "missed: 1140 s late, past starting_deadline_s 300"


def test_catch_up_fires_at_most_the_newest_ten() -> None:
    """An hour's deadline after 30 minutes down: the newest 10 fire, the 20 older are skipped."""
    plan = plan_schedule(every_minute(back_min=30, deadline_s=3600), T0)
    assert plan.firing is not None
    fired = [d for d in plan.firing.decisions if d.fire]
    assert len(fired) == MAX_CATCH_UP_SLOTS
    assert fired[-1].slot_at == T0
    skipped = [d for d in plan.firing.decisions if not d.fire]
    assert all(d.reason.startswith("catch-up limit") for d in skipped)


def test_forbid_skips_while_a_job_is_open() -> None:
    """forbid with job 41 open: the due slot is skipped naming it, nothing is cancelled."""
    plan = plan_schedule(every_minute(back_min=1, policy="forbid", open_jobs=(41,)), T0)
    assert plan.firing is not None
    (decision,) = plan.firing.decisions
    assert (decision.fire, decision.reason) == (False, "forbid: job 41 of this schedule has not ended")
    assert plan.firing.cancel_job_ids == ()


def test_replace_cancels_the_open_job_and_fires_only_the_newest() -> None:
    """replace after 3 minutes down: the open job is cancelled, the newest slot fires, the two
    older are superseded."""
    plan = plan_schedule(every_minute(back_min=3, policy="replace", open_jobs=(41,)), T0)
    assert plan.firing is not None
    assert plan.firing.cancel_job_ids == (41,)
    assert [d.fire for d in plan.firing.decisions] == [False, False, True]
    assert plan.firing.decisions[0].reason == "superseded: a later slot was due (replace)"


def test_more_due_than_a_pass_decides_records_the_oldest_and_fires_none() -> None:
    """With more than max_slots due, the pass records the oldest max_slots unfired and the next
    pass is due at once."""
    plan = plan_schedule(every_minute(back_min=50, deadline_s=3600), T0, max_slots=20)
    assert plan.firing is not None
    assert len(plan.firing.decisions) == 20
    assert not any(d.fire for d in plan.firing.decisions)
    assert plan.next_slot_at == T0


@settings(max_examples=examples(100), deadline=None)
@given(
    back_min=st.integers(0, 120),
    deadline_s=st.integers(1, 7200),
    policy=st.sampled_from(["allow", "forbid", "replace"]),
    open_jobs=st.sampled_from([(), (3,)]),
)
def test_every_due_slot_is_decided_once_in_order(
    back_min: int, deadline_s: int, policy: str, open_jobs: tuple[int, ...]
) -> None:
    """Whatever the policy and the outage, a pass decides each due slot once, oldest first;
    at most the catch-up limit fire, and at most one for forbid and replace."""
    schedule = every_minute(back_min=back_min, policy=policy, deadline_s=deadline_s, open_jobs=open_jobs)
    plan = plan_schedule(schedule, T0)
    decided = [] if plan.firing is None else [d.slot_at for d in plan.firing.decisions]
    assert decided == [T0 - dt.timedelta(minutes=m) for m in range(back_min - 1, -1, -1)]
    fired = 0 if plan.firing is None else sum(d.fire for d in plan.firing.decisions)
    assert fired <= (MAX_CATCH_UP_SLOTS if policy == "allow" else 1)
    if plan.firing is not None:
        assert all(d.fire or d.reason for d in plan.firing.decisions)


def test_a_missed_slots_lateness_is_told_in_tenths() -> None:
    """A slot 3.4 s late past a deadline of 3 s says so, never "3 s late, past ... 3"."""
    plan = plan_schedule(every_minute(back_min=1, deadline_s=3), T0 + dt.timedelta(seconds=3.4))
    assert plan.firing is not None
    missed = [d.reason for d in plan.firing.decisions if not d.fire]
    assert "missed: 3.4 s late, past starting_deadline_s 3" in missed
