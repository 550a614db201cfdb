"""Pipelines on a real PostgreSQL: one SubmitJobs holding jobs, arrays and gangs that name each other in
``after_names``, stored all or none in one transaction with their names resolved to the ids it
assigns (queries.SUBMIT_JOBS), then settled by the leader's statements run by hand, as in
``test_dependencies``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from serving import ingest_and_leader

from actors import queries
from actors.dependencies import plan_waiting
from actors.reconciler_store import waiting_job
from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument

EPOCH = 1


def job(
    name: str,
    *after_names: str,
    after: tuple[int, ...] = (),
    tasks: int = 0,
    gang: int = 0,
    spread: bool = False,
) -> pb.JobSpec:
    spec = pb.JobSpec(
        name=name,
        cpu_millis=100,
        memory_mb=16,
        command=pb.CommandRuntime(argv=["true"]),
        after=list(after),
        after_names=list(after_names),
        tasks=gang,
        spread=spread,
    )
    if tasks:
        spec.array = pb.JobArray(first_index=0, last_index=tasks - 1)
    return spec


@attrs.define
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection
    incarnation: int = 0

    async def submit(self, *specs: pb.JobSpec, key: str = "") -> list[int]:
        reply = await self.cp.call(
            "submit_jobs", pb.SubmitJobsRequest(specs=list(specs), idempotency_key=key)
        )
        return [int(i) for i in reply.job_ids]

    async def worker(self) -> int:
        if not self.incarnation:
            reply = await self.cp.call(
                "register_worker",
                pb.RegisterWorkerRequest(
                    worker_id="w-1", address="127.0.0.1:9", cpu_millis=64000, memory_mb=65536
                ),
            )
            self.incarnation = int(reply.incarnation)
        return self.incarnation

    async def finish(self, *job_ids: int) -> None:
        """Place ``job_ids`` on w-1 in one commit (a gang's tasks: all of them) and report each
        one's success."""
        for job_id, assignment_id in (await self.place(*job_ids)).items():
            await self.succeed(job_id, assignment_id)

    async def place(self, *job_ids: int) -> dict[int, int]:
        """Place ``job_ids`` on w-1 in one commit: job id -> assignment id."""
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS,
            list(job_ids),
            ["w-1"] * len(job_ids),
            [await self.worker()] * len(job_ids),
            EPOCH,
            True,
            [],
            [],
            [],
            [],
            [],
        )
        placed = {int(r["id"]): r["assignment_id"] for r in rows}
        assert None not in placed.values() and len(placed) == len(job_ids), f"not all pending: {job_ids}"
        return {job_id: int(placed[job_id]) for job_id in job_ids}

    async def succeed(self, job_id: int, assignment_id: int) -> None:
        """Report the success of ``job_id``'s run ``assignment_id``."""
        outcome = pb.JobOutcome(
            assignment_id=assignment_id,
            job_id=job_id,
            state="succeeded",
            has_exit_code=True,
            exit_code=0,
            run_ms=10,
            detail="exit code 0",
        )
        await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id="w-1", incarnation=await self.worker(), finished=[outcome]),
        )

    async def settle(self) -> None:
        """The leader's settling of waiting jobs, until nothing is left to settle."""
        while True:
            rows = await self.admin.fetch(queries.WAITING_JOBS, 500)
            plan = plan_waiting([waiting_job(r) for r in rows], most=500)
            if not plan:
                return
            await self.admin.fetchrow(
                queries.SETTLE_WAITING_JOBS,
                list(plan.release),
                [j for j, _ in plan.cancel],
                [d for _, d in plan.cancel],
            )

    async def rows(self) -> dict[int, dict[str, Any]]:
        found = await self.admin.fetch(
            "SELECT id, name, state, reason, after_ids, array_id, array_index, gang_id, gang_rank"
            " FROM jobs ORDER BY id"
        )
        return {int(r["id"]): dict(r) for r in found}

    async def pending(self) -> list[int]:
        return [i for i, r in (await self.rows()).items() if r["state"] == "pending"]


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Cluster(cp=cp, admin=admin)


async def test_a_three_stage_pipeline_is_stored_with_its_dependencies_and_runs_in_order(
    cluster: Cluster,
) -> None:
    """prepare -> an array of 4 -> collect, given collect first: stored in one call with the
    names resolved (the array after prepare's id, collect after the array's id, each id above
    those it waits for); only prepare is pending; then the array's tasks, then collect."""
    collect, shards, prepare = await cluster.submit(
        job("collect", "shards"), job("shards", "prepare", tasks=4), job("prepare")
    )
    rows = await cluster.rows()
    assert len(rows) == 6
    assert prepare < shards < collect
    tasks = sorted(i for i, r in rows.items() if r["array_id"] == shards)
    assert tasks[0] == shards and [rows[t]["array_index"] for t in tasks] == [0, 1, 2, 3]
    assert all(rows[t]["after_ids"] == [prepare] for t in tasks)
    assert rows[collect]["after_ids"] == [shards]
    assert (rows[collect]["state"], rows[collect]["reason"]) == ("waiting", f"waiting for job {shards}")
    assert await cluster.pending() == [prepare]

    await cluster.finish(prepare)
    await cluster.settle()
    assert await cluster.pending() == tasks
    for task in tasks[:3]:
        await cluster.finish(task)
    await cluster.settle()
    assert (await cluster.rows())[collect]["state"] == "waiting"
    await cluster.finish(tasks[3])
    await cluster.settle()
    assert await cluster.pending() == [collect]


