"""Pacing and requeue backoff on a real PostgreSQL: the send window's counters in the workers
row stay exact through every way an assignment starts, is confirmed or ends, and through a
re-registration (and are rebuilt by the schema's backfill); a job lost with its worker gets a
backoff that the placer honours; a re-registered worker gets at most the initial window at
first."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
import trio
from seeding import insert_job
from serving import HOLD_LEASE

from actors import queries
from actors.idempotency import registration_digest
from actors.ledger import Ledger
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    DeclareDeadWorkers,
    DispatcherInbox,
    EndAssignments,
    LeaseInbox,
    LedgerInbox,
    Placement,
    ReconcileResult,
    RoleChange,
)
from actors.placer import Placer
from actors.placer_store import PgPlacerStore
from actors.role import RoleView
from runtime.aio import PgConnection, asyncio_bridge
from runtime.idempotency_keys import new_idempotency_key
from runtime.reply import Reply
from runtime.settings.leader import (
    LedgerSettings,
    PlacerSettings,
)

COUNTERS_MATCH = """
SELECT bool_and(w.unconfirmed_assignments = coalesce(a.unconfirmed, 0)
            AND w.confirmed_assignments = coalesce(a.confirmed, 0))
  FROM worker_allocations w
  LEFT JOIN (SELECT worker_id, worker_incarnation,
                    count(*) FILTER (WHERE state = 'active' AND confirmed_at IS NULL) AS unconfirmed,
                    count(*) FILTER (WHERE confirmed_at IS NOT NULL OR state = 'finished') AS confirmed
               FROM assignments GROUP BY worker_id, worker_incarnation) a
    ON a.worker_id = w.worker_id AND a.worker_incarnation = w.incarnation
"""
"""Every worker's counters against their definition in schema.sql (current incarnation)."""

ALLOCATION_MATCHES = """
SELECT bool_and(w.cpu_allocated_millis = coalesce(a.cpu, 0) AND w.memory_allocated_mb = coalesce(a.mem, 0))
  FROM worker_allocations w
  LEFT JOIN (SELECT worker_id, sum(cpu_millis) AS cpu, sum(memory_mb) AS mem
               FROM assignments WHERE state = 'active' GROUP BY worker_id) a ON a.worker_id = w.worker_id
"""


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[PgConnection]:
    """An admin connection (bridge open) to a fresh database whose lease cp-1 holds at epoch 1."""
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        await conn.execute(HOLD_LEASE, 1)
        try:
            yield conn
        finally:
            await conn.close()


async def register(db: PgConnection, worker_id: str, cpu_millis: int = 8000) -> int:
    """Register (again) as ingest does, and heartbeat once under the new incarnation as an agent
    does (only then does the orphan sweep end the previous one's assignments); returns the new
    incarnation."""
    address = f"127.0.0.1:{len(worker_id)}"
    digest = registration_digest(address=address, cpu_millis=cpu_millis, memory_mb=8192, labels={})
    run_id = new_idempotency_key()  # a new agent run each time: always a new incarnation
    incarnation = int(
        await db.fetchval(
            queries.REGISTER_WORKER, worker_id, address, cpu_millis, 8192, "{}", run_id, 1, digest, "{}"
        )
    )
    await db.fetchrow(queries.HEARTBEAT, worker_id, incarnation, *[[]] * 9, 0, 0, 250, 2500)
    return incarnation


async def submit(db: PgConnection, count: int, cpu_millis: int = 100) -> list[int]:
    return [await insert_job(db, f"j{n}", cpu_millis, 10, 0, "sleep", 1000, None) for n in range(count)]


async def counters(db: PgConnection, worker_id: str = "w-1") -> tuple[int, int]:
    """(unconfirmed, confirmed) as the worker's allocation row holds them, after checking every
    row is exact."""
    assert await db.fetchval(COUNTERS_MATCH)
    assert await db.fetchval(ALLOCATION_MATCHES)
    row = await db.fetchrow(
        "SELECT unconfirmed_assignments, confirmed_assignments FROM worker_allocations WHERE worker_id = $1",
        worker_id,
    )
    assert row is not None
    return int(row[0]), int(row[1])


