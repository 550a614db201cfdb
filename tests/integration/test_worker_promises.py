"""Promises about a worker's future (a cordon, a drain, a clean leave, a registration that ends
an incarnation, a restart hold, a death) against a placement committing at the same moment,
with real transactions on a real PostgreSQL: the placement (``COMMIT_PLACEMENTS``) held open
on a connection of its own while the promise is asked, and the promise held open before its
commit while the placement is sent. Either the placement commits first and the promise
accounts for what it placed, or the promise commits first and nothing is placed on the worker.

The ingest's promises are held at the fault point ``ingest.promise_before_commit``, inside
their transaction, after their writes; the leader's (a death) and the restart hold run by hand
on an admin connection with the statements the leader and the ingest run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from serving import ingest_and_leader
from test_drain import Drains
from test_fenced_write_size import until

from actors import queries
from runtime import faults
from runtime.aio import PgConnection

EPOCH = 1
JOBS = 16


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Drains]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Drains(cp=cp, admin=admin, database_url=database_url)


async def a_lock_is_awaited(admin: PgConnection) -> bool:
    """Whether some session waits for a lock another holds."""
    return bool(await admin.fetchval("SELECT count(*) > 0 FROM pg_locks WHERE NOT granted"))


async def finished_or_waiting(done: trio.Event, admin: PgConnection) -> None:
    """Until ``done`` is set or some session waits for a lock."""

    async def check() -> bool:
        return done.is_set() or await a_lock_is_awaited(admin)

    await until(check)


async def place(url: str, jobs: list[int], worker_id: str, incarnation: int) -> list[int]:
    """The placer's fenced statement placing ``jobs`` on the worker, on a connection of its own;
    the assignment ids it created."""
    conn = await PgConnection.connect(url)
    try:
        rows = await conn.fetch(
            queries.COMMIT_PLACEMENTS,
            jobs,
            [worker_id] * len(jobs),
            [incarnation] * len(jobs),
            EPOCH,
            True,
            [],
            [],
            [],
            [],
            [],
        )
    finally:
        await conn.close()
    return [int(r["assignment_id"]) for r in rows if r["assignment_id"] is not None]


@asynccontextmanager
async def placement_held(url: str, jobs: list[int], worker_id: str, incarnation: int) -> AsyncIterator[int]:
    """``COMMIT_PLACEMENTS`` of ``jobs`` onto the worker inside a transaction held open for the
    body (committed on leaving); yields how many assignments it created."""
    conn = await PgConnection.connect(url)
    try:
        async with conn.transaction():
            rows = await conn.fetch(
                queries.COMMIT_PLACEMENTS,
                jobs,
                [worker_id] * len(jobs),
                [incarnation] * len(jobs),
                EPOCH,
                True,
                [],
                [],
                [],
                [],
                [],
            )
            yield sum(1 for r in rows if r["assignment_id"] is not None)
    finally:
        await conn.close()


async def placed_while(
    cluster: Drains, jobs: list[int], incarnation: int, held: Callable[[], AsyncIterator[None]]
) -> list[int]:
    """Send the placement of ``jobs`` onto w-1 while ``held`` (a promise held before its commit)
    is entered, let the promise commit once the placement waits (or is done), and return what
    the placement created."""
    placed: list[int] = []
    done = trio.Event()

    async def placement() -> None:
        placed.extend(await place(cluster.database_url, jobs, "w-1", incarnation))
        done.set()

    async with trio.open_nursery() as nursery, asynccontextmanager(held)():
        nursery.start_soon(placement)
        await finished_or_waiting(done, cluster.admin)
    return placed


def ingest_promise(call: Callable[[], Awaitable[Any]]) -> Callable[[], AsyncIterator[None]]:
    """A promise the ingest carries out, held at ``ingest.promise_before_commit`` for the body."""

    async def held() -> AsyncIterator[None]:
        parked, release = trio.Event(), trio.Event()

        async def park() -> None:
            parked.set()
            await release.wait()

        async with faults.installed("ingest.promise_before_commit", park), trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await parked.wait()
            try:
                yield
            finally:
                release.set()

    return held


def admin_promise(url: str, statement: str, *args: Any) -> Callable[[], AsyncIterator[None]]:
    """``statement`` run in a transaction on a connection of its own, held open for the body."""

    async def held() -> AsyncIterator[None]:
        conn = await PgConnection.connect(url)
        try:
            async with conn.transaction():
                assert await conn.fetch(statement, *args), "the promise changed nothing"
                yield
        finally:
            await conn.close()

    return held


async def pending_jobs(cluster: Drains, jobs: list[int]) -> list[int]:
    rows = await cluster.admin.fetch(
        "SELECT id FROM jobs WHERE id = ANY($1::bigint[]) AND state = 'pending' ORDER BY id", jobs
    )
    return [int(r["id"]) for r in rows]


async def test_a_drain_asked_while_a_placement_commits_waits_for_it_and_lists_every_job_it_placed(
    cluster: Drains,
) -> None:
    """A drain of w-1 asked while a placement of 16 jobs onto w-1 is still open waits for it,
    and its answer lists the 16 jobs (not "drained, no job left")."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(JOBS)]
    answers = []
    done = trio.Event()

    async def drain() -> None:
        answers.append(await cluster.drain("w-1"))
        done.set()

    async with (
        trio.open_nursery() as nursery,
        placement_held(cluster.database_url, jobs, "w-1", incarnation) as created,
    ):
        assert created == JOBS
        nursery.start_soon(drain)
        await finished_or_waiting(done, cluster.admin)
    (answer,) = answers
    assert (answer.draining, answer.drained) == (True, False)
    assert sorted(answer.job_ids) == sorted(jobs)


