"""Device units on a real PostgreSQL (docs/devices.md): the placer's round gives jobs distinct
units of the workers that offer them and the fenced commit records them; the database refuses a
second active holder of a unit; an assignment's end frees its units, however it ends; a job
asking a resource no worker offers waits, saying so."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from seeding import insert_job
from serving import HOLD_LEASE, placer_with_ledger

from actors import queries
from actors.console.views import devices_of
from actors.dispatcher import assignment_message
from actors.ingest_replies import _worker_info
from actors.placer_store import PgPlacerStore
from actors.queries import console as console_queries
from actors.reconciler_store import _delivery
from ops.cli.render import worker_devices
from ops.client.results import worker_from_pb
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DuplicateKey
from runtime.settings.leader import PlacerSettings

SETTINGS = PlacerSettings(trial_run_s=0.0)
"""No trial: a fresh worker takes a burst at once."""


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


async def register(db: PgConnection, worker_id: str, offered: dict[str, list[str]]) -> int:
    """Register ``worker_id`` (8 cores, 16 GiB) offering ``offered``, heard from now; its incarnation."""
    incarnation = int(
        await db.fetchval(
            queries.REGISTER_WORKER,
            worker_id,
            "127.0.0.1:1",
            8000,
            16384,
            "{}",
            f"run-{worker_id}",
            1,
            b"",
            json.dumps(offered),
        )
    )
    await db.fetchrow(queries.HEARTBEAT, worker_id, incarnation, *[[]] * 9, 0, 0, 250, 2500)
    return incarnation


async def submit(db: PgConnection, name: str, asked: dict[str, int]) -> int:
    """One pending sleep job (100 cpu_millis, 10 MiB) asking ``asked``; its id."""
    job_id = await insert_job(db, name, 100, 10, 0, "sleep", 60_000, None)
    await db.execute("UPDATE jobs SET resources = $2::jsonb WHERE id = $1", job_id, json.dumps(asked))
    return job_id


async def held(db: PgConnection) -> dict[int, list[tuple[str, str, str]]]:
    """job_id -> (worker, resource, unit) of the units its active assignment holds."""
    rows = await db.fetch(
        "SELECT a.job_id, u.worker_id, u.resource, u.unit FROM assignment_units u"
        " JOIN assignments a ON a.id = u.assignment_id WHERE u.active ORDER BY a.job_id, u.unit"
    )
    found: dict[int, list[tuple[str, str, str]]] = {}
    for r in rows:
        found.setdefault(int(r["job_id"]), []).append((r["worker_id"], r["resource"], r["unit"]))
    return found


async def test_a_round_gives_each_job_distinct_units_and_commits_them(
    db: PgConnection, database_url: str
) -> None:
    """Three jobs asking 2 gpu each on one worker of 4 gpu: two are placed, on units 0,1 and
    2,3 (lowest free first), recorded with their assignments; the third waits until one ends,
    and then gets the units that one freed."""
    await register(db, "w-1", {"gpu": ["0", "1", "2", "3"]})
    jobs = [await submit(db, f"j{i}", {"gpu": 2}) for i in range(3)]
    async with placer_with_ledger(database_url, SETTINGS) as placer:
        committed = await placer.round(1)
        assert {c.job_id: c.units for c in committed} == {
            jobs[0]: (("gpu", ("0", "1")),),
            jobs[1]: (("gpu", ("2", "3")),),
        }
        assert await held(db) == {
            jobs[0]: [("w-1", "gpu", "0"), ("w-1", "gpu", "1")],
            jobs[1]: [("w-1", "gpu", "2"), ("w-1", "gpu", "3")],
        }
        await db.execute(
            "UPDATE assignments SET state = 'finished', ended_at = now() WHERE job_id = $1", jobs[0]
        )
        await db.execute("UPDATE jobs SET state = 'succeeded' WHERE id = $1", jobs[0])
        committed = await placer.round(1)
        assert [(c.job_id, c.units) for c in committed] == [(jobs[2], (("gpu", ("0", "1")),))]


async def test_the_database_refuses_a_second_active_holder_of_a_unit(db: PgConnection) -> None:
    """A placement of a unit another active assignment holds rolls the whole statement back:
    neither the job's claim nor its assignment is stored."""
    incarnation = await register(db, "w-1", {"gpu": ["0"]})
    first, second = await submit(db, "a", {"gpu": 1}), await submit(db, "b", {"gpu": 1})
    rows = await db.fetch(
        queries.COMMIT_PLACEMENTS, [first], ["w-1"], [incarnation], 1, True, [], [], [first], ["gpu"], ["0"]
    )
    assert rows[0]["assignment_id"] is not None
    with pytest.raises(DuplicateKey, match="assignment_units_one_active_holder"):
        await db.fetch(
            queries.COMMIT_PLACEMENTS,
            [second],
            ["w-1"],
            [incarnation],
            1,
            True,
            [],
            [],
            [second],
            ["gpu"],
            ["0"],
        )
    assert await db.fetchval("SELECT state FROM jobs WHERE id = $1", second) == "pending"
    assert await db.fetchval("SELECT count(*) FROM assignments WHERE job_id = $1", second) == 0


