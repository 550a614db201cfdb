"""Fair share's reads on a real PostgreSQL (queries.ACCOUNT_USE, ACCOUNT_PAST_USE through
:meth:`actors.placer_store.PgPlacerStore.account_shares`): what each account's assigned and
running jobs hold, its weight, and its decayed past use as
:func:`actors.fair_share.decayed_allocation` computes it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from seeding import insert_job
from serving import HOLD_LEASE

from actors.fair_share import AccountShare, decayed_allocation
from actors.placer_store import PgPlacerStore
from runtime.aio import PgConnection, asyncio_bridge

HALF_LIFE_S = 600.0


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[PgConnection]:
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        await conn.execute(HOLD_LEASE, 1)
        await conn.execute(
            "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation, last_heartbeat_at, state)"
            " VALUES ('w-1', '127.0.0.1:1', 64000, 65536, 1, now(), 'alive')"
        )
        try:
            yield conn
        finally:
            await conn.close()


async def run(
    db: PgConnection, owner: str, cpu: int, mem: int, *, started_ago_s: float, ended_ago_s: float | None
) -> None:
    """A job of ``owner`` with one run placed ``started_ago_s`` ago, ended ``ended_ago_s`` ago
    (None: still running)."""
    job_id = await insert_job(db, "j", cpu, mem, 0, "sleep", 1000, None)
    state = "running" if ended_ago_s is None else "succeeded"
    await db.execute("UPDATE jobs SET owner = $2, state = $3 WHERE id = $1", job_id, owner, state)
    await db.execute(
        "INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch,"
        " state, created_at, ended_at)"
        " VALUES ($1, 'w-1', 1, $2, $3, 1, $4, now() - make_interval(secs => $5::float8),"
        "         now() - make_interval(secs => $6::float8))",
        job_id,
        cpu,
        mem,
        "active" if ended_ago_s is None else "finished",
        started_ago_s,
        ended_ago_s,
    )


async def test_the_reads_give_use_weight_and_decayed_past_use(db: PgConnection, database_url: str) -> None:
    """alice runs 2,000 cpu_millis now (started a half-life ago) and ran 4,000 from 3 to 1
    half-lives ago; bob ran 1,000 long ago (more than 10 half-lives: left out) and weighs 3; carol
    has a weight of 1 and nothing: not listed."""
    await db.execute("INSERT INTO accounts (name, weight) VALUES ('bob', 3), ('carol', 1)")
    await run(db, "alice", 2000, 100, started_ago_s=HALF_LIFE_S, ended_ago_s=None)
    await run(db, "alice", 4000, 200, started_ago_s=3 * HALF_LIFE_S, ended_ago_s=HALF_LIFE_S)
    await run(db, "bob", 1000, 10, started_ago_s=30 * HALF_LIFE_S, ended_ago_s=11 * HALF_LIFE_S)
    store = PgPlacerStore(database_url=database_url, application_name="test")
    try:
        now_only = await store.account_shares(HALF_LIFE_S, with_past=False)
        assert now_only == {
            "alice": AccountShare(used_cpu_millis=2000, used_memory_mb=100),
            "bob": AccountShare(weight=3.0),
        }
        shares = await store.account_shares(HALF_LIFE_S, with_past=True)
        # The same use read with a round, in its one round trip; none unless asked for.
        _, mark = await store.pending_jobs(10)
        await store.read_round(1.0, mark, 10)
        assert store.account_use is None
        store.with_account_use = True
        await store.read_round(1.0, mark, 10)
        assert store.account_use == now_only
        await store.live_workers(1.0)
        assert store.account_use is None  # a full read reads no use
    finally:
        await store.close()
    assert set(shares) == {"alice", "bob"}
    alice = shares["alice"]
    want_cpu = decayed_allocation(2000, HALF_LIFE_S, 0, HALF_LIFE_S) + decayed_allocation(
        4000, 3 * HALF_LIFE_S, HALF_LIFE_S, HALF_LIFE_S
    )
    want_mem = decayed_allocation(100, HALF_LIFE_S, 0, HALF_LIFE_S) + decayed_allocation(
        200, 3 * HALF_LIFE_S, HALF_LIFE_S, HALF_LIFE_S
    )
    # The statement's now() is a moment after the rows': within a second of a 600 s half-life.
    assert alice.decayed_cpu_millis == pytest.approx(want_cpu, rel=1e-3)
    assert alice.decayed_memory_mb == pytest.approx(want_mem, rel=1e-3)
    assert (alice.used_cpu_millis, alice.weight) == (2000, 1.0)
    assert shares["bob"] == AccountShare(weight=3.0)
