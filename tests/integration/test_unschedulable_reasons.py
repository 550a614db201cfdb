"""The placer on a real database with jobs no worker can hold: their reasons are stored once,
not written again by later rounds while the workers stay the same, and written again (only)
when a worker change changes them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from seeding import insert_job
from serving import HOLD_LEASE, placer_with_ledger

from actors import queries
from actors.idempotency import registration_digest
from runtime.aio import PgConnection, asyncio_bridge
from runtime.idempotency_keys import new_idempotency_key


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


async def register(db: PgConnection, worker_id: str, cpu_millis: int) -> None:
    """Register as ingest does, and heartbeat once as an agent does."""
    address = f"127.0.0.1:{len(worker_id)}"
    digest = registration_digest(address=address, cpu_millis=cpu_millis, memory_mb=8192, labels={})
    incarnation = int(
        await db.fetchval(
            queries.REGISTER_WORKER,
            worker_id,
            address,
            cpu_millis,
            8192,
            "{}",
            new_idempotency_key(),
            1,
            digest,
            "{}",
        )
    )
    await db.fetchrow(queries.HEARTBEAT, worker_id, incarnation, *[[]] * 9, 0, 0, 250, 2500)


async def stored(db: PgConnection, job_ids: list[int]) -> list[tuple[str, str]]:
    """(reason, xmin) of each job: xmin changes whenever its row is written."""
    rows = await db.fetch(
        "SELECT reason, xmin::text AS x FROM jobs WHERE id = ANY($1::bigint[]) ORDER BY id", job_ids
    )
    return [(r["reason"], r["x"]) for r in rows]


async def test_unschedulable_reasons_are_written_once_and_again_only_when_the_workers_change_them(
    db: PgConnection, database_url: str
) -> None:
    """Three jobs of 20000 cpu_millis beside an 8000 one: the first round stores their reason,
    the next rounds leave their rows unwritten; a 16000 worker joining rewrites the reason."""
    await register(db, "w-1", 8000)
    large = [await insert_job(db, f"large-{n}", 20000, 10, 0, "sleep", 1000, None) for n in range(3)]
    async with placer_with_ledger(database_url) as placer:

        async def round_() -> None:
            await db.execute("UPDATE workers SET last_heartbeat_at = now()")
            await placer.round(1)

        await round_()
        first = await stored(db, large)
        assert {r for r, _ in first} == {"unschedulable: needs 20000 cpu_millis, largest worker has 8000"}
        small = await insert_job(db, "small", 1000, 10, 0, "sleep", 1000, None)
        for _ in range(3):
            await round_()
        assert await db.fetchval("SELECT state FROM jobs WHERE id = $1", small) != "pending"
        assert await stored(db, large) == first
        await register(db, "w-2", 16000)
        await round_()
        after = await stored(db, large)
        assert {r for r, _ in after} == {"unschedulable: needs 20000 cpu_millis, largest worker has 16000"}
        assert all(x != y for (_, x), (_, y) in zip(first, after, strict=True))