async def test_a_cordon_asked_while_a_placement_commits_lists_every_job_it_placed(cluster: Drains) -> None:
    """A cordon of w-1 asked while a placement onto w-1 is still open answers with its jobs."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(JOBS)]
    answers = []
    done = trio.Event()

    async def cordon() -> None:
        answers.append(await cluster.cordon("w-1"))
        done.set()

    async with (
        trio.open_nursery() as nursery,
        placement_held(cluster.database_url, jobs, "w-1", incarnation),
    ):
        nursery.start_soon(cordon)
        await finished_or_waiting(done, cluster.admin)
    assert sorted(answers[0].job_ids) == sorted(jobs)


@pytest.mark.parametrize("promise", ["cordon", "drain", "leave", "registration"])
async def test_a_placement_sent_while_an_ingest_promise_commits_places_nothing_on_the_worker(
    cluster: Drains, promise: str
) -> None:
    """A placement onto w-1 sent while a cordon, a drain, a clean leave or a new registration of
    w-1 is between its writes and its commit waits for it, then places nothing: the jobs stay
    pending."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(JOBS)]
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "cordon": lambda: cluster.cordon("w-1"),
        "drain": lambda: cluster.drain("w-1"),
        "leave": lambda: cluster.leave("w-1", incarnation),
        "registration": lambda: cluster.register("w-1", "run-b", heartbeat=False),
    }
    placed = await placed_while(cluster, jobs, incarnation, ingest_promise(calls[promise]))
    assert placed == []
    assert await pending_jobs(cluster, jobs) == sorted(jobs)


async def test_a_placement_sent_while_a_restart_hold_commits_places_nothing_on_the_worker(
    cluster: Drains,
) -> None:
    """A placement onto w-1 sent while a planned restart's hold of w-1 is uncommitted waits for
    it, then places nothing."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(JOBS)]
    hold = admin_promise(cluster.database_url, queries.SET_RESTART_HOLD, "w-1", incarnation, 30.0)
    assert await placed_while(cluster, jobs, incarnation, hold) == []
    assert await pending_jobs(cluster, jobs) == sorted(jobs)


async def test_a_placement_sent_while_a_death_declaration_commits_places_nothing_on_the_worker(
    cluster: Drains,
) -> None:
    """A placement onto w-1 sent while the leader's declaration of w-1's death is uncommitted
    waits for it, then places nothing."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(JOBS)]
    # Judged by the declaration's dead_after alone (0 s: silent now), not by the one told at
    # registration (docs/design.md, "Heartbeat interval").
    await cluster.admin.execute("UPDATE workers SET dead_after_ms = NULL")
    death = admin_promise(
        cluster.database_url, queries.DECLARE_DEAD_WORKERS, EPOCH, 0.0, ["w-1"], [incarnation], None
    )
    assert await placed_while(cluster, jobs, incarnation, death) == []
    assert await pending_jobs(cluster, jobs) == sorted(jobs)


async def test_a_death_declared_while_a_placement_commits_ends_what_it_placed_in_the_same_pass(
    cluster: Drains,
) -> None:
    """The leader's declaration of w-1's death, begun while a placement onto w-1 is still open,
    waits for it; the same fenced transaction's next statement ends every assignment it made."""
    incarnation = await cluster.register("w-1")
    jobs = [await cluster.submit() for _ in range(JOBS)]
    # Judged by the declaration's dead_after alone (0 s: silent now), not by the one told at
    # registration (docs/design.md, "Heartbeat interval").
    await cluster.admin.execute("UPDATE workers SET dead_after_ms = NULL")
    ended: list[int] = []
    done = trio.Event()

    async def declare() -> None:
        conn = await PgConnection.connect(cluster.database_url)
        try:
            async with conn.transaction():
                await conn.fetch(queries.DECLARE_DEAD_WORKERS, EPOCH, 0.0, ["w-1"], [incarnation], None)
                row = await conn.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 1000)
                assert row is not None
                ended.extend(int(j) for j in row["ended_job_ids"])
        finally:
            await conn.close()
        done.set()

    async with (
        trio.open_nursery() as nursery,
        placement_held(cluster.database_url, jobs, "w-1", incarnation),
    ):
        nursery.start_soon(declare)
        await finished_or_waiting(done, cluster.admin)
    assert sorted(ended) == sorted(jobs)
    assert await cluster.count("SELECT count(*) FROM assignments WHERE state = 'active'") == 0
