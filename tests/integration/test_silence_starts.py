"""Where a worker's silence starts, on a real PostgreSQL through a real ingest (gRPC), with real
transactions held open: a registration, a continued registration and a heartbeat that take
longer than ``dead_after`` to commit (held at ``ingest.promise_before_commit``, or waiting for
the worker's row lock) count the worker's silence from their end, not their start, so the
leader's declaration (``DECLARE_DEAD_WORKERS``, run by hand as the leader runs it) does not find
a worker dead that it has just answered.

Each hold lasts ``HOLD_S`` of database time; the declaration is then asked with that same
``dead_after``: counted from the transaction's start the worker is past it, counted from the
answer it is not.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

import pytest
import trio
from serving import HOLD_LEASE, serve_ingests
from test_fenced_write_size import until
from test_restart_registration import OLD_RUN, Restarts
from test_worker_promises import a_lock_is_awaited

from actors import queries
from runtime import faults
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.settings.control_plane import IngestSettings

EPOCH = 1
HOLD_S = 2.0
"""How long (database time) each transaction is held open; also the ``dead_after`` asked."""


SLOW = IngestSettings(
    pool_size=2,
    liveness_reserved_connections=1,
    idle_in_transaction_timeout_s=30.0,
    lock_timeout_s=30.0,
)
"""The ingest's bounds on a transaction's idle time and lock waits raised past ``HOLD_S``, as
slow statements (many outcomes, a loaded database) may take that long within the defaults."""


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Restarts]:
    async with serve_ingests(database_url, "cp-1", settings=SLOW) as (ingest,):
        cp = ControlPlaneClient([ingest.address], timeout_s=30.0)
        admin = await PgConnection.connect(database_url)
        try:
            await admin.execute(HOLD_LEASE, EPOCH)
            yield Restarts(cp=cp, admin=admin, database_url=database_url)
        finally:
            cp.close()
            await admin.close()


async def database_clock(admin: PgConnection) -> datetime.datetime:
    at: datetime.datetime = await admin.fetchval("SELECT clock_timestamp()")
    return at


async def hold_for_database_time(admin: PgConnection, seconds: float) -> datetime.datetime:
    """Wait until ``seconds`` of database time have passed from now; the database's time then."""
    since = await database_clock(admin)
    end = since + datetime.timedelta(seconds=seconds)

    async def passed() -> bool:
        return await database_clock(admin) > end

    await until(passed)
    return await database_clock(admin)


async def heard(cluster: Restarts, worker_id: str) -> tuple[datetime.datetime, datetime.datetime]:
    row = await cluster.admin.fetchrow(
        "SELECT last_heartbeat_at, registered_at FROM workers WHERE id = $1", worker_id
    )
    assert row is not None
    return row["last_heartbeat_at"], row["registered_at"]


async def declared_dead(cluster: Restarts, worker_id: str, incarnation: int) -> list[str]:
    rows = await cluster.admin.fetch(
        queries.DECLARE_DEAD_WORKERS, EPOCH, HOLD_S, [worker_id], [incarnation], None
    )
    return [r["id"] for r in rows]


async def test_a_registration_that_commits_late_counts_silence_from_its_commit(cluster: Restarts) -> None:
    """A registration held open for longer than dead_after before its commit leaves the worker
    heard at its end (last_heartbeat_at and registered_at both at or after the release, still
    equal), and the leader's declaration does not find it dead."""
    released: list[datetime.datetime] = []

    async def park() -> None:
        released.append(await hold_for_database_time(cluster.admin, HOLD_S))

    async with faults.installed("ingest.promise_before_commit", park):
        incarnation = await cluster.register("w-1", heartbeat=False)
    last_heartbeat_at, registered_at = await heard(cluster, "w-1")
    assert last_heartbeat_at >= released[0]
    assert registered_at == last_heartbeat_at  # no heartbeat of the new incarnation yet
    assert await declared_dead(cluster, "w-1", incarnation) == []


async def test_a_continued_registration_that_commits_late_counts_silence_from_its_commit(
    cluster: Restarts,
) -> None:
    """A restarted agent's registration continuing its incarnation, held open for longer than
    dead_after, leaves the worker heard at its end; the declaration does not find it dead."""
    incarnation = await cluster.register("w-1", OLD_RUN)
    released: list[datetime.datetime] = []

    async def park() -> None:
        released.append(await hold_for_database_time(cluster.admin, HOLD_S))

    async with faults.installed("ingest.promise_before_commit", park):
        reply = await cluster.resume("w-1", incarnation)
    assert reply.resumed
    last_heartbeat_at, _ = await heard(cluster, "w-1")
    assert last_heartbeat_at >= released[0]
    assert await declared_dead(cluster, "w-1", incarnation) == []


async def test_a_heartbeat_that_waits_for_the_workers_row_counts_silence_from_its_end(
    cluster: Restarts,
) -> None:
    """A heartbeat whose statement waits longer than dead_after for the worker's row (locked by
    another transaction, as a registration or a promise locks it) leaves the worker heard when
    the statement ends; the declaration does not find it dead."""
    incarnation = await cluster.register("w-1")
    locker = await PgConnection.connect(cluster.database_url)
    answered = trio.Event()

    async def heartbeat() -> None:
        assert not (await cluster.heartbeat("w-1", incarnation)).reregister
        answered.set()

    try:
        async with trio.open_nursery() as nursery:
            async with locker.transaction():
                await locker.fetchval(queries.LOCK_WORKER, "w-1")
                nursery.start_soon(heartbeat)

                async def waiting() -> bool:
                    return await a_lock_is_awaited(cluster.admin)

                await until(waiting)
                released = await hold_for_database_time(cluster.admin, HOLD_S)
            await answered.wait()
    finally:
        await locker.close()
    last_heartbeat_at, _ = await heard(cluster, "w-1")
    assert last_heartbeat_at >= released
    assert await declared_dead(cluster, "w-1", incarnation) == []


async def test_a_registration_answered_again_counts_silence_from_that_answer(cluster: Restarts) -> None:
    """A registration whose first answer was lost (it committed) and that its agent sends again
    more than dead_after later is answered again with the same incarnation, and the worker's
    silence counts from that answer: the declaration does not find it dead."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    released = await hold_for_database_time(cluster.admin, HOLD_S)
    assert await cluster.register("w-1", heartbeat=False) == incarnation  # the same run and number
    last_heartbeat_at, _ = await heard(cluster, "w-1")
    assert last_heartbeat_at >= released
    assert await declared_dead(cluster, "w-1", incarnation) == []