async def ask(ledger: trio.MemorySendChannel[LedgerInbox], make: object) -> object:
    reply: Reply[object] = Reply()
    await ledger.send(make(reply))  # type: ignore[operator]
    return await reply.wait()


async def commit(
    ledger: trio.MemorySendChannel[LedgerInbox], job_ids: list[int], worker_id: str, incarnation: int
) -> list[CommittedAssignment]:
    placements = tuple(
        Placement(job_id=j, worker_id=worker_id, incarnation=incarnation, cpu_millis=100, memory_mb=10)
        for j in job_ids
    )
    result = await ask(
        ledger, lambda reply: CommitPlacements(epoch=1, placements=placements, reasons=(), reply=reply)
    )
    return sorted(result, key=lambda a: a.job_id)  # type: ignore[attr-defined]


async def end_orphans(
    ledger: trio.MemorySendChannel[LedgerInbox],
    caps: tuple[float, ...] = (),
    workers: tuple[tuple[str, int], ...] = (),
) -> ReconcileResult:
    result = await ask(
        ledger,
        lambda reply: DeclareDeadWorkers(
            epoch=1,
            workers=workers,
            dead_after_s=5.0,
            requeue_backoff_caps_s=caps,
            max_ended=LedgerSettings().max_rows_per_fenced_write,
            reply=reply,
        ),
    )
    assert isinstance(result, ReconcileResult)
    return result


async def withdraw(
    ledger: trio.MemorySendChannel[LedgerInbox], assignment_ids: list[int], caps: tuple[float, ...] = ()
) -> object:
    return await ask(
        ledger,
        lambda reply: EndAssignments(
            epoch=1,
            assignment_ids=tuple(assignment_ids),
            requeue=True,
            reason="unconfirmed",
            requeue_backoff_caps_s=caps,
            reply=reply,
        ),
    )


async def run_ledger(nursery: trio.Nursery, url: str) -> trio.MemorySendChannel[LedgerInbox]:
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    lease_send, _ = trio.open_memory_channel[LeaseInbox](8)
    ledger = Ledger(
        cp_id="cp-1", database_url=url, settings=LedgerSettings(), inbox=ledger_recv, lease_inbox=lease_send
    )
    await nursery.start(ledger.run)
    return ledger_send


async def confirm(db: PgConnection, incarnation: int, assignment_ids: list[int]) -> None:
    """A heartbeat of w-1 listing ``assignment_ids`` as running."""
    await db.fetchrow(queries.HEARTBEAT, "w-1", incarnation, assignment_ids, *[[]] * 8, 0, 0, 250, 2500)


async def finish(db: PgConnection, incarnation: int, assignment_id: int) -> None:
    """A heartbeat of w-1 reporting ``assignment_id`` succeeded."""
    outcome = ([assignment_id], ["succeeded"], [0], [None], [None], [None], [None], [""])
    await db.fetchrow(queries.HEARTBEAT, "w-1", incarnation, [], *outcome, 0, 0, 250, 2500)


async def test_window_counters_stay_exact_through_place_confirm_end_and_reregister(
    db: PgConnection, database_url: str
) -> None:
    """Six placements are six unconfirmed; a heartbeat confirming two moves them to confirmed;
    a finish of a confirmed one changes neither, of an unconfirmed one confirms it; a
    withdrawal only drops it; a re-registration zeroes both while the old incarnation's
    assignments are still active, and ending those (orphans) leaves the new incarnation's
    counters alone; its own placements count again. Every step matches the definition."""
    incarnation = await register(db, "w-1")
    jobs = await submit(db, 6)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, database_url)
        placed = [a.assignment_id for a in await commit(ledger, jobs, "w-1", incarnation)]
        assert await counters(db) == (6, 0)

        await confirm(db, incarnation, placed[:2])
        await confirm(db, incarnation, placed[:2])  # listed again: counted once
        assert await counters(db) == (4, 2)

        await finish(db, incarnation, placed[0])
        assert await counters(db) == (4, 2)
        await finish(db, incarnation, placed[2])
        assert await counters(db) == (3, 3)

        assert await withdraw(ledger, [placed[3]]) == (placed[3],)
        assert await counters(db) == (2, 3)

        again = await register(db, "w-1")
        assert await counters(db) == (0, 0)  # placed[1], [4], [5] are active, of the old incarnation
        result = await end_orphans(ledger)
        assert sorted(result.orphaned_assignment_ids) == sorted([placed[1], placed[4], placed[5]])
        assert await counters(db) == (0, 0)

        requeued = sorted([*result.requeued_job_ids, jobs[3]])
        fresh = await commit(ledger, requeued, "w-1", again)
        assert len(fresh) == 4 and await counters(db) == (4, 0)
        await confirm(db, again, [a.assignment_id for a in fresh])
        assert await counters(db) == (0, 4)
        nursery.cancel_scope.cancel()