async def test_a_batch_stores_a_gang_beside_an_array_and_a_job_after_the_gang(cluster: Cluster) -> None:
    """A gang of 3 (spread), an array of 2 and a job after the gang by name, in one call: the
    reply gives the gang's id (its rank 0 task's) in the gang's place; the gang's row is stored
    as SubmitJob stores it; the dependent waits for the gang's id and is pending only once every
    one of the gang's tasks succeeded."""
    gang_id, shards, report = await cluster.submit(
        job("train", gang=3, spread=True), job("shards", tasks=2), job("report", "train")
    )
    rows = await cluster.rows()
    assert len(rows) == 6
    tasks = sorted(i for i, r in rows.items() if r["gang_id"] == gang_id)
    assert tasks[0] == gang_id and [rows[t]["gang_rank"] for t in tasks] == [0, 1, 2]
    assert all(rows[t]["array_id"] is None and rows[t]["state"] == "pending" for t in tasks)
    assert rows[shards]["array_id"] == shards and rows[shards]["gang_id"] is None
    gang = await cluster.admin.fetchrow(
        "SELECT size, spread, max_attempts, state FROM gangs WHERE id = $1", gang_id
    )
    assert gang is not None and dict(gang) == {"size": 3, "spread": True, "max_attempts": 1, "state": "live"}
    assert await cluster.admin.fetchval("SELECT count(*) FROM gangs") == 1
    assert rows[report]["after_ids"] == [gang_id] and gang_id < report
    assert (rows[report]["state"], rows[report]["reason"]) == ("waiting", f"waiting for job {gang_id}")

    info = await cluster.cp.call("get_job", pb.GetJobRequest(job_id=tasks[1]))
    assert (info.spec.tasks, info.spec.spread, info.gang.size) == (3, True, 3)

    placed = await cluster.place(*tasks)
    for task in tasks[:2]:
        await cluster.succeed(task, placed[task])
    await cluster.settle()
    assert (await cluster.rows())[report]["state"] == "waiting"
    await cluster.succeed(tasks[2], placed[tasks[2]])
    await cluster.settle()
    assert (await cluster.rows())[report]["state"] == "pending"
    assert (await cluster.admin.fetchval("SELECT state FROM gangs WHERE id = $1", gang_id)) == "succeeded"


async def test_a_pipeline_submitted_again_with_its_key_stores_nothing_twice(cluster: Cluster) -> None:
    """The same pipeline sent twice under one idempotency key gets the first answer, and the
    jobs are stored once."""
    specs = (job("prepare"), job("shards", "prepare", tasks=4), job("collect", "shards"))
    first = await cluster.submit(*specs, key="pipeline-1")
    again = await cluster.submit(*specs, key="pipeline-1")
    assert first == again
    assert len(await cluster.rows()) == 6


async def test_names_and_ids_mix_in_after(cluster: Cluster) -> None:
    """A job of a pipeline may wait for an existing job by id and one of its batch by name."""
    (older,) = await cluster.submit(job("older"))
    a, b = await cluster.submit(job("a"), job("b", "a", after=(older,)))
    rows = await cluster.rows()
    assert sorted(rows[b]["after_ids"]) == [older, a]
    assert rows[b]["reason"] == f"waiting for job {older}, {a}"


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((job("a", "b"), job("b", "a")), r"^specs\[0\]\.after_names .*after: cycle a -> b -> a"),
        ((job("a", "a"),), r"after: cycle a -> a"),
        ((job("a", "c", "b"), job("b", "c"), job("c", "a")), r"after: cycle a -> c -> a"),
        ((job("a"), job("b", "nope")), r"^specs\[1\]\.after_names\[0\] must name a job of the same batch"),
        ((job("a"), job("a"), job("b", "a")), r"^specs\[1\]\.name must differ"),
    ],
)
async def test_a_pipeline_that_does_not_resolve_is_refused_whole(
    cluster: Cluster, specs: tuple[pb.JobSpec, ...], message: str
) -> None:
    """A cycle (naming it), a name no job of the batch has, or a name two jobs share when
    jobs name each other is refused, and nothing is stored."""
    with pytest.raises(InvalidArgument, match=message):
        await cluster.submit(*specs)
    assert await cluster.rows() == {}


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((job("a"), job("g", gang=257)), r"^specs\[1\]\.tasks must be between 1 and 256, got 257"),
        ((job("g", gang=2, tasks=2),), r"^specs\[0\]\.tasks .*cannot be combined with array"),
        ((job("a"), job("b", spread=True)), r"^specs\[1\]\.spread .*applies only to a gang"),
        ((job("a"), *[job(f"g{n}", gang=256) for n in range(40)]), r"^specs .*each array's and gang's tasks"),
    ],
)
async def test_a_batch_with_a_bad_gang_is_refused_whole(
    cluster: Cluster, specs: tuple[pb.JobSpec, ...], message: str
) -> None:
    """A gang of too many tasks, a gang that is an array too, spread without a gang, or gangs
    that take the batch over its rows (each task counted) are refused naming the job's field,
    and nothing is stored."""
    with pytest.raises(InvalidArgument, match=message):
        await cluster.submit(*specs)
    assert await cluster.rows() == {}
    assert await cluster.admin.fetchval("SELECT count(*) FROM gangs") == 0


async def test_submit_job_refuses_after_names(cluster: Cluster) -> None:
    """A single SubmitJob has no batch to name: after_names is refused, nothing stored."""
    with pytest.raises(InvalidArgument, match=r"^after_names must be empty in SubmitJob"):
        await cluster.cp.call("submit_job", pb.SubmitJobRequest(spec=job("a", "b")))
    assert await cluster.rows() == {}
