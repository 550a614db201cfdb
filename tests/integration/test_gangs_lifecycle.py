"""Gangs on a real PostgreSQL (docs/gangs.md): a gang's tasks are claimed all or none in one
statement, each with the gang's attempt and a port of its own; a task that fails or is lost stops
the others and the gang runs again whole, one attempt spent (by a loss only with count_lost);
spent, the gang fails whole; no
committed state holds a partial gang (the view partial_gangs).

The leader's statements run directly on an admin connection holding the lease at epoch 1; the
workers' reports go through an ingest actor, as in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from serving import ingest_and_leader

from actors import queries
from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient

EPOCH = 1


@attrs.frozen
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection

    async def register(self, worker_id: str, address: str) -> int:
        reply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(worker_id=worker_id, address=address, cpu_millis=4000, memory_mb=4096),
        )
        incarnation = int(reply.incarnation)
        await self.heartbeat(worker_id, incarnation)
        return incarnation

    async def heartbeat(self, worker_id: str, incarnation: int, *finished: pb.JobOutcome) -> None:
        await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id=worker_id, incarnation=incarnation, finished=list(finished)),
        )

    async def submit_gang(
        self,
        tasks: int,
        *,
        max_attempts: int = 1,
        spread: bool = False,
        gpu: int = 0,
        count_lost: bool = False,
    ) -> list[int]:
        """A gang of ``tasks`` command tasks, each asking ``gpu`` gpu (0: none); its task ids by rank."""
        reply = await self.cp.call(
            "submit_job",
            pb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="g",
                    cpu_millis=500,
                    memory_mb=64,
                    command=pb.CommandRuntime(argv=["true"]),
                    max_attempts=max_attempts,
                    count_lost=count_lost,
                    tasks=tasks,
                    spread=spread,
                    resources=[pb.ResourceCount(name="gpu", count=gpu)] if gpu else [],
                )
            ),
        )
        rows = await self.admin.fetch(
            "SELECT id FROM jobs WHERE gang_id = $1 ORDER BY gang_rank", int(reply.job_id)
        )
        return [int(r["id"]) for r in rows]

    async def place(self, placements: list[tuple[int, str, int]]) -> dict[int, int]:
        """COMMIT_PLACEMENTS of (job, worker, incarnation) triples: job_id -> assignment id."""
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS,
            [j for j, _, _ in placements],
            [w for _, w, _ in placements],
            [i for _, _, i in placements],
            EPOCH,
            True,
            [],
            [],
            [],
            [],
            [],
        )
        return {int(r["id"]): int(r["assignment_id"]) for r in rows if r["assignment_id"] is not None}

    async def states(self, job_ids: list[int]) -> list[str]:
        rows = await self.admin.fetch("SELECT state FROM jobs WHERE id = ANY($1) ORDER BY id", job_ids)
        return [r["state"] for r in rows]

    async def stop_marked(self) -> list[int]:
        """The leader's end of the stops it asked (END_PREEMPTED_ASSIGNMENTS), as once their
        workers acknowledged them: the assignments ended."""
        marked = [
            int(r["id"])
            for r in await self.admin.fetch(
                "SELECT id FROM assignments WHERE state = 'active' AND preempt_requested_at IS NOT NULL"
            )
        ]
        rows = await self.admin.fetch(queries.END_PREEMPTED_ASSIGNMENTS, EPOCH, marked)
        return [int(r["id"]) for r in rows]

    async def partial(self) -> int:
        return int(await self.admin.fetchval("SELECT count(*) FROM partial_gangs"))

    async def gang(self, gang_id: int) -> dict[str, object]:
        row = await self.admin.fetchrow("SELECT * FROM gangs WHERE id = $1", gang_id)
        assert row is not None
        return dict(row)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH, presence_interval_s=1.0) as (cp, admin):
        yield Cluster(cp=cp, admin=admin)


def failed(assignment_id: int, job_id: int) -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state="failed",
        has_exit_code=True,
        exit_code=1,
        run_ms=100,
        detail="exit code 1",
    )


def succeeded(assignment_id: int, job_id: int) -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state="succeeded",
        has_exit_code=True,
        exit_code=0,
        run_ms=100,
        detail="exit code 0",
    )


async def test_a_gang_is_claimed_whole_or_not_at_all(cluster: Cluster) -> None:
    """A commit that names only some of a gang's tasks claims none of them; one that names all
    claims all, each assignment with the gang's first attempt and a port of its own."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(3)
    assert await cluster.place([(t, "w-1", one) for t in tasks[:2]]) == {}
    assert await cluster.states(tasks) == ["pending"] * 3
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    assert sorted(placed) == tasks
    rows = await cluster.admin.fetch(
        "SELECT gang_attempt, gang_port FROM assignments WHERE job_id = ANY($1) ORDER BY job_id", tasks
    )
    assert [r["gang_attempt"] for r in rows] == [1, 1, 1]
    assert [r["gang_port"] for r in rows] == [42000, 42001, 42002]
    seats = await cluster.admin.fetch(queries.JOB_ARGVS, tasks)
    seat = queries.gang_seat_of(next(dict(r) for r in seats if r["id"] == tasks[1]))
    assert seat is not None
    assert (seat.rank, seat.size, seat.port) == (1, 3, 42001)
    assert seat.peers == ("10.0.0.1:42000", "10.0.0.1:42001", "10.0.0.1:42002")
    assert await cluster.partial() == 0


