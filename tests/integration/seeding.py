"""Jobs written straight into the database, for tests that need pending jobs without a
ControlPlane service (the service's own SubmitJob statement also stores an idempotency key)."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.aio import PgConnection

INSERT_JOB = """
INSERT INTO jobs (name, cpu_millis, memory_mb, priority, runtime, sleep_ms, argv, pending_seq)
VALUES ($1, $2, $3, $4, $5, $6, $7, nextval('pending_seq'))
RETURNING id
"""


async def insert_job(
    db: PgConnection,
    name: str,
    cpu_millis: int,
    memory_mb: int,
    priority: int,
    runtime: str,
    sleep_ms: int | None,
    argv: Sequence[str] | None,
) -> int:
    """Store one pending job as a submission would; returns its id."""
    return int(
        await db.fetchval(
            INSERT_JOB,
            name,
            cpu_millis,
            memory_mb,
            priority,
            runtime,
            sleep_ms,
            None if argv is None else list(argv),
        )
    )