async def test_jobs_lost_with_their_worker_wait_a_jittered_backoff_that_grows(
    db: PgConnection, database_url: str
) -> None:
    """Forty jobs of a worker declared dead are pending again with one loss each, not before a
    time spread below the first cap (2 s) from now, and a reason naming that time; one of them
    lost a second time (withdrawn unconfirmed) waits below the second cap (4 s)."""
    incarnation = await register(db, "w-1")
    jobs = await submit(db, 40)
    other = await register(db, "w-2")
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, database_url)
        await commit(ledger, jobs, "w-1", incarnation)
        await db.execute(
            "UPDATE workers SET last_heartbeat_at = now() - interval '1 minute' WHERE id = 'w-1'"
        )
        result = await end_orphans(ledger, caps=(2.0, 4.0), workers=(("w-1", incarnation),))
        assert result.dead_worker_ids == ("w-1",) and sorted(result.requeued_job_ids) == jobs
        # The wait is counted from the requeue's database time, which is the assignment's end.
        rows = await db.fetch(
            "SELECT j.losses, j.reason, j.state, extract(epoch FROM j.not_before - a.ended_at)::float8"
            " AS wait_s, to_char(j.not_before AT TIME ZONE 'UTC', 'HH24:MI:SS.MS') AS at"
            " FROM jobs j JOIN assignments a ON a.job_id = j.id ORDER BY j.id"
        )
        assert {(r["losses"], r["state"]) for r in rows} == {(1, "pending")}
        waits = [r["wait_s"] for r in rows]
        assert all(0 <= w <= 2.0 for w in waits) and len({round(w, 3) for w in waits}) > 20
        assert all(r["reason"] == f"backoff: placed again after {r['at']} UTC" for r in rows)
        assert re.fullmatch(r"backoff: placed again after \d\d:\d\d:\d\d\.\d{3} UTC", rows[0]["reason"])

        again = await commit(ledger, jobs[:1], "w-2", other)
        await withdraw(ledger, [again[0].assignment_id], caps=(2.0, 4.0))
        row = await db.fetchrow(
            "SELECT j.losses, extract(epoch FROM j.not_before - a.ended_at)::float8 AS wait_s"
            " FROM jobs j JOIN assignments a ON a.job_id = j.id WHERE a.id = $1",
            again[0].assignment_id,
        )
        assert row is not None and row["losses"] == 2 and 0 <= row["wait_s"] <= 4.0
        nursery.cancel_scope.cancel()


def make_placer(
    url: str, ledger: trio.MemorySendChannel[LedgerInbox]
) -> tuple[Placer, trio.MemoryReceiveChannel[DispatcherInbox]]:
    lease_send, _ = trio.open_memory_channel[LeaseInbox](8)
    dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](1000)
    _, roles_recv = trio.open_memory_channel[RoleChange](8)
    placer = Placer(
        settings=PlacerSettings(),
        store=PgPlacerStore(database_url=url, application_name="test placer"),
        role=RoleView(changes=roles_recv, lease_inbox=lease_send),
        ledger=ledger,
        dispatcher=dispatch_send,
    )
    return placer, dispatch_recv