async def test_a_gang_takes_the_lowest_ports_free_on_its_host_around_those_in_use(cluster: Cluster) -> None:
    """A second gang on a host whose active gang tasks hold ports 42000, 42002 and 42004 gets
    the lowest free ones, 42001, 42003 and 42005, one each, by task id."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    first = await cluster.submit_gang(3)
    placed = await cluster.place([(t, "w-1", one) for t in first])
    assert sorted(placed) == first
    await cluster.admin.execute(
        "UPDATE assignments SET gang_port = 42004 WHERE job_id = ANY($1) AND gang_port = 42001", first
    )
    second = await cluster.submit_gang(3)
    assert sorted(await cluster.place([(t, "w-1", one) for t in second])) == second
    rows = await cluster.admin.fetch(
        "SELECT gang_port FROM assignments WHERE job_id = ANY($1) ORDER BY job_id", second
    )
    assert [r["gang_port"] for r in rows] == [42001, 42003, 42005]


async def test_a_failed_task_stops_the_others_and_the_gang_runs_again_whole(cluster: Cluster) -> None:
    """One task fails: in the same transaction the others are asked to stop; once they ended,
    every task is pending again, one gang attempt spent, and the next commit is attempt 2."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(3, max_attempts=2)
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    await cluster.heartbeat("w-1", one, succeeded(placed[tasks[2]], tasks[2]))
    await cluster.heartbeat("w-1", one, failed(placed[tasks[0]], tasks[0]))
    gang = await cluster.gang(tasks[0])
    assert (gang["broken"], gang["failures"], gang["state"]) == (1, 1, "live")
    assert await cluster.partial() == 0
    marked = await cluster.admin.fetch(
        "SELECT job_id FROM assignments WHERE state = 'active' AND preempt_requested_at IS NOT NULL"
    )
    assert [int(r["job_id"]) for r in marked] == [tasks[1]]
    assert await cluster.stop_marked() == [placed[tasks[1]]]
    assert await cluster.states(tasks) == ["pending"] * 3
    await cluster.admin.execute("UPDATE jobs SET not_before = NULL WHERE id = ANY($1)", tasks)
    again = await cluster.place([(t, "w-1", one) for t in tasks])
    assert sorted(again) == tasks
    attempts = await cluster.admin.fetch(
        "SELECT DISTINCT gang_attempt FROM assignments WHERE id = ANY($1)", list(again.values())
    )
    assert [r["gang_attempt"] for r in attempts] == [2]


