"""How long a fenced write holds the lease's share lock, and how long a renewal waits for it.

Runs the ledger's fenced writes (a dead worker's ``--assignments`` ended, ``--placements``
placements committed), each all at once and in ``--batch`` rows, ``--repeat`` times, while
another connection renews the lease back to back (1 s statement timeout), and prints the hold
(from the fence's ``FOR KEY SHARE`` to the COMMIT's answer: an upper bound of the share lock)
and the longest renewal meanwhile. Without ``--database-url`` it starts an embedded PostgreSQL.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from actors import queries, schema
from ops.bench.measuring import measure_parser, run_on_database
from runtime.aio import PgConnection

EPOCH = 1
HOLDER = "cp-m"
WORKERS = 10
"""Alive workers the placements go to (round robin)."""

_SESSION = {"application_name": "stockade measure fence", "plan_cache_mode": "force_generic_plan"}


@attrs.frozen(kw_only=True)
class Sample:
    """One fenced write (or one series of batches) and the renewals sent while it ran."""

    transactions: int
    longest_hold_s: float
    total_s: float
    longest_renewal_s: float


@attrs.define
class Renewals:
    """Renews the lease back to back on a connection of its own; remembers each renewal's
    start (``time.monotonic``) and duration (seconds)."""

    conn: PgConnection
    timings: list[tuple[float, float]] = attrs.field(factory=list)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            renewed = await self.conn.fetchval(queries.RENEW_LEASE, HOLDER, EPOCH, 3600.0)
            assert renewed == EPOCH
            self.timings.append((started, time.monotonic() - started))
            await trio.sleep(0.002)

    def longest_since(self, since: float) -> float:
        """The longest renewal that ended after ``since`` (seconds)."""
        return max((d for s, d in self.timings if s + d >= since), default=0.0)


async def _prepare(conn: PgConnection) -> None:
    await conn.execute(
        "UPDATE lease SET holder = $1, epoch = $2, expires_at = now() + interval '1 hour'", HOLDER, EPOCH
    )
    await conn.execute(
        "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
        " SELECT 'p-' || g, '127.0.0.1:1', 1000000, 1000000, 1 FROM generate_series(1, $1) g",
        WORKERS,
    )


async def _dead_worker_with(conn: PgConnection, worker_id: str, count: int) -> None:
    """``worker_id`` (incarnation 1) running ``count`` jobs, then declared dead."""
    await conn.execute(
        "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
        " VALUES ($1, '127.0.0.1:1', 1000000, 1000000, 1)",
        worker_id,
    )
    await conn.execute(
        "WITH j AS (INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, state, attempts)"
        "           SELECT 'm-' || g, 10, 16, 'sleep', 60000, 'running', 1"
        "             FROM generate_series(1, $2) g RETURNING id)"
        " INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch,"
        "                          confirmed_at)"
        " SELECT id, $1, 1, 10, 16, $3, now() FROM j",
        worker_id,
        count,
        EPOCH,
    )
    await conn.execute("UPDATE workers SET state = 'dead', dead_at = now() WHERE id = $1", worker_id)


async def _pending_jobs(conn: PgConnection, count: int) -> list[int]:
    rows = await conn.fetch(
        "INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, pending_seq)"
        " SELECT 'p-' || g, 10, 16, 'sleep', 60000, nextval('pending_seq')"
        "   FROM generate_series(1, $1) g RETURNING id",
        count,
    )
    return [int(r["id"]) for r in rows]


async def _timed(renewals: Renewals, batches: Callable[[], Awaitable[tuple[float, bool]]]) -> Sample:
    """Run ``batches`` (one fenced write; returns its hold and whether more remain) until none
    remain; the renewals are watched from the first write's start to the last one's end."""
    await trio.sleep(0.05)  # a few renewals before, so one is in flight when the write starts
    started = time.monotonic()
    holds: list[float] = []
    more = True
    while more:
        hold_s, more = await batches()
        holds.append(hold_s)
    total_s = time.monotonic() - started
    await trio.sleep(0.05)  # the renewal that waited behind the last commit has ended
    return Sample(
        transactions=len(holds),
        longest_hold_s=max(holds),
        total_s=total_s,
        longest_renewal_s=renewals.longest_since(started),
    )


async def end_orphans(conn: PgConnection, renewals: Renewals, count: int, batch: int) -> Sample:
    """End a dead worker's ``count`` assignments, ``batch`` per fenced transaction."""
    worker_id = f"d-{time.monotonic_ns()}"
    await _dead_worker_with(conn, worker_id, count)

    async def one() -> tuple[float, bool]:
        await conn.execute("BEGIN")
        started = time.monotonic()
        assert await conn.fetchval(queries.FENCE_EPOCH) == EPOCH
        row = await conn.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [0.5, 1.0], batch)
        await conn.execute("COMMIT")
        assert row is not None
        return time.monotonic() - started, bool(row["more"])

    sample = await _timed(renewals, one)
    left = await conn.fetchval(
        "SELECT count(*) FROM assignments WHERE worker_id = $1 AND state = 'active'", worker_id
    )
    assert left == 0, left
    return sample


