"""Gangs asking devices on a real PostgreSQL (docs/gangs.md, "Devices"): a gang submitted with
``resources`` stores the ask on every task; a round places its tasks on distinct units and the
fenced commit records them with the tasks' assignments; a commit of a gang one of whose units an
active assignment holds is refused whole."""

from __future__ import annotations

import json

import pytest
from serving import ingest_and_leader, placer_with_ledger
from test_device_commit import SETTINGS, held, register, submit
from test_gangs_lifecycle import Cluster

from actors import queries
from runtime.errors import DuplicateKey


async def test_a_gangs_tasks_get_distinct_units_recorded_with_their_assignments(database_url: str) -> None:
    """A gang of 2 asking 2 gpu stores the ask on each task; on one worker of 4 gpu a round
    places both, on units 0,1 and 2,3, recorded in assignment_units with their assignments."""
    async with ingest_and_leader(database_url) as (cp, admin):
        await register(admin, "w-1", {"gpu": ["0", "1", "2", "3"]})
        tasks = await Cluster(cp=cp, admin=admin).submit_gang(2, gpu=2)
        asked = await admin.fetch("SELECT resources FROM jobs WHERE id = ANY($1)", tasks)
        assert [json.loads(r["resources"]) for r in asked] == [{"gpu": 2}, {"gpu": 2}]
        async with placer_with_ledger(database_url, SETTINGS) as placer:
            committed = await placer.round(1)
        assert {c.job_id: c.units for c in committed} == {
            tasks[0]: (("gpu", ("0", "1")),),
            tasks[1]: (("gpu", ("2", "3")),),
        }
        assert await held(admin) == {
            tasks[0]: [("w-1", "gpu", "0"), ("w-1", "gpu", "1")],
            tasks[1]: [("w-1", "gpu", "2"), ("w-1", "gpu", "3")],
        }


async def test_a_gang_whose_units_collide_is_refused_whole(database_url: str) -> None:
    """A commit of a gang of 2 whose second task names a unit a single job's active assignment
    holds is rolled back whole: no task is claimed, no assignment or unit written, the gang's
    attempts unchanged."""
    async with ingest_and_leader(database_url) as (cp, admin):
        incarnation = await register(admin, "w-1", {"gpu": ["0", "1", "2"]})
        single = await submit(admin, "single", {"gpu": 1})
        await admin.fetch(
            queries.COMMIT_PLACEMENTS,
            [single],
            ["w-1"],
            [incarnation],
            1,
            True,
            [],
            [],
            [single],
            ["gpu"],
            ["2"],
        )
        tasks = await Cluster(cp=cp, admin=admin).submit_gang(2, gpu=1)
        with pytest.raises(DuplicateKey, match="assignment_units_one_active_holder"):
            await admin.fetch(
                queries.COMMIT_PLACEMENTS,
                tasks,
                ["w-1", "w-1"],
                [incarnation] * 2,
                1,
                True,
                [],
                [],
                tasks,
                ["gpu", "gpu"],
                ["0", "2"],
            )
        states = await admin.fetch("SELECT state FROM jobs WHERE id = ANY($1)", tasks)
        assert [r["state"] for r in states] == ["pending", "pending"]
        assert await admin.fetchval("SELECT count(*) FROM assignments WHERE job_id = ANY($1)", tasks) == 0
        assert await admin.fetchval("SELECT attempts FROM gangs WHERE id = $1", tasks[0]) == 0
        assert await held(admin) == {single: [("w-1", "gpu", "2")]}