async def test_a_gang_whose_attempts_are_spent_fails_whole(cluster: Cluster) -> None:
    """With its one attempt spent by a failed task, the gang fails, and each other task fails
    once its stop ended it."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(2)
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    await cluster.heartbeat("w-1", one, failed(placed[tasks[1]], tasks[1]))
    assert (await cluster.gang(tasks[0]))["state"] == "failed"
    await cluster.stop_marked()
    assert await cluster.states(tasks) == ["failed", "failed"]


@pytest.mark.parametrize(("count_lost", "spent"), [(False, 0), (True, 1)])
async def test_a_task_lost_with_its_worker_stops_the_others(
    cluster: Cluster, count_lost: bool, spent: int
) -> None:
    """A spread gang's task lost with its dead worker breaks the attempt and stops the task on
    the live worker; both are then pending together. The loss spends one of the gang's attempts
    only when its tasks count losses, as a single job's loss does: with one attempt, a gang that
    does not count them is placed again, one that does fails."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    two = await cluster.register("w-2", "10.0.0.2:9000")
    tasks = await cluster.submit_gang(
        2, max_attempts=2 if count_lost else 1, spread=True, count_lost=count_lost
    )
    placed = await cluster.place([(tasks[0], "w-1", one), (tasks[1], "w-2", two)])
    assert len(placed) == 2
    await cluster.admin.execute("UPDATE workers SET state = 'dead' WHERE id = 'w-2'")
    row = await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    assert row is not None and list(row["ended_ids"]) == [placed[tasks[1]]]
    gang = await cluster.gang(tasks[0])
    assert (gang["state"], gang["broken"], gang["failures"]) == ("live", 1, spent)
    assert await cluster.partial() == 0
    assert await cluster.stop_marked() == [placed[tasks[0]]]
    assert await cluster.states(tasks) == ["pending", "pending"]
    # The second attempt is lost too: without count_lost still nothing is spent; with it the
    # gang's last attempt is, and the gang fails whole.
    three = await cluster.register("w-3", "10.0.0.3:9000")
    placed = await cluster.place([(tasks[0], "w-1", one), (tasks[1], "w-3", three)])
    assert len(placed) == 2
    await cluster.admin.execute("UPDATE workers SET state = 'dead' WHERE id = 'w-3'")
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    await cluster.stop_marked()
    gang = await cluster.gang(tasks[0])
    assert (gang["state"], gang["failures"]) == (("failed", 2) if count_lost else ("live", 0))
    assert await cluster.states(tasks) == (["failed", "failed"] if count_lost else ["pending", "pending"])


async def test_a_gang_succeeds_when_every_task_did(cluster: Cluster) -> None:
    """Tasks that succeed one by one while others run are normal; the gang succeeds with the last."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(2)
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    await cluster.heartbeat("w-1", one, succeeded(placed[tasks[0]], tasks[0]))
    assert (await cluster.gang(tasks[0]))["state"] == "live"
    assert await cluster.partial() == 0
    await cluster.heartbeat("w-1", one, succeeded(placed[tasks[1]], tasks[1]))
    assert (await cluster.gang(tasks[0]))["state"] == "succeeded"


async def test_two_tasks_ending_in_concurrent_transactions_leave_the_gang_succeeded(
    cluster: Cluster, database_url: str
) -> None:
    """Two workers' reports, each ending the last but one running task of a gang in its own
    transaction at once, leave the gang succeeded (each would else see the other's task still
    running, and neither would end the gang)."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    two = await cluster.register("w-2", "10.0.0.2:9000")
    tasks = await cluster.submit_gang(2, spread=True)
    placed = await cluster.place([(tasks[0], "w-1", one), (tasks[1], "w-2", two)])
    first = await PgConnection.connect(database_url)
    second = await PgConnection.connect(database_url)

    async def report(conn: PgConnection, worker_id: str, task: int) -> None:
        await conn.fetchval(
            queries.RECORD_OUTCOMES,
            worker_id,
            [placed[task]],
            ["succeeded"],
            [0],
            [100],
            [0],
            [""],
            [""],
            [""],
        )

    try:
        await first.execute("BEGIN")
        await second.execute("BEGIN")
        await report(first, "w-1", tasks[0])
        async with trio.open_nursery() as nursery:
            # The second waits for the first's lock on the gang; it ends once the first commits.
            nursery.start_soon(report, second, "w-2", tasks[1])
            await trio.sleep(0.5)
            await first.execute("COMMIT")
        await second.execute("COMMIT")
    finally:
        await first.close()
        await second.close()
    assert (await cluster.gang(tasks[0]))["state"] == "succeeded"


async def test_a_cancel_of_one_task_cancels_the_whole_gang(cluster: Cluster) -> None:
    """Cancelling any task of a pending gang cancels every task and the gang."""
    tasks = await cluster.submit_gang(3)
    await cluster.cp.call("cancel_job", pb.CancelJobRequest(job_id=tasks[1]))
    assert await cluster.states(tasks) == ["cancelled"] * 3
    assert (await cluster.gang(tasks[0]))["state"] == "cancelled"


