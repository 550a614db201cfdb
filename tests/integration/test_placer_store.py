"""The placer's reads on a real PostgreSQL, with real concurrent transactions: one round's read
returns the fresh live workers and the jobs that became pending since the previous read; a job
whose transaction took a lower pending_seq but committed after a higher one was read is read,
and placed, by the first round after its commit, whichever read (full or incremental) it
missed, and so is a job requeued that way; an aborted transaction's jobs never show."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from seeding import insert_job
from serving import HOLD_LEASE, placer_with_ledger

from actors import queries
from actors.placer_store import PgPlacerStore
from runtime.aio import PgConnection, asyncio_bridge


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


async def submit(conn: PgConnection, name: str) -> tuple[int, int]:
    """Store one pending sleep job as a submission does, on ``conn`` (in its open transaction,
    if any); returns its id and pending_seq."""
    job_id = await insert_job(conn, name, 100, 10, 0, "sleep", 1000, None)
    seq = int(await conn.fetchval("SELECT pending_seq FROM jobs WHERE id = $1", job_id))
    return job_id, seq


async def placed_job_ids(db: PgConnection) -> set[int]:
    return {int(r["job_id"]) for r in await db.fetch("SELECT job_id FROM assignments")}


async def test_one_round_read_returns_fresh_workers_and_the_jobs_pending_since(
    db: PgConnection, database_url: str
) -> None:
    """The full read returns every pending job and a mark; the next read returns only the jobs
    that became pending since, with the live, fresh workers; a limited read stops at its limit
    and the next one goes on from there."""
    store = PgPlacerStore(database_url=database_url, application_name="test")
    try:
        waiting, mark = await store.pending_jobs(100)
        assert waiting == [] and mark.in_flight == ()
        await db.execute(
            "INSERT INTO workers"
            " (id, address, cpu_millis, memory_mb, incarnation, last_heartbeat_at, state)"
            " VALUES ('w-fresh', '127.0.0.1:1', 4000, 8192, 7, now(), 'alive'),"
            "        ('w-stale', '127.0.0.1:2', 4000, 8192, 8, now() - interval '1 minute', 'alive'),"
            "        ('w-dead', '127.0.0.1:3', 4000, 8192, 9, now(), 'dead')"
        )
        ids = [(await submit(db, f"j{n}"))[0] for n in range(5)]
        await db.execute("UPDATE jobs SET state = 'cancelled' WHERE id = $1", ids[4])
        await db.execute("UPDATE jobs SET reason = 'why' WHERE id = $1", ids[3])
        workers, waiting, after = await store.read_round(1.0, mark, 100)
        assert [(w.ref.worker_id, w.ref.incarnation, w.room.cpu_millis) for w in workers] == [
            ("w-fresh", 7, 4000)
        ]
        assert [w.job.job_id for w in waiting] == ids[:4]
        assert [w.reason for w in waiting] == ["", "", "", "why"]
        _, limited, first_two = await store.read_round(1.0, mark, 2)
        assert [w.job.job_id for w in limited] == ids[:2]
        _, rest, _ = await store.read_round(1.0, first_two, 2)
        assert [w.job.job_id for w in rest] == ids[2:4]
        _, none, _ = await store.read_round(1.0, after, 100)
        assert none == []
        assert await store.no_longer_pending([ids[3], ids[4]]) == [ids[4]]
    finally:
        await store.close()


async def test_a_job_whose_transaction_commits_after_a_read_is_returned_by_the_next(
    db: PgConnection, database_url: str
) -> None:
    """Transaction A takes a pending_seq and stays open while B takes a higher one and commits;
    a read returns B's job and names A as in flight; A commits and the next read returns A's
    job, then no read names A again. Transaction C's job, rolled back, never shows."""
    store = PgPlacerStore(database_url=database_url, application_name="test")
    slow = await PgConnection.connect(database_url)
    aborted = await PgConnection.connect(database_url)
    try:
        _, mark = await store.pending_jobs(100)
        await slow.execute("BEGIN")
        job_a, seq_a = await submit(slow, "a")
        await aborted.execute("BEGIN")
        await submit(aborted, "c")
        job_b, seq_b = await submit(db, "b")
        assert seq_a < seq_b
        _, waiting, mark = await store.read_round(1.0, mark, 100)
        assert [w.job.job_id for w in waiting] == [job_b]
        xid_a = int(await slow.fetchval("SELECT pg_current_xact_id()::text::bigint"))
        assert xid_a in mark.in_flight
        await slow.execute("COMMIT")
        await aborted.execute("ROLLBACK")
        _, waiting, mark = await store.read_round(1.0, mark, 100)
        assert [w.job.job_id for w in waiting] == [job_a]
        assert xid_a not in mark.in_flight
        _, waiting, mark = await store.read_round(1.0, mark, 100)
        assert waiting == [] and mark.in_flight == ()
    finally:
        await slow.close()
        await aborted.close()
        await store.close()


