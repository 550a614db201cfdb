"""Schedules fired on a real PostgreSQL: each slot recorded once with its one job, under the
fence; a deposed leader's firing writes nothing; the slot's primary key is the backstop; the
concurrency policies as Kubernetes CronJob's."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import AsyncIterator

import pytest
import trio
from test_fencing import run_ledger, take_over

from actors import queries
from actors.messages import RoleChange
from actors.role import RoleView
from actors.scheduler import PgSchedulerStore, Scheduler
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DuplicateKey, StaleEpoch
from runtime.jobs import JobSpec, SleepRuntime

TEMPLATE = queries.job_template(
    JobSpec(name="tick", cpu_millis=100, memory_mb=10, runtime=SleepRuntime(duration_ms=10_000))
)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[PgConnection]:
    """An admin connection to a fresh database, with the bridge open."""
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        try:
            yield conn
        finally:
            await conn.close()


async def add_schedule(
    db: PgConnection, *, back_s: float, policy: str = "allow", deadline_s: int = 5, cron: str = "* * * * * *"
) -> int:
    """A schedule every second (by default) owned by ``alice``, whose cursor is ``back_s``
    seconds ago, at a whole second."""
    return int(
        await db.fetchval(
            """INSERT INTO schedules (name, cron, tz, job, concurrency_policy, starting_deadline_s, owner,
                                      slots_through)
               VALUES ('every-second', $1, 'UTC', $2::jsonb, $3, $4, 'alice',
                       date_trunc('second', now()) - make_interval(secs => $5))
               RETURNING id""",
            cron,
            TEMPLATE,
            policy,
            deadline_s,
            back_s,
        )
    )


def scheduler(url: str, ledger: trio.MemorySendChannel) -> Scheduler:  # type: ignore[type-arg]
    _changes_send, changes_recv = trio.open_memory_channel[RoleChange](1)
    lease_send, _ = trio.open_memory_channel(1)  # type: ignore[var-annotated]
    return Scheduler(
        store=PgSchedulerStore(database_url=url, application_name="test scheduler"),
        role=RoleView(changes=changes_recv, lease_inbox=lease_send),
        ledger=ledger,
    )


async def slots(db: PgConnection) -> list[dict[str, object]]:
    rows = await db.fetch(
        "SELECT s.slot_at, s.outcome, s.reason, s.job_id, s.epoch, j.owner, j.name"
        "  FROM schedule_slots s LEFT JOIN jobs j ON j.id = s.job_id ORDER BY s.slot_at"
    )
    return [dict(r) for r in rows]


async def test_due_slots_fire_once_each_and_old_ones_are_recorded_missed(
    db: PgConnection, database_url: str
) -> None:
    """A cursor 20 s back with a 5 s deadline: every slot since is recorded once; those more
    than 5 s old skipped as missed, the newer ones fired, each with one job of the owner; a
    second pass records nothing again."""
    schedule_id = await add_schedule(db, back_s=20)
    assert await take_over(db, "cp-1") == 1
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        actor = scheduler(database_url, ledger)
        await actor.fire_due(1)
        first = await slots(db)
        await actor.fire_due(1)
        await actor.store.close()
        nursery.cancel_scope.cancel()
    assert len(first) >= 20
    seconds = [r["slot_at"] for r in first]
    assert seconds == sorted(set(seconds))
    assert all(b - a == dt.timedelta(seconds=1) for a, b in itertools.pairwise(seconds))  # type: ignore[operator]
    fired = [r for r in first if r["outcome"] == "fired"]
    missed = [r for r in first if r["outcome"] == "skipped"]
    assert 4 <= len(fired) <= 7
    assert all(str(r["reason"]).startswith("missed:") for r in missed)
    assert all(r["owner"] == "alice" and r["name"] == "tick" and r["epoch"] == 1 for r in fired)
    assert len({r["job_id"] for r in fired}) == len(fired)
    after = await slots(db)
    assert after[: len(first)] == first
    assert await db.fetchval("SELECT count(*) FROM jobs") == sum(1 for r in after if r["outcome"] == "fired")
    through = await db.fetchval("SELECT slots_through FROM schedules WHERE id = $1", schedule_id)
    assert through == after[-1]["slot_at"]


async def test_a_deposed_leaders_firing_records_nothing(db: PgConnection, database_url: str) -> None:
    """Epoch 2 holds the lease: a firing under epoch 1 is refused and writes no slot and no job;
    the new leader then records every slot once."""
    await add_schedule(db, back_s=3)
    assert await take_over(db, "cp-1") == 1
    await db.execute("UPDATE lease SET expires_at = '-infinity'")
    assert await take_over(db, "cp-2") == 2
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        old, new = scheduler(database_url, ledger), scheduler(database_url, ledger)
        with pytest.raises(StaleEpoch):
            await old.fire_due(1)
        assert await db.fetchval("SELECT count(*) FROM schedule_slots") == 0
        assert await db.fetchval("SELECT count(*) FROM jobs") == 0
        await new.fire_due(2)
        for actor in (old, new):
            await actor.store.close()
        nursery.cancel_scope.cancel()
    recorded = await slots(db)
    assert len(recorded) >= 3
    assert {r["epoch"] for r in recorded} == {2}
    assert await db.fetchval("SELECT count(*) FROM jobs") == len(recorded)


async def test_a_slot_recorded_twice_breaks_the_primary_key(db: PgConnection) -> None:
    """The backstop: a second row for the same (schedule, slot) is refused by the database."""
    schedule_id = await add_schedule(db, back_s=0)
    insert = (
        "INSERT INTO schedule_slots (schedule_id, slot_at, outcome, reason, epoch)"
        " VALUES ($1, '2026-01-01T00:00:00Z', 'skipped', 'test', 1)"
    )
    await db.execute(insert, schedule_id)
    with pytest.raises(DuplicateKey):
        await db.execute(insert, schedule_id)


async def test_forbid_skips_while_the_previous_job_is_open_and_replace_cancels_it(
    db: PgConnection, database_url: str
) -> None:
    """forbid: with its last job still pending, the next slot is skipped naming that job;
    replace: the pending job is cancelled and the slot fires."""
    forbid = await add_schedule(db, back_s=1, policy="forbid")
    assert await take_over(db, "cp-1") == 1
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        actor = scheduler(database_url, ledger)
        await actor.fire_due(1)
        first_job = await db.fetchval("SELECT max(job_id) FROM schedule_slots WHERE schedule_id = $1", forbid)
        assert first_job is not None
        await trio.sleep(1.1)  # the next slot is due (the database's clock decides)
        await actor.fire_due(1)
        skipped = await db.fetch(
            "SELECT reason FROM schedule_slots WHERE schedule_id = $1 AND outcome = 'skipped'"
            " ORDER BY slot_at",
            forbid,
        )
        # The newest due slot names the open job; an older one due in the same pass (the sleep
        # may span two slots) is superseded by it.
        assert skipped and skipped[-1]["reason"] == f"forbid: job {first_job} of this schedule has not ended"
        assert all(r["reason"] == "superseded: a later slot was due (forbid)" for r in skipped[:-1])
        assert await db.fetchval("SELECT count(*) FROM jobs") == 1
        await db.execute("UPDATE schedules SET concurrency_policy = 'replace' WHERE id = $1", forbid)
        await trio.sleep(1.1)
        await actor.fire_due(1)
        await actor.store.close()
        nursery.cancel_scope.cancel()
    assert await db.fetchval("SELECT state FROM jobs WHERE id = $1", first_job) == "cancelled"
    newest = await db.fetchrow(
        "SELECT outcome, job_id FROM schedule_slots WHERE schedule_id = $1 ORDER BY slot_at DESC LIMIT 1",
        forbid,
    )
    assert newest is not None and newest["outcome"] == "fired" and newest["job_id"] != first_job


async def test_a_fired_job_names_its_schedule_and_a_replaced_one_says_what_replaced_it(
    db: PgConnection, database_url: str
) -> None:
    """replace: the pending job cancelled by the next slot has reason and detail ``replaced by
    schedule NAME's slot TIME``; GET_JOB reads each fired job's schedule and slot, and
    JOB_EVENTS says which slot fired it and what asked its cancel."""
    schedule_id = await add_schedule(db, back_s=1, policy="replace")
    assert await take_over(db, "cp-1") == 1
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        actor = scheduler(database_url, ledger)
        await actor.fire_due(1)
        first_job = await db.fetchval(
            "SELECT max(job_id) FROM schedule_slots WHERE schedule_id = $1", schedule_id
        )
        await trio.sleep(1.1)  # the next slot is due (the database's clock decides)
        await actor.fire_due(1)
        await actor.store.close()
        nursery.cancel_scope.cancel()
    first_slot, newest = (
        await db.fetchval("SELECT slot_at FROM schedule_slots WHERE job_id = $1", first_job),
        await db.fetchrow(
            "SELECT slot_at, job_id FROM schedule_slots WHERE schedule_id = $1 AND outcome = 'fired'"
            " ORDER BY slot_at DESC LIMIT 1",
            schedule_id,
        ),
    )
    assert newest is not None and newest["job_id"] != first_job
    words = f"replaced by schedule every-second's slot {newest['slot_at']:%Y-%m-%dT%H:%M:%SZ}"
    cancelled = await db.fetchrow("SELECT state, reason, detail FROM jobs WHERE id = $1", first_job)
    assert cancelled is not None and dict(cancelled) == {
        "state": "cancelled",
        "reason": words,
        "detail": words,
    }
    info = await db.fetchrow(queries.GET_JOB, first_job, None)
    assert info is not None and info["schedule_name"] == "every-second"
    assert info["schedule_slot_unix_s"] == first_slot.timestamp()
    events = {r["kind"]: r["detail"] for r in await db.fetch(queries.JOB_EVENTS, first_job, None)}
    assert events["submitted"] == f"fired by schedule every-second's slot {first_slot:%Y-%m-%dT%H:%M:%SZ}"
    assert events["cancel_requested"] == words
    plain = await db.fetchval(
        "INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms)"
        " VALUES ('plain', 100, 10, 'sleep', 10) RETURNING id"
    )
    info = await db.fetchrow(queries.GET_JOB, plain, None)
    assert info is not None and (info["schedule_name"], info["schedule_slot_unix_s"]) == (None, None)