async def test_a_late_success_of_a_lost_task_leaves_it_pending_with_its_gang(cluster: Cluster) -> None:
    """A task lost with its worker whose success is reported late stays pending: its gang's
    attempt broke, and it runs again with the others."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    two = await cluster.register("w-2", "10.0.0.2:9000")
    tasks = await cluster.submit_gang(2, max_attempts=3, spread=True)
    placed = await cluster.place([(tasks[0], "w-1", one), (tasks[1], "w-2", two)])
    await cluster.admin.execute("UPDATE workers SET state = 'dead' WHERE id = 'w-2'")
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    two = await cluster.register("w-2", "10.0.0.2:9000")
    await cluster.cp.call(
        "heartbeat",
        pb.HeartbeatRequest(
            worker_id="w-2", incarnation=two, finished=[succeeded(placed[tasks[1]], tasks[1])]
        ),
    )
    outcome = await cluster.admin.fetchval("SELECT outcome FROM assignments WHERE id = $1", placed[tasks[1]])
    assert outcome == "succeeded"
    await cluster.stop_marked()
    assert await cluster.states(tasks) == ["pending", "pending"]


async def test_a_task_that_succeeds_after_its_attempt_broke_runs_again_with_its_gang(
    cluster: Cluster,
) -> None:
    """The stop of a task races its own success: the success is recorded, and the task is pending
    again with the others, so the gang runs again whole."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(2, max_attempts=2)
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    await cluster.heartbeat("w-1", one, failed(placed[tasks[0]], tasks[0]))
    await cluster.heartbeat("w-1", one, succeeded(placed[tasks[1]], tasks[1]))
    assert await cluster.stop_marked() == []
    assert await cluster.states(tasks) == ["pending", "pending"]
    assert (await cluster.gang(tasks[0]))["failures"] == 1


async def test_a_gangs_id_as_a_dependency_stands_for_the_whole_gang(cluster: Cluster) -> None:
    """A job after a gang's id waits until every task of the gang succeeded."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(2)
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    await cluster.heartbeat("w-1", one, succeeded(placed[tasks[0]], tasks[0]))
    states = "SELECT state FROM dependency_states($1::bigint[])"
    assert await cluster.admin.fetchval(states, [tasks[0]]) == "unfinished"
    await cluster.heartbeat("w-1", one, succeeded(placed[tasks[1]], tasks[1]))
    assert await cluster.admin.fetchval(states, [tasks[0]]) == "succeeded"


async def test_a_failure_after_a_stop_broke_the_attempt_still_spends_it(cluster: Cluster) -> None:
    """An attempt broken by a stop (no attempt spent) whose other task then fails on its own
    spends one attempt: with one, the gang fails whole."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    tasks = await cluster.submit_gang(2)
    placed = await cluster.place([(t, "w-1", one) for t in tasks])
    await cluster.admin.execute(
        "UPDATE assignments SET state = 'stopped', ended_at = now(), end_reason = 'released' WHERE id = $1",
        placed[tasks[0]],
    )
    await cluster.admin.execute("SELECT requeue_unspent($1::bigint[])", [tasks[0]])
    assert (await cluster.gang(tasks[0]))["failures"] == 0
    await cluster.heartbeat("w-1", one, failed(placed[tasks[1]], tasks[1]))
    gang = await cluster.gang(tasks[0])
    assert (gang["failures"], gang["state"]) == (1, "failed")
    assert await cluster.states(tasks) == ["failed", "failed"]


async def test_two_gangs_on_one_worker_never_share_a_port(cluster: Cluster) -> None:
    """A second gang placed on a worker whose first gang holds ports 42000-42001 gets the next
    free ones."""
    one = await cluster.register("w-1", "10.0.0.1:9000")
    first = await cluster.submit_gang(2)
    second = await cluster.submit_gang(2)
    await cluster.place([(t, "w-1", one) for t in first])
    await cluster.place([(t, "w-1", one) for t in second])
    rows = await cluster.admin.fetch(
        "SELECT gang_port FROM assignments WHERE state = 'active' AND worker_id = 'w-1' ORDER BY job_id"
    )
    assert [r["gang_port"] for r in rows] == [42000, 42001, 42002, 42003]


async def test_a_spread_gang_on_workers_of_one_host_gets_a_port_per_task(cluster: Cluster) -> None:
    """Workers sharing a host (a fleet, a local cluster) give a spread gang's tasks different
    ports, and its peers' host:port are all different; a worker on another host starts at the
    range's first port again."""
    one = await cluster.register("w-1", "127.0.0.1:9001")
    two = await cluster.register("w-2", "127.0.0.1:9002")
    three = await cluster.register("w-3", "10.0.0.3:9000")
    tasks = await cluster.submit_gang(3, spread=True)
    await cluster.place([(tasks[0], "w-1", one), (tasks[1], "w-2", two), (tasks[2], "w-3", three)])
    rows = await cluster.admin.fetch(
        "SELECT worker_id, gang_port FROM assignments WHERE state = 'active' ORDER BY job_id"
    )
    assert [(r["worker_id"], r["gang_port"]) for r in rows] == [
        ("w-1", 42000),
        ("w-2", 42001),
        ("w-3", 42000),
    ]
    peers = await cluster.admin.fetchval(
        f"SELECT s.gang_peers FROM jobs j, LATERAL ({queries.GANG_SEAT}) s WHERE j.id = $1", tasks[0]
    )
    assert peers == ["127.0.0.1:42000", "127.0.0.1:42001", "10.0.0.3:42000"]