async def test_a_lower_pending_seq_committed_after_the_placers_full_read_is_placed_within_two_rounds(
    db: PgConnection, database_url: str
) -> None:
    """The issue's case, as after a database restart: the placer's first round (its full read)
    runs while a submission that took pending_seq n is still committing and one that took n+1
    has committed. The job of n+1 is placed in that round; n's commits next, and the next round
    or the one after places it (before, it waited for the resync 30 s later)."""
    incarnation = int(
        await db.fetchval(
            queries.REGISTER_WORKER, "w-1", "127.0.0.1:1", 8000, 8192, "{}", "run-1", 1, b"", "{}"
        )
    )
    await db.fetchrow(queries.HEARTBEAT, "w-1", incarnation, *[[]] * 9, 0, 0, 250, 2500)
    slow = await PgConnection.connect(database_url)
    async with placer_with_ledger(database_url) as placer:
        try:
            await slow.execute("BEGIN")
            late, seq_late = await submit(slow, "late")
            early, seq_early = await submit(db, "early")
            assert seq_late < seq_early
            await placer.round(1)
            assert await placed_job_ids(db) == {early}
            await slow.execute("COMMIT")
            for _ in range(2):
                await db.fetchrow(queries.HEARTBEAT, "w-1", incarnation, *[[]] * 9, 0, 0, 250, 2500)
                await placer.round(1)
            assert await placed_job_ids(db) == {early, late}
        finally:
            await slow.close()


async def test_a_requeue_that_commits_after_a_later_submission_is_read_by_the_next_read(
    db: PgConnection, database_url: str
) -> None:
    """A requeue (an unconfirmed assignment withdrawn) makes its job pending again in a
    transaction still open while a later submission commits and is read: the next read after
    the requeue commits returns the requeued job (a requeue marks the job with its own
    transaction, as a submission does)."""
    incarnation = int(
        await db.fetchval(
            queries.REGISTER_WORKER, "w-1", "127.0.0.1:1", 8000, 8192, "{}", "run-1", 1, b"", "{}"
        )
    )
    await db.fetchrow(queries.HEARTBEAT, "w-1", incarnation, *[[]] * 9, 0, 0, 250, 2500)
    placed, _ = await submit(db, "placed")
    row = await db.fetchrow(
        queries.COMMIT_PLACEMENTS, [placed], ["w-1"], [incarnation], 1, True, [], [], [], [], []
    )
    assert row is not None and row["assignment_id"] is not None
    store = PgPlacerStore(database_url=database_url, application_name="test")
    slow = await PgConnection.connect(database_url)
    try:
        waiting, mark = await store.pending_jobs(100)
        assert waiting == []
        await slow.execute("BEGIN")
        withdrawn = [row["assignment_id"]]
        await slow.fetch(queries.END_CANCELLED_ASSIGNMENTS, 1, withdrawn, "unconfirmed", True, [])
        later, _ = await submit(db, "later")
        _, waiting, mark = await store.read_round(1.0, mark, 100)
        assert [w.job.job_id for w in waiting] == [later]
        await slow.execute("COMMIT")
        _, waiting, mark = await store.read_round(1.0, mark, 100)
        assert [w.job.job_id for w in waiting] == [placed]
    finally:
        await slow.close()
        await store.close()


async def test_the_reads_say_which_jobs_are_container_jobs_and_which_workers_run_them(
    db: PgConnection, database_url: str
) -> None:
    """A container job reads as needing a container, and only a worker labelled
    container=docker as running them (no label, or container=none: not)."""
    store = PgPlacerStore(database_url=database_url, application_name="test")
    try:
        _, mark = await store.pending_jobs(100)
        await db.execute(
            "INSERT INTO workers"
            " (id, address, cpu_millis, memory_mb, incarnation, last_heartbeat_at, state, labels)"
            " VALUES ('w-docker', '127.0.0.1:1', 4000, 8192, 1, now(), 'alive', $1::jsonb),"
            "        ('w-none', '127.0.0.1:2', 4000, 8192, 2, now(), 'alive', $2::jsonb),"
            "        ('w-plain', '127.0.0.1:3', 4000, 8192, 3, now(), 'alive', '{}')",
            '{"container": "docker"}',
            '{"container": "none"}',
        )
        plain = await insert_job(db, "plain", 100, 10, 0, "command", None, ["true"])
        boxed = int(
            await db.fetchval(
                "INSERT INTO jobs (name, cpu_millis, memory_mb, priority, runtime, argv, image, pending_seq)"
                " VALUES ('boxed', 100, 10, 0, 'container', '{}', 'app:1', nextval('pending_seq'))"
                " RETURNING id"
            )
        )
        workers, waiting, _ = await store.read_round(1.0, mark, 100)
        assert sorted((w.ref.worker_id, w.room.runs_containers) for w in workers) == [
            ("w-docker", True),
            ("w-none", False),
            ("w-plain", False),
        ]
        assert [(w.job.job_id, w.job.needs_container) for w in waiting] == [(plain, False), (boxed, True)]
        full, _ = await store.pending_jobs(100)
        assert [(w.job.job_id, w.job.needs_container) for w in full] == [(plain, False), (boxed, True)]
        live = await store.live_workers(1.0)
        assert sorted(w.ref.worker_id for w in live if w.room.runs_containers) == ["w-docker"]
    finally:
        await store.close()