async def test_the_placer_places_a_requeued_job_only_after_its_backoff(
    db: PgConnection, database_url: str
) -> None:
    """Two jobs lost with w-1 (backoff caps 1 s) and one never placed: the placer's rounds on
    w-2 place the fresh job at once; each lost job is placed only at or after its not_before
    (database time), and all are placed within a few seconds. A job whose not_before is set
    1 s ahead is left out of the rounds in that second and placed after it."""
    dead = await register(db, "w-1")
    lost = await submit(db, 2)
    alive = await register(db, "w-2")
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, database_url)
        await commit(ledger, lost, "w-1", dead)
        await db.execute(
            "UPDATE workers SET last_heartbeat_at = now() - interval '1 minute' WHERE id = 'w-1'"
        )
        await end_orphans(ledger, caps=(1.0,), workers=(("w-1", dead),))
        fresh = await submit(db, 1)
        held = await submit(db, 1)
        await db.execute("UPDATE jobs SET not_before = now() + interval '1 second' WHERE id = $1", held[0])
        placer, _ = make_placer(database_url, ledger)
        first = await placer.round(1)
        assert fresh[0] in {a.job_id for a in first} and held[0] not in {a.job_id for a in first}
        started = trio.current_time()
        with trio.fail_after(5):
            while await db.fetchval("SELECT count(*) FROM jobs WHERE state = 'pending'"):
                if trio.current_time() - started < 0.9:
                    assert await db.fetchval("SELECT state FROM jobs WHERE id = $1", held[0]) == "pending"
                await db.execute("UPDATE workers SET last_heartbeat_at = now() WHERE id = 'w-2'")
                await placer.round(1)
                await trio.sleep(0.05)
        rows = await db.fetch(
            "SELECT a.job_id, a.created_at >= j.not_before AS after_backoff, j.reason"
            "  FROM assignments a JOIN jobs j ON j.id = a.job_id"
            " WHERE a.worker_id = 'w-2' AND a.worker_incarnation = $1 ORDER BY a.job_id",
            alive,
        )
        assert [r["job_id"] for r in rows] == [*lost, *fresh, *held]
        assert [r["after_backoff"] for r in rows] == [True, True, None, True]
        assert {r["reason"] for r in rows} == {""}
        await placer.store.close()  # type: ignore[attr-defined]
        nursery.cancel_scope.cancel()


async def test_a_reregistered_worker_gets_the_initial_window_first_and_more_as_it_confirms(
    db: PgConnection, database_url: str
) -> None:
    """Sixty pending jobs, one worker with room for all: the first round places 16 (the
    initial window). The worker registers again (it fenced): its first round again places
    only 16, although 44 jobs wait; once a heartbeat confirms those 16, the next round places
    32."""
    first_life = await register(db, "w-1")
    await submit(db, 60)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, database_url)
        placer, _ = make_placer(database_url, ledger)
        placed = await placer.round(1)
        assert len(placed) == 16 and {a.incarnation for a in placed} == {first_life}

        second_life = await register(db, "w-1")
        await end_orphans(ledger)  # the old incarnation's 16 are lost and pending again (no backoff)
        placed = await placer.round(1)
        assert len(placed) == 16 and {a.incarnation for a in placed} == {second_life}
        assert await counters(db) == (16, 0)

        await confirm(db, second_life, [a.assignment_id for a in placed])
        placed = await placer.round(1)
        assert len(placed) == 32 and await counters(db) == (32, 16)
        await placer.store.close()  # type: ignore[attr-defined]
        nursery.cancel_scope.cancel()


async def test_a_heartbeat_does_not_wait_for_a_placement_on_its_worker(
    db: PgConnection, database_url: str
) -> None:
    """A placement statement keeps the allocation row of every worker it places on locked until
    it commits; that worker's heartbeat (liveness, and the statement's other reads) goes
    through meanwhile. With the allocation in the workers row, the heartbeat waited for the
    placement's commit, and PostgreSQL cancelled it at the ingest's lock timeout."""
    incarnation = await register(db, "w-1")
    [job] = await submit(db, 1)
    placing = await PgConnection.connect(database_url)
    heartbeat = await PgConnection.connect(database_url)
    try:
        await placing.execute("BEGIN")
        rows = await placing.fetch(
            queries.COMMIT_PLACEMENTS, [job], ["w-1"], [incarnation], 1, True, [], [], [], [], []
        )
        assert rows[0]["assignment_id"] is not None  # placed, not committed: its locks are held
        await heartbeat.execute("SET lock_timeout = '300ms'")
        before = await db.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'")
        row = await heartbeat.fetchrow(queries.HEARTBEAT, "w-1", incarnation, *[[]] * 9, 0, 0, 250, 2500)
        assert row is not None and row["alive"]
        assert await db.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'") > before
        await placing.execute("COMMIT")
    finally:
        await placing.close()
        await heartbeat.close()