async def test_a_gang_no_known_worker_set_could_hold_is_refused_and_nothing_is_stored(
    cluster: Cluster,
) -> None:
    """Two known workers of 4000 cpu_millis: a spread gang of 3 and a gang of 17 tasks of 500
    are refused naming tasks, the value and the limit, and store nothing; a left worker is not
    counted, a dead one is (it may come back); with no worker known yet, a gang waits."""
    assert await cluster.submit_gang(3, spread=True)  # no worker known yet: stored, it waits
    for worker in ("w-1", "w-2", "w-3"):
        await cluster.register(worker, f"10.0.0.{worker[-1]}:1")
    await cluster.admin.execute("UPDATE workers SET state = 'dead' WHERE id = 'w-2'")
    await cluster.admin.execute("UPDATE workers SET state = 'left' WHERE id = 'w-3'")
    before = await cluster.admin.fetchval("SELECT count(*) FROM jobs")
    with pytest.raises(Exception, match=r"tasks must be at most 2: a spread gang needs a worker per task"):
        await cluster.submit_gang(3, spread=True)
    with pytest.raises(
        Exception, match=r"tasks must be at most 16: the 2 workers this cluster knows hold 16"
    ):
        await cluster.submit_gang(17)
    assert await cluster.admin.fetchval("SELECT count(*) FROM jobs") == before
    assert len(await cluster.submit_gang(16)) == 16
    assert len(await cluster.submit_gang(2, spread=True)) == 2


async def test_a_batch_holding_a_gang_no_known_worker_set_could_hold_is_refused_whole(
    cluster: Cluster,
) -> None:
    """SubmitJobs refuses a batch whose gang the known workers could never hold, naming the
    spec's index, and stores none of its jobs; a task no known worker has room for is said so."""
    await cluster.register("w-1", "10.0.0.1:1")
    before = await cluster.admin.fetchval("SELECT count(*) FROM jobs")
    specs = [
        pb.JobSpec(name="ok", cpu_millis=500, memory_mb=64, command=pb.CommandRuntime(argv=["true"])),
        pb.JobSpec(
            name="big",
            cpu_millis=500,
            memory_mb=64,
            command=pb.CommandRuntime(argv=["true"]),
            tasks=2,
            spread=True,
        ),
    ]
    with pytest.raises(Exception, match=r"specs\[1\]\.tasks must be at most 1: a spread gang"):
        await cluster.cp.call("submit_jobs", pb.SubmitJobsRequest(specs=specs))
    assert await cluster.admin.fetchval("SELECT count(*) FROM jobs") == before
    with pytest.raises(
        Exception, match=r"tasks must fit the workers this cluster knows, and none of its 1 has room"
    ):
        await cluster.cp.call(
            "submit_job",
            pb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="huge",
                    cpu_millis=64000,
                    memory_mb=64,
                    command=pb.CommandRuntime(argv=["true"]),
                    tasks=2,
                )
            ),
        )


async def test_status_lists_an_unschedulable_gang_once_by_its_id(cluster: Cluster) -> None:
    """Status's unschedulable list names a gang once, by its id (its rank 0 task), with its size,
    beside a single job: a gang of 8 takes one of the list's 20 rows, not 8."""
    tasks = await cluster.submit_gang(8, gpu=2)
    single = await cluster.cp.call(
        "submit_job",
        pb.SubmitJobRequest(
            spec=pb.JobSpec(name="one", cpu_millis=100, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=10))
        ),
    )
    reason = "unschedulable: needs 2 gpu, no worker offers gpu"
    await cluster.admin.execute("UPDATE jobs SET reason = $1 WHERE state = 'pending'", reason)
    reply = await cluster.cp.call("status", pb.StatusRequest())
    listed = [(int(j.job_id), j.gang.size if j.gang else None) for j in reply.unschedulable]
    assert listed == [(tasks[0], 8), (int(single.job_id), None)]
