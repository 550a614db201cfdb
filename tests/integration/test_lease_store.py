"""The lease on a real PostgreSQL: a killed leader (its session gone) is replaced at once, a
frozen one (session alive) only when its lease expires, a released one at once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from actors.lease import PgLeaseStore
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DatabaseUnavailable


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[PgLeaseStore, PgLeaseStore, PgLeaseStore]]:
    """Three lease stores (cp-1, cp-2, cp-3), each on its own connection."""
    async with asyncio_bridge():
        made = [
            PgLeaseStore(database_url=database_url, application_name=f"cp-{i}", statement_timeout_s=2.0)
            for i in (1, 2, 3)
        ]
        try:
            yield made[0], made[1], made[2]
        finally:
            for store in made:
                await store.close()


async def session_of(store: PgLeaseStore) -> PgConnection:
    return await store._connection()


async def take_over_within(store: PgLeaseStore, holder: str, timeout_s: float = 2.0) -> int | None:
    """Probe every 20 ms, as a standby does, until it takes the lease or ``timeout_s`` passes.
    (The server sees a killed client's socket close a moment after the kill.)"""
    with trio.move_on_after(timeout_s):
        while True:
            epoch = await store.try_take_over(holder, 30.0)
            if epoch is not None:
                return epoch
            await trio.sleep(0.02)
    return None


async def renew_within(store: PgLeaseStore, holder: str, epoch: int, timeout_s: float = 2.0) -> bool:
    """Renew as the keeper does: a lock still held by the old session means try again."""
    with trio.move_on_after(timeout_s):
        while True:
            try:
                return await store.renew(holder, epoch, 30.0)
            except DatabaseUnavailable:
                await trio.sleep(0.02)
    raise AssertionError("renewal neither succeeded nor failed in time")


async def test_a_killed_leaders_lease_is_taken_at_once(stores: tuple[PgLeaseStore, ...]) -> None:
    """cp-1 holds a 30 s lease; once its session ends the standby takes it on its next probe."""
    leader, standby, _ = stores
    assert await leader.try_take_over("cp-1", 30.0) == 1
    assert await standby.try_take_over("cp-2", 30.0) is None
    (await session_of(leader)).terminate()
    assert await take_over_within(standby, "cp-2", 1.0) == 2


async def test_a_frozen_leaders_lease_is_taken_only_when_it_expires(stores: tuple[PgLeaseStore, ...]) -> None:
    """A leader that stops renewing but keeps its session is replaced at expiry, not before."""
    leader, standby, _ = stores
    assert await leader.try_take_over("cp-1", 0.5) == 1
    assert await standby.try_take_over("cp-2", 0.5) is None
    await trio.sleep(0.6)
    assert await standby.try_take_over("cp-2", 0.5) == 2
    assert not await leader.renew("cp-1", 1, 0.5)  # the woken leader finds itself deposed


async def test_a_released_lease_is_taken_at_once(stores: tuple[PgLeaseStore, ...]) -> None:
    """A leader stopping cleanly expires its lease; the standby takes it immediately."""
    leader, standby, _ = stores
    assert await leader.try_take_over("cp-1", 30.0) == 1
    await leader.release("cp-1", 1)
    assert await standby.try_take_over("cp-2", 30.0) == 2


async def test_one_standby_wins_an_orphaned_lease(stores: tuple[PgLeaseStore, ...]) -> None:
    """Two standbys probing a dead leader's lease: the first takes it, the second sees a live
    leader of the new epoch and waits."""
    leader, second, third = stores
    assert await leader.try_take_over("cp-1", 30.0) == 1
    (await session_of(leader)).terminate()
    assert await take_over_within(second, "cp-2", 1.0) == 2
    assert await third.try_take_over("cp-3", 30.0) is None


async def test_a_leader_that_reconnects_keeps_its_lease_unless_someone_took_it(
    stores: tuple[PgLeaseStore, ...],
) -> None:
    """After losing its connection the leader takes its epoch's lock again and renews; if a
    standby was faster, the renewal reports the lease lost."""
    leader, standby, _ = stores
    assert await leader.try_take_over("cp-1", 30.0) == 1
    (await session_of(leader)).terminate()
    assert await renew_within(leader, "cp-1", 1)  # reconnected, relocked, renewed
    assert await standby.try_take_over("cp-2", 30.0) is None
    (await session_of(leader)).terminate()
    assert await take_over_within(standby, "cp-2", 1.0) == 2
    assert not await renew_within(leader, "cp-1", 1)


async def causes(store: PgLeaseStore) -> list[tuple[int, str, str]]:
    rows = await (await session_of(store)).fetch(
        "SELECT epoch, holder, cause FROM lease_history ORDER BY epoch"
    )
    return [(int(r["epoch"]), r["holder"], r["cause"]) for r in rows]


async def test_each_takeover_records_why_it_happened(stores: tuple[PgLeaseStore, ...]) -> None:
    """lease_history says first for the first holder, released after a clean step-down,
    expired after a holder stopped renewing, session_ended after its session died."""
    first, second, third = stores
    assert await first.try_take_over("cp-1", 30.0) == 1
    await first.release("cp-1", 1)
    assert await second.try_take_over("cp-2", 0.3) == 2
    await trio.sleep(0.4)
    assert await third.try_take_over("cp-3", 30.0) == 3
    (await session_of(third)).terminate()
    assert await take_over_within(first, "cp-1", 1.0) == 4
    assert await causes(first) == [
        (1, "cp-1", "first"),
        (2, "cp-2", "released"),
        (3, "cp-3", "expired"),
        (4, "cp-1", "session_ended"),
    ]
