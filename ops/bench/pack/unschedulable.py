"""``stockade bench unschedulable``: the real placer round while most pending jobs fit no worker.

A database holds ``unschedulable`` pending jobs larger than every worker and ``schedulable``
small ones behind ``workers`` busy simulated workers; before each round a little room is freed
on one worker so every round places a job or two. After ``settle`` rounds store the
unschedulable reasons, ``rounds`` rounds are timed (read, decision, fenced commit), as in
:func:`ops.bench.pack.scenarios.run_scale_point`.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import attrs
import trio

from ops.bench.pack.rounds import BenchPlacer, percentiles_ms
from ops.launcher.pg import EmbeddedPostgres
from ops.launcher.ports import free_port
from runtime.aio import PgConnection, asyncio_bridge


@attrs.frozen(kw_only=True)
class UnschedulableResult:
    """Round times (milliseconds) of the placer against a queue mostly of unschedulable jobs.

    Attributes:
        unschedulable, schedulable, workers: as :func:`run_unschedulable` was given them.
        first_round_ms: the round that read the whole queue.
        settle_rounds: rounds it took until every unschedulable reason was stored.
        rounds: rounds timed after that (p50, p99 and max of their wall time).
        round_cpu_p50_ms: the median CPU time of this process (placer and ledger) per timed round.
        placed: jobs placed in all rounds.
    """

    unschedulable: int
    schedulable: int
    workers: int
    first_round_ms: float
    settle_rounds: int
    rounds: int
    round_p50_ms: float
    round_p99_ms: float
    round_max_ms: float
    round_cpu_p50_ms: float
    placed: int

    def render(self) -> str:
        """One line per figure, for the terminal."""
        return "\n".join(f"{k}: {v}" for k, v in attrs.asdict(self).items())


async def _seed(db: PgConnection, *, unschedulable: int, schedulable: int) -> None:
    """The pending jobs (see the module docstring), in an emptied bench database."""
    # Too much CPU (20000..64000 in steps of 4000), too much memory, or both.
    await db.execute(
        "INSERT INTO jobs (name, cpu_millis, memory_mb, priority, runtime, sleep_ms, pending_seq)"
        " SELECT 'too-large',"
        " CASE WHEN i % 3 = 1 THEN 1000 ELSE 20000 + 4000 * (i % 12) END,"
        " CASE WHEN i % 3 = 0 THEN 1024 ELSE 40000 + 8192 * (i % 4) END,"
        " i % 3, 'sleep', 1000, nextval('pending_seq')"
        " FROM generate_series(1, $1) i",
        unschedulable,
    )
    await db.execute(
        "INSERT INTO jobs (name, cpu_millis, memory_mb, priority, runtime, sleep_ms, pending_seq)"
        " SELECT 'small', (ARRAY[250,500,1000,2000])[1 + i % 4], (ARRAY[256,512,1024])[1 + i % 3],"
        " i % 3, 'sleep', 1000, nextval('pending_seq')"
        " FROM generate_series(1, $1) i",
        schedulable,
    )
    await db.execute("ANALYZE")


async def run_unschedulable(
    database_url: str,
    *,
    unschedulable: int = 100_000,
    schedulable: int = 10_000,
    workers: int = 100,
    rounds: int = 200,
    max_settle_rounds: int = 1_000,
) -> UnschedulableResult:
    """Time the real placer round (see the module docstring) on the database at ``database_url``
    (its tables are emptied first).

    Args:
        database_url: a PostgreSQL the bench may own.
        unschedulable: pending jobs larger than every worker.
        schedulable: small pending jobs.
        workers: simulated workers.
        rounds: rounds timed once the reasons are stored.
        max_settle_rounds: most rounds run to store the reasons before timing begins.
    """
    rng = random.Random(unschedulable + schedulable + workers)
    async with asyncio_bridge(), BenchPlacer.open(database_url, workers=workers, rng=rng) as bench:
        await bench.add_busy_workers()
        await _seed(bench.db, unschedulable=unschedulable, schedulable=schedulable)
        times: list[float] = []
        cpu_times: list[float] = []
        first_ms, _ = await bench.round()  # reads the whole queue once
        settle = 0
        while (
            sum(1 for r in bench.placer.queue.reasons.values() if r.startswith("unschedulable"))
            < unschedulable
            and settle < max_settle_rounds
        ):
            await bench.round()
            settle += 1
        for _ in range(rounds):
            wall_ms, cpu_ms = await bench.round()
            times.append(wall_ms)
            cpu_times.append(cpu_ms)
    p50, p99, top = percentiles_ms(times)
    return UnschedulableResult(
        unschedulable=unschedulable,
        schedulable=schedulable,
        workers=workers,
        first_round_ms=round(first_ms, 1),
        settle_rounds=settle,
        rounds=len(times),
        round_p50_ms=p50,
        round_p99_ms=p99,
        round_max_ms=top,
        round_cpu_p50_ms=round(statistics.median(cpu_times), 2),
        placed=bench.placer.stats.placements,
    )


def bench_unschedulable(root: Path, **kwargs: int) -> UnschedulableResult:
    """:func:`run_unschedulable` on an embedded PostgreSQL of its own in ``root``, stopped after.

    Raises:
        EmbeddedPostgresError: the database could not be started.
    """
    server = EmbeddedPostgres(data_dir=root / "unschedulable-pg", port=free_port())
    url = server.start()
    try:
        return trio.run(lambda: run_unschedulable(url, **kwargs))
    finally:
        server.stop()
