"""How much one heartbeat costs a control plane: handler time and database round trips.

Calls the ingest's Heartbeat handler directly (no gRPC), ``--count`` times for one worker with
``--running`` running assignments, and prints the handler time per heartbeat and the round
trips to the database per heartbeat (the pool's reset on release included)::

    python -m ops.bench.measure_heartbeat [--database-url URL] [--count 2000] [--running 4]

Without ``--database-url`` it starts an embedded PostgreSQL (fsync on) in a temporary folder.
Run from another checkout (``PYTHONPATH=that-checkout``), it measures that version's handler.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import asyncpg
import attrs

from actors import ingest, ingest_gate, ingest_heartbeats, queries, schema
from ops.bench.measuring import measure_parser, run_on_database
from protocol import pb
from runtime.aio import PgConnection, PgPool
from runtime.idempotency_keys import new_idempotency_key

_COUNTED = ("execute", "fetch", "fetchrow", "fetchval")


@attrs.frozen(kw_only=True)
class UpdateCounts:
    """A table's row updates as PostgreSQL's statistics counted them (``pg_stat_user_tables``)."""

    updates: int
    """Rows updated (``n_tup_upd``), since the statistics were last reset."""
    hot_updates: int
    """Of those, HOT updates (``n_tup_hot_upd``): no index entry written."""
    dead_rows: int
    """Dead row versions now (``n_dead_tup``), left for pruning or vacuum."""

    def __sub__(self, earlier: UpdateCounts) -> UpdateCounts:
        """The updates between ``earlier`` and these (dead rows: these)."""
        return UpdateCounts(
            updates=self.updates - earlier.updates,
            hot_updates=self.hot_updates - earlier.hot_updates,
            dead_rows=self.dead_rows,
        )

    @property
    def hot_share(self) -> float:
        """The share of updates that were HOT (0 to 1; 0 when none)."""
        return self.hot_updates / self.updates if self.updates else 0.0


async def table_update_counts(
    conn: PgConnection | asyncpg.Connection, table: str = "workers"
) -> UpdateCounts:
    """``table``'s update counts (:data:`actors.queries.TABLE_UPDATES`). They reach the view up
    to about a second after the writing transactions ended: wait that long after a run before
    reading its last counts.

    Raises:
        LookupError: no such table in the connection's schema.
    """
    row = await conn.fetchrow(queries.TABLE_UPDATES, table)
    if row is None:
        raise LookupError(f"table {table!r} not found in pg_stat_user_tables of the current schema")
    return UpdateCounts(updates=row["updates"], hot_updates=row["hot_updates"], dead_rows=row["dead_rows"])


def _count_round_trips() -> list[int]:
    """Count every call of an asyncpg connection's query methods (one round trip each, once
    the statement is prepared); returns the one-element counter."""
    counter = [0]
    for name in _COUNTED:
        original = getattr(asyncpg.connection.Connection, name)

        @functools.wraps(original)
        async def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            counter[0] += 1
            return await _original(self, *args, **kwargs)

        setattr(asyncpg.connection.Connection, name, counted)
    return counter


async def _open_pool(url: str) -> PgPool:
    open_pool = getattr(ingest, "open_pool", None)
    if open_pool is not None:
        settings = ingest.IngestSettings()  # type: ignore[attr-defined]
        return await open_pool("cp-m", url, settings)  # type: ignore[no-any-return]
    # A checkout from before open_pool: the pool as its Ingest.run made it.
    return await PgPool.create(
        url,
        size=8,
        server_settings={"application_name": "stockade cp-m ingest", **ingest_gate.SESSION_SETTINGS},
    )


async def measure(url: str, count: int, running: int) -> dict[str, float]:
    """Time ``count`` heartbeats (after 200 unmeasured ones) and count their round trips."""
    await schema.apply_schema(url)
    pool = await _open_pool(url)
    try:
        service = ingest.ControlPlaneService(cp_id="cp-m", pool=pool)
        reg = await service.register_worker(
            pb.RegisterWorkerRequest(
                worker_id="w-m",
                address="127.0.0.1:9",
                cpu_millis=64000,
                memory_mb=65536,
                agent_run_id=new_idempotency_key(),
                registration_seq=1,
            )
        )
        assignment_ids: list[int] = []
        async with pool.acquire() as conn:
            for index in range(running):
                submitted = await service.submit_job(
                    pb.SubmitJobRequest(
                        spec=pb.JobSpec(
                            name=f"j{index}",
                            cpu_millis=100,
                            memory_mb=10,
                            sleep=pb.SleepRuntime(duration_ms=60_000),
                        ),
                        idempotency_key=new_idempotency_key(),
                    )
                )
                job_id = submitted.job_id
                assignment_ids.append(
                    await conn.fetchval(
                        "INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis,"
                        " memory_mb, epoch) VALUES ($1, 'w-m', $2, 100, 10, 0) RETURNING id",
                        job_id,
                        reg.incarnation,
                    )
                )
            await conn.execute("UPDATE jobs SET state = 'assigned'")
        request = pb.HeartbeatRequest(
            worker_id="w-m", incarnation=reg.incarnation, running_assignment_ids=assignment_ids
        )
        for _ in range(200):
            reply = await service.heartbeat(request)
        assert not reply.reregister and not reply.stop_assignment_ids, reply
        counter = _count_round_trips()
        times_s: list[float] = []
        for _ in range(count):
            started = time.perf_counter()
            await service.heartbeat(request)
            times_s.append(time.perf_counter() - started)
        times_s.sort()
        return {
            "heartbeats": count,
            "running": running,
            "mean_ms": statistics.fmean(times_s) * 1000,
            "p50_ms": times_s[len(times_s) // 2] * 1000,
            "p99_ms": times_s[int(len(times_s) * 0.99)] * 1000,
            "round_trips_per_heartbeat": counter[0] / count,
        }
    finally:
        await pool.close()


def main() -> None:
    parser = measure_parser(__doc__, database_help="a database to use (its schema is applied)")
    parser.add_argument("--count", type=int, default=2000, help="heartbeats measured")
    parser.add_argument("--running", type=int, default=4, help="running assignments each heartbeat lists")
    args = parser.parse_args()

    result = run_on_database(args.database_url, lambda url: measure(url, args.count, args.running))
    print(f"heartbeat handler at {ingest_heartbeats.__file__}")
    for key, value in result.items():
        print(f"  {key:28} {value:.3f}" if isinstance(value, float) else f"  {key:28} {value}")


if __name__ == "__main__":
    main()
