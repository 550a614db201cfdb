"""The placer's reads on a real PostgreSQL: one round's read returns the fresh live workers and
exactly the pending jobs it asked for (above a sequence number, or at skipped ones)."""

from __future__ import annotations

from actors.placer import PgPlacerStore
from runtime.aio import PgConnection, asyncio_bridge


async def test_one_round_read_returns_fresh_workers_and_new_or_skipped_pending_jobs(
    database_url: str,
) -> None:
    async with asyncio_bridge():
        admin = await PgConnection.connect(database_url)
        store = PgPlacerStore(database_url=database_url, application_name="test")
        try:
            workers, waiting = await store.read_round(1.0, 0, [], 100)
            assert (workers, waiting) == ([], [])  # empty arrays come back as empty lists

            await admin.execute(
                "INSERT INTO workers"
                " (id, address, cpu_millis, memory_mb, incarnation, last_heartbeat_at, state)"
                " VALUES ('w-fresh', '127.0.0.1:1', 4000, 8192, 7, now(), 'alive'),"
                "        ('w-stale', '127.0.0.1:2', 4000, 8192, 8, now() - interval '1 minute', 'alive'),"
                "        ('w-dead', '127.0.0.1:3', 4000, 8192, 9, now(), 'dead')"
            )
            await admin.execute(
                "INSERT INTO jobs"
                " (name, cpu_millis, memory_mb, priority, runtime, sleep_ms, pending_seq, reason)"
                " SELECT 'j' || s, 100 * s, 10 * s, s % 2, 'sleep', 1000, s,"
                " CASE s WHEN 4 THEN 'why' ELSE '' END"
                " FROM generate_series(1, 5) s"
            )
            await admin.execute("UPDATE jobs SET state = 'cancelled' WHERE pending_seq = 5")

            workers, waiting = await store.read_round(1.0, 3, [1], 100)
            assert [(w.ref.worker_id, w.ref.incarnation, w.room.cpu_millis) for w in workers] == [
                ("w-fresh", 7, 4000)
            ]
            # seq 4 is above 3, seq 1 was skipped; 2 is neither, 5 is no longer pending.
            assert sorted((w.pending_seq, w.job.cpu_millis, w.job.priority, w.reason) for w in waiting) == [
                (1, 100, 1, ""),
                (4, 400, 0, "why"),
            ]
            assert await store.no_longer_pending([4, 5]) == [5]  # 5 was cancelled
            _, limited = await store.read_round(1.0, 0, [], 2)
            assert [w.pending_seq for w in limited] == [1, 2]
        finally:
            await store.close()
            await admin.close()