async def place(conn: PgConnection, renewals: Renewals, count: int, batch: int) -> Sample:
    """Commit ``count`` placements, ``batch`` per placement statement."""
    job_ids = await _pending_jobs(conn, count)
    slices = [job_ids[i : i + batch] for i in range(0, len(job_ids), batch)]

    async def one() -> tuple[float, bool]:
        ids = slices.pop(0)
        workers = [f"p-{1 + i % WORKERS}" for i in range(len(ids))]
        started = time.monotonic()
        rows = await conn.fetch(
            queries.COMMIT_PLACEMENTS, ids, workers, [1] * len(ids), EPOCH, True, [], [], [], [], []
        )
        hold_s = time.monotonic() - started
        assert len(rows) == len(ids) and rows[0]["epoch_seen"] == EPOCH
        return hold_s, bool(slices)

    sample = await _timed(renewals, one)
    # Free the workers' room again, outside the measurement.
    await conn.execute(
        "UPDATE assignments SET state = 'finished' WHERE state = 'active' AND worker_id LIKE 'p-%'"
    )
    return sample


async def measure(
    url: str, *, assignments: int, placements: int, batch: int, repeat: int
) -> list[tuple[str, list[Sample]]]:
    """Every shape ``repeat`` times; (label, samples) per shape."""
    await schema.apply_schema(url)
    conn = await PgConnection.connect(url, server_settings=_SESSION)
    renewer = await PgConnection.connect(
        url, server_settings={"application_name": "stockade measure lease", "statement_timeout": "1000"}
    )
    results: dict[str, list[Sample]] = {}
    shapes: list[tuple[str, Callable[[], Awaitable[Sample]]]] = [
        (
            f"end {assignments} assignments, one transaction",
            lambda: end_orphans(conn, renewals, assignments, assignments + 1),
        ),
        (
            f"end {assignments} assignments, {batch} per transaction",
            lambda: end_orphans(conn, renewals, assignments, batch),
        ),
        (f"{placements} placements, one statement", lambda: place(conn, renewals, placements, placements)),
        (f"{placements} placements, {batch} per statement", lambda: place(conn, renewals, placements, batch)),
    ]
    try:
        await _prepare(conn)
        renewals = Renewals(renewer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(renewals.run)
            for _ in range(repeat):
                for label, run in shapes:
                    results.setdefault(label, []).append(await run())
            nursery.cancel_scope.cancel()
    finally:
        await conn.close()
        await renewer.close()
    return list(results.items())


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} {max(values) * 1000:7.1f}"


def main() -> None:
    parser = measure_parser(__doc__, database_help="a database to use (its schema is applied; it gets rows)")
    parser.add_argument("--assignments", type=int, default=2000, help="a dead worker's active assignments")
    parser.add_argument("--placements", type=int, default=2000, help="placements committed")
    parser.add_argument("--batch", type=int, default=500, help="rows per fenced write when sliced")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each shape")
    args = parser.parse_args()

    results = run_on_database(
        args.database_url,
        lambda url: measure(
            url,
            assignments=args.assignments,
            placements=args.placements,
            batch=args.batch,
            repeat=args.repeat,
        ),
    )
    print(f"{args.repeat} runs each; ms, median and worst")
    print(f"{'write':48} {'txns':>5} {'hold (longest txn)':>19} {'all txns':>15} {'renewal wait':>15}")
    for label, samples in results:
        print(
            f"{label:48} {samples[0].transactions:5d} "
            f"{_ms([s.longest_hold_s for s in samples]):>19} {_ms([s.total_s for s in samples]):>15} "
            f"{_ms([s.longest_renewal_s for s in samples]):>15}"
        )


if __name__ == "__main__":
    main()