@pytest.mark.parametrize("end", ["finished", "cancelled", "lost", "stopped"])
async def test_an_assignments_end_frees_its_units_however_it_ends(
    db: PgConnection, database_url: str, end: str
) -> None:
    """Units held by an assignment are free (not read as in use) once it ends, whatever its end."""
    incarnation = await register(db, "w-1", {"gpu": ["0", "1"]})
    job = await submit(db, "a", {"gpu": 1})
    await db.fetch(
        queries.COMMIT_PLACEMENTS, [job], ["w-1"], [incarnation], 1, True, [], [], [job], ["gpu"], ["1"]
    )
    store = PgPlacerStore(database_url=database_url, application_name="test")
    try:
        (worker,) = await store.live_workers(5.0)
        assert worker.room.resources == {"gpu": ("0", "1")}
        assert worker.room.units_in_use == {("gpu", "1")}
        await db.execute("UPDATE assignments SET state = $2, ended_at = now() WHERE job_id = $1", job, end)
        (worker,) = await store.live_workers(5.0)
        assert worker.room.units_in_use == frozenset()
    finally:
        await store.close()
    assert await held(db) == {}


async def test_a_job_asking_a_resource_no_worker_offers_waits_saying_so(
    db: PgConnection, database_url: str
) -> None:
    """A job asking 2 gpu while no live worker offers gpu stays pending with the reason
    ``unschedulable: needs 2 gpu, no worker offers gpu``; a job asking none is placed."""
    await register(db, "w-1", {})
    waiting, plain = await submit(db, "gpu", {"gpu": 2}), await submit(db, "plain", {})
    async with placer_with_ledger(database_url, SETTINGS) as placer:
        committed = await placer.round(1)
    assert [c.job_id for c in committed] == [plain]
    row = await db.fetchrow("SELECT state, reason FROM jobs WHERE id = $1", waiting)
    assert (row["state"], row["reason"]) == ("pending", "unschedulable: needs 2 gpu, no worker offers gpu")


async def test_status_shows_units_in_use_and_offered(db: PgConnection, database_url: str) -> None:
    """The status view's worker row says which units are offered and which are held: gpu 2/4
    in the workers table, and the cluster's total."""
    await register(db, "w-1", {"gpu": ["0", "1", "2", "3"]})
    await register(db, "w-2", {})
    await submit(db, "a", {"gpu": 2})
    async with placer_with_ledger(database_url, SETTINGS) as placer:
        await placer.round(1)
    rows = await db.fetch(queries.STATUS_WORKERS)
    workers = [worker_from_pb(_worker_info(r)) for r in rows]
    assert workers[0].resources == (("gpu", ("0", "1", "2", "3")),)
    assert workers[0].resources_in_use == (("gpu", ("0", "1")),)
    assert [worker_devices(w) for w in workers] == ["gpu 2/4", "-"]
    console = await db.fetchrow(console_queries.CONSOLE_WORKER, "w-1")
    assert devices_of(console["resources"], console["units_in_use"]) == [
        {"name": "gpu", "offered": 4, "in_use": ["0", "1"]}
    ]


async def test_an_unconfirmed_assignment_is_sent_again_with_its_units(db: PgConnection) -> None:
    """The reconciler's resend of an assignment no heartbeat confirmed carries the units the
    placement recorded, as the first dispatch did."""
    incarnation = await register(db, "w-1", {"gpu": ["0", "1", "2"]})
    job = await submit(db, "a", {"gpu": 2})
    await db.fetch(
        queries.COMMIT_PLACEMENTS,
        [job],
        ["w-1"],
        [incarnation],
        1,
        True,
        [],
        [],
        [job, job],
        ["gpu", "gpu"],
        ["2", "0"],
    )
    (row,) = await db.fetch(queries.UNCONFIRMED_ASSIGNMENTS)
    delivery = _delivery(row)
    assert delivery.assignment.units == (("gpu", ("0", "2")),)
    assert assignment_message(delivery.assignment).units == [pb.ResourceUnits(name="gpu", units=["0", "2"])]


async def test_a_jobs_attempts_name_the_units_each_run_holds(db: PgConnection, database_url: str) -> None:
    """GetJob's attempts (JOB_ATTEMPTS) carry the units each run holds, numbers in order; a run
    of a job asking none carries none."""
    from actors.ingest_replies import attempt_info

    await register(db, "w-1", {"gpu": [str(n) for n in range(12)]})
    first = await submit(db, "a", {"gpu": 10})
    second = await submit(db, "b", {"gpu": 2})
    plain = await submit(db, "c", {})
    async with placer_with_ledger(database_url, SETTINGS) as placer:
        await placer.round(1)
    runs = {
        j: [attempt_info(r) for r in await db.fetch(queries.JOB_ATTEMPTS, j)] for j in (first, second, plain)
    }
    assert [(u.name, u.units) for u in runs[first][0].units] == [("gpu", [str(n) for n in range(10)])]
    assert [(u.name, u.units) for u in runs[second][0].units] == [("gpu", ["10", "11"])]
    assert runs[plain][0].units == []
