"""The placer on a real database holds each account to its usage caps (docs/quotas.md): what its
assigned and running jobs hold, read with every round, plus what the round places; a job past
a cap stays pending with a reason naming it, stored once, and is placed once the cap allows."""

from __future__ import annotations

from seeding import insert_job
from serving import placer_with_ledger
from test_unschedulable_reasons import db, register, stored

from runtime.aio import PgConnection

__all__ = ["db"]  # the admin connection, a fixture


async def job_of(db: PgConnection, owner: str, name: str, priority: int = 0) -> int:
    job_id = await insert_job(db, name, 1000, 64, priority, "sleep", 1000, None)
    await db.execute("UPDATE jobs SET owner = $2 WHERE id = $1", job_id, owner)
    return job_id


async def states(db: PgConnection, job_ids: list[int]) -> list[tuple[str, str]]:
    rows = await db.fetch("SELECT state, reason FROM jobs WHERE id = ANY($1::bigint[]) ORDER BY id", job_ids)
    return [(r["state"], r["reason"]) for r in rows]


async def test_a_job_past_its_accounts_cpu_cap_waits_and_is_placed_once_the_cap_allows(
    db: PgConnection, database_url: str
) -> None:
    """alice's cap is 2000 cpu_millis: two of her three jobs are placed in the first round, the
    third waits naming the cap while bob's job after it is placed; later rounds (her use now
    read from her assigned jobs) neither place it nor write its row again, nor place a fourth
    job of hers that arrives; raising the cap to 3000 places the third and the fourth waits."""
    await register(db, "w-1", 16000)
    await db.execute("INSERT INTO accounts (name, cpu_millis) VALUES ('alice', 2000)")
    alices = [await job_of(db, "alice", f"a-{n}", priority=5) for n in range(3)]
    bobs = await job_of(db, "bob", "b-0")
    async with placer_with_ledger(database_url) as placer:

        async def round_() -> None:
            await db.execute("UPDATE workers SET last_heartbeat_at = now()")
            await placer.round(1)

        await round_()
        waiting = "quota: alice uses 2000 of 2000 cpu_millis"
        assert await states(db, [*alices, bobs]) == [
            ("assigned", ""),
            ("assigned", ""),
            ("pending", waiting),
            ("assigned", ""),
        ]
        first = await stored(db, [alices[2]])
        fourth = await job_of(db, "alice", "a-3", priority=5)
        for _ in range(3):
            await round_()
        assert await stored(db, [alices[2]]) == first
        assert await states(db, [fourth]) == [("pending", waiting)]
        await db.execute("UPDATE accounts SET cpu_millis = 3000 WHERE name = 'alice'")
        await round_()
        assert await states(db, [alices[2], fourth]) == [
            ("assigned", ""),
            ("pending", "quota: alice uses 3000 of 3000 cpu_millis"),
        ]
