"""Job outcomes and registrations on a real PostgreSQL through real gRPC: outcomes carried by
registrations before the new incarnation exists, and recorded late, after the leader ended the
assignment as lost; copies of a registration that start no second incarnation; an incarnation
no agent heartbeats under that ends nothing.

The leader's own statements (the placement claim, the orphan sweep) are run directly on an
admin connection with the lease taken at epoch 1; everything a worker sends goes through an
ingest actor, as in production.
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
from runtime.errors import InvalidArgument

EPOCH = 1


@attrs.frozen
class Cluster:
    cp: ControlPlaneClient
    admin: PgConnection
    database_url: str

    async def register(self, worker_id: str, *finished: pb.JobOutcome) -> int:
        """Register (again) and heartbeat once under the new incarnation, as an agent does:
        only then does the leader's sweep end the previous incarnation's assignments."""
        reply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(
                worker_id=worker_id,
                address="127.0.0.1:9",
                cpu_millis=4000,
                memory_mb=4096,
                finished=list(finished),
            ),
        )
        await self.heartbeat(worker_id, int(reply.incarnation))
        return int(reply.incarnation)

    async def register_as(self, worker_id: str, run_id: str, seq: int) -> int:
        """One RegisterWorker of agent run ``run_id``, registration ``seq``; no heartbeat."""
        reply = await self.cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(
                worker_id=worker_id,
                address="127.0.0.1:9",
                cpu_millis=4000,
                memory_mb=4096,
                agent_run_id=run_id,
                registration_seq=seq,
            ),
        )
        return int(reply.incarnation)

    async def current_incarnation(self, worker_id: str) -> int:
        return int(await self.admin.fetchval("SELECT incarnation FROM workers WHERE id = $1", worker_id))

    async def heartbeat(
        self, worker_id: str, incarnation: int, *finished: pb.JobOutcome
    ) -> pb.HeartbeatReply:
        reply: pb.HeartbeatReply = await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id=worker_id, incarnation=incarnation, finished=list(finished)),
        )
        return reply

    async def submit(self) -> int:
        reply = await self.cp.call(
            "submit_job",
            pb.SubmitJobRequest(
                spec=pb.JobSpec(
                    name="t", cpu_millis=100, memory_mb=16, command=pb.CommandRuntime(argv=["true"])
                )
            ),
        )
        return int(reply.job_id)

    async def place(
        self, job_id: int, worker_id: str, incarnation: int, conn: PgConnection | None = None
    ) -> int | None:
        """The placer's claim (COMMIT_PLACEMENTS) of one job; the assignment id, or None."""
        rows = await (conn or self.admin).fetch(
            queries.COMMIT_PLACEMENTS, [job_id], [worker_id], [incarnation], EPOCH, True, [], [], [], [], []
        )
        return rows[0]["assignment_id"]

    async def sweep(self) -> tuple[list[int], list[int]]:
        """The leader's orphan sweep: (assignments ended as lost, jobs requeued)."""
        row = await self.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)  # no backoff
        assert row is not None
        return list(row["ended_ids"]), list(row["requeued_ids"])

    async def assignment(self, assignment_id: int) -> dict[str, object]:
        row = await self.admin.fetchrow(
            "SELECT state, end_reason, outcome, exit_code FROM assignments WHERE id = $1", assignment_id
        )
        assert row is not None
        return dict(row)

    async def times(self, assignment_id: int) -> dict[str, float | None]:
        """The times (unix s, database time) of an assignment and its job: ``submitted``,
        ``created``, ``ended`` (the assignment's), ``started`` and ``finished`` (the job's)."""
        row = await self.admin.fetchrow(
            "SELECT extract(epoch FROM j.submitted_at)::float8 AS submitted,"
            " extract(epoch FROM a.created_at)::float8 AS created,"
            " extract(epoch FROM a.ended_at)::float8 AS ended,"
            " extract(epoch FROM j.started_at)::float8 AS started,"
            " extract(epoch FROM j.finished_at)::float8 AS finished"
            " FROM assignments a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
            assignment_id,
        )
        assert row is not None
        return dict(row)

    async def backdate(self, job_id: int, seconds: float) -> None:
        """Move the job's submission and its assignments' creation ``seconds`` into the past, as
        if it had been placed that long ago."""
        await self.admin.execute(
            "UPDATE jobs SET submitted_at = submitted_at - make_interval(secs => $2) WHERE id = $1",
            job_id,
            seconds,
        )
        await self.admin.execute(
            "UPDATE assignments SET created_at = created_at - make_interval(secs => $2) WHERE job_id = $1",
            job_id,
            seconds,
        )

    async def job(self, job_id: int) -> dict[str, object]:
        row = await self.admin.fetchrow(
            "SELECT state, exit_code, reason, detail, stdout_path, stderr_path,"
            " extract(epoch FROM started_at)::float8 AS started_unix_s,"
            " extract(epoch FROM finished_at)::float8 AS finished_unix_s FROM jobs WHERE id = $1",
            job_id,
        )
        assert row is not None
        return dict(row)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    """One ingest actor (no leader), a client of it, and an admin connection holding the lease
    at epoch 1."""
    async with ingest_and_leader(database_url, epoch=EPOCH, presence_interval_s=1.0) as (cp, admin):
        yield Cluster(cp=cp, admin=admin, database_url=database_url)


def outcome(
    assignment_id: int,
    job_id: int,
    state: str = "succeeded",
    exit_code: int | None = 0,
    detail: str = "exit code 0",
    *,
    run_ms: int = 1500,
    ended_ago_ms: int = 0,
) -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state=state,
        has_exit_code=exit_code is not None,
        exit_code=exit_code or 0,
        run_ms=run_ms,
        ended_ago_ms=ended_ago_ms,
        stdout_path=f"/w/jobs/{job_id}-{assignment_id}/stdout.log",
        stderr_path=f"/w/jobs/{job_id}-{assignment_id}/stderr.log",
        detail=detail,
    )


async def test_outcomes_in_a_registration_are_recorded_before_the_new_incarnation(cluster: Cluster) -> None:
    """A worker registering again with the outcome of a job that succeeded before it fenced:
    that assignment is finished and its job succeeded, so the leader's sweep of the old
    incarnation finds nothing to requeue for it; a job without an outcome is requeued."""
    old = await cluster.register("w-1")
    done, unreported = await cluster.submit(), await cluster.submit()
    done_aid = await cluster.place(done, "w-1", old)
    lost_aid = await cluster.place(unreported, "w-1", old)
    assert done_aid is not None and lost_aid is not None
    new = await cluster.register("w-1", outcome(done_aid, done))
    assert new > old
    assert await cluster.assignment(done_aid) == {
        "state": "finished",
        "end_reason": "succeeded",
        "outcome": "succeeded",
        "exit_code": 0,
    }
    job = await cluster.job(done)
    assert (job["state"], job["exit_code"], job["detail"]) == ("succeeded", 0, "exit code 0")
    times = await cluster.times(done_aid)
    assert times["finished"] == times["ended"]  # reported as it ended: the registration's now()
    assert await cluster.sweep() == ([lost_aid], [unreported])
    assert (await cluster.job(done))["state"] == "succeeded"
    assert (await cluster.assignment(lost_aid))["end_reason"] == "worker_restarted"


async def test_a_late_outcome_on_a_lost_assignment_ends_its_pending_job(cluster: Cluster) -> None:
    """The outcome arrives after the sweep ended the assignment as lost and requeued the job:
    the assignment keeps its lost state and records the outcome, and the still pending job
    ends with that outcome (state, exit code, times, paths, detail), so it is not placed again."""
    old = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", old)
    assert aid is not None
    new = await cluster.register("w-1")  # no outcome: the job had not ended yet, say
    assert await cluster.sweep() == ([aid], [job_id])
    assert (await cluster.job(job_id))["state"] == "pending"
    await cluster.heartbeat("w-1", new, outcome(aid, job_id, "failed", 3, "exit code 3"))
    times = await cluster.times(aid)
    assert await cluster.assignment(aid) == {
        "state": "lost",
        "end_reason": "worker_restarted",
        "outcome": "failed",
        "exit_code": 3,
    }
    assert await cluster.job(job_id) == {
        "state": "failed",
        "exit_code": 3,
        "reason": "",
        "detail": "exit code 3",
        "stdout_path": f"/w/jobs/{job_id}-{aid}/stdout.log",
        "stderr_path": f"/w/jobs/{job_id}-{aid}/stderr.log",
        "started_unix_s": times["started"],
        "finished_unix_s": times["finished"],
    }
    # Dated within the lost assignment: the run ended before the leader ended it.
    assert times["created"] <= times["started"] <= times["finished"] <= times["ended"]
    assert await cluster.place(job_id, "w-1", new) is None  # the placer's claim skips it


async def test_a_late_outcome_of_a_job_placed_again_changes_only_the_old_assignment(cluster: Cluster) -> None:
    """The job was requeued and placed on another worker before the late outcome came: the
    old assignment records the outcome, the job and its new assignment are left alone."""
    old = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", old)
    assert aid is not None
    new = await cluster.register("w-1")
    await cluster.sweep()
    other = await cluster.register("w-2")
    again = await cluster.place(job_id, "w-2", other)
    assert again is not None
    await cluster.heartbeat("w-1", new, outcome(aid, job_id))
    assert (await cluster.assignment(aid))["outcome"] == "succeeded"
    assert await cluster.assignment(again) == {
        "state": "active",
        "end_reason": None,
        "outcome": None,
        "exit_code": None,
    }
    assert (await cluster.job(job_id))["state"] == "assigned"


async def test_outcomes_of_active_assignments_are_recorded_as_before(cluster: Cluster) -> None:
    """A succeeded outcome finishes its active assignment and job; a cancelled one, one of
    another worker's assignment, and one repeated after the first was recorded change nothing."""
    incarnation = await cluster.register("w-1")
    other = await cluster.register("w-2")
    ok, stopped, foreign = await cluster.submit(), await cluster.submit(), await cluster.submit()
    ok_aid = await cluster.place(ok, "w-1", incarnation)
    stopped_aid = await cluster.place(stopped, "w-1", incarnation)
    foreign_aid = await cluster.place(foreign, "w-2", other)
    assert ok_aid and stopped_aid and foreign_aid
    await cluster.heartbeat(
        "w-1",
        incarnation,
        outcome(ok_aid, ok),
        outcome(stopped_aid, stopped, "cancelled", None, "stopped"),
        outcome(foreign_aid, foreign),
    )
    assert await cluster.assignment(ok_aid) == {
        "state": "finished",
        "end_reason": "succeeded",
        "outcome": "succeeded",
        "exit_code": 0,
    }
    first = await cluster.job(ok)
    assert (first["state"], first["exit_code"]) == ("succeeded", 0)
    for aid in (stopped_aid, foreign_aid):
        assert await cluster.assignment(aid) == {
            "state": "active",
            "end_reason": None,
            "outcome": None,
            "exit_code": None,
        }
    assert (await cluster.job(stopped))["state"] == "assigned"
    assert (await cluster.job(foreign))["state"] == "assigned"
    await cluster.heartbeat("w-1", incarnation, outcome(ok_aid, ok, "failed", 1, "again"))
    assert await cluster.job(ok) == first
    assert (await cluster.assignment(ok_aid))["outcome"] == "succeeded"


async def _wait_until_blocked(admin: PgConnection, blocked: PgConnection) -> None:
    """Until ``blocked``'s session waits for a lock (another session's state: poll it)."""
    query = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1"
    with trio.fail_after(10):
        while await admin.fetchval(query, blocked.backend_pid) != "Lock":  # noqa: ASYNC110 (another session)
            await trio.sleep(0.02)


def _outcome_args(aid: int) -> tuple[object, ...]:
    return ("w-1", [aid], ["succeeded"], [0], [None], [None], [None], [None], ["exit code 0"])


@pytest.mark.parametrize("claim_first", [True, False])
async def test_a_late_outcome_and_a_placement_claim_never_both_take_the_job(
    cluster: Cluster, claim_first: bool
) -> None:
    """The placer's claim and the late outcome's end of the pending job race for its row: the
    one that commits first wins, and the other, having waited for the row lock, re-checks the
    newest row and leaves the job alone (claimed: the job stays assigned; ended: no claim)."""
    old = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", old)
    assert aid is not None
    new = await cluster.register("w-1")
    await cluster.sweep()
    placer = await PgConnection.connect(cluster.database_url)
    worker = await PgConnection.connect(cluster.database_url)
    try:
        first, second = (placer, worker) if claim_first else (worker, placer)
        await first.execute("BEGIN")
        claimed: list[int | None] = []

        async def claim() -> None:
            claimed.append(await cluster.place(job_id, "w-1", new, conn=placer))

        async def report() -> None:
            assert await worker.fetchval(queries.RECORD_OUTCOMES, *_outcome_args(aid)) == 1

        async with trio.open_nursery() as nursery:
            if claim_first:
                await claim()
                nursery.start_soon(report)
            else:
                await report()
                nursery.start_soon(claim)
            await _wait_until_blocked(cluster.admin, second)
            await first.execute("COMMIT")
    finally:
        await placer.close()
        await worker.close()
    job = await cluster.job(job_id)
    assert (await cluster.assignment(aid))["outcome"] == "succeeded"
    if claim_first:
        assert claimed[0] is not None and job["state"] == "assigned"
    else:
        assert claimed == [None] and job["state"] == "succeeded"


async def test_a_copy_of_an_applied_registration_gets_its_incarnation_and_an_older_one_is_refused(
    cluster: Cluster,
) -> None:
    """A registration sent again with the same agent run and number (a retry, a hedged copy)
    gets the incarnation the first one created and starts none; one numbered below the latest of
    its run is refused, naming the field, and changes nothing; a higher number, or another run
    (the agent restarted), starts a new incarnation; without a run id every one does."""
    first = await cluster.register_as("w-1", "run-a", 1)
    assert await cluster.register_as("w-1", "run-a", 1) == first
    assert await cluster.current_incarnation("w-1") == first
    second = await cluster.register_as("w-1", "run-a", 2)
    assert second > first
    with pytest.raises(InvalidArgument, match="registration_seq must be above 2"):
        await cluster.register_as("w-1", "run-a", 1)
    assert await cluster.current_incarnation("w-1") == second
    restarted = await cluster.register_as("w-1", "run-b", 1)
    assert restarted > second
    plain = await cluster.register_as("w-1", "", 0)
    assert await cluster.register_as("w-1", "", 0) > plain > restarted


async def test_an_incarnation_no_agent_heartbeats_under_ends_none_of_the_running_ones_jobs(
    cluster: Cluster,
) -> None:
    """A registration the running agent did not send (a late copy of an old one, or another
    process claiming its id) starts an incarnation, but the leader's sweep leaves the running
    incarnation's assignment alone while nobody heartbeats under the new one; the running
    agent's next heartbeat is told to register again (it stops its jobs first), and once an
    agent heartbeats under a newer incarnation the sweep ends the old assignment and requeues
    its job."""
    running = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", running)
    assert aid is not None
    claimed = await cluster.register_as("w-1", "someone-else", 1)
    assert claimed != running
    assert await cluster.sweep() == ([], [])
    assert (await cluster.assignment(aid))["state"] == "active"
    assert (await cluster.heartbeat("w-1", running)).reregister
    again = await cluster.register("w-1")  # the running agent, having stopped its job
    assert again not in (running, claimed)
    assert await cluster.sweep() == ([aid], [job_id])


async def test_a_not_started_report_ends_the_assignment_and_places_the_job_again_at_once(
    cluster: Cluster,
) -> None:
    """A worker whose incarnation lives on reports an accepted assignment it never started
    (``not_started``): the assignment ends stopped (``not_started``), the job is pending again
    with no attempt spent, no loss and no backoff, and can be placed again on the same worker;
    a copy of the report, or one for an assignment the leader already ended, changes nothing;
    a job whose cancel was asked ends cancelled."""
    incarnation = await cluster.register("w-1")
    job_id, cancelled = await cluster.submit(), await cluster.submit()
    aid = await cluster.place(job_id, "w-1", incarnation)
    cancelled_aid = await cluster.place(cancelled, "w-1", incarnation)
    assert aid is not None and cancelled_aid is not None
    await cluster.admin.execute("UPDATE jobs SET cancel_requested = true WHERE id = $1", cancelled)
    detail = "killed by its reaper at the fence deadline: not started: the fence deadline had passed"
    reports = [
        outcome(a, j, "not_started", None, detail) for a, j in ((aid, job_id), (cancelled_aid, cancelled))
    ]
    await cluster.heartbeat("w-1", incarnation, *reports)
    assert await cluster.assignment(aid) == {
        "state": "stopped",
        "end_reason": "not_started",
        "outcome": None,
        "exit_code": None,
    }
    row = await cluster.admin.fetchrow(
        "SELECT state, failures, losses, not_before, reason, started_at FROM jobs WHERE id = $1", job_id
    )
    assert row is not None
    assert dict(row) == {
        "state": "pending",
        "failures": 0,
        "losses": 0,
        "not_before": None,
        "reason": "",
        "started_at": None,
    }
    assert (await cluster.job(cancelled))["state"] == "cancelled"
    allocated = await cluster.admin.fetchval(
        "SELECT cpu_allocated_millis FROM worker_allocations WHERE worker_id = 'w-1'"
    )
    assert allocated == 0
    await cluster.heartbeat("w-1", incarnation, *reports)  # a copy
    assert (await cluster.job(job_id))["state"] == "pending"
    again = await cluster.place(job_id, "w-1", incarnation)
    assert again is not None and again != aid
    await cluster.heartbeat("w-1", incarnation, reports[0])  # late: of the ended assignment
    assert await cluster.assignment(again) == {
        "state": "active",
        "end_reason": None,
        "outcome": None,
        "exit_code": None,
    }
    assert (await cluster.job(job_id))["state"] == "assigned"


async def test_a_fenced_report_ends_the_assignment_as_lost_and_places_the_job_again(
    cluster: Cluster,
) -> None:
    """A worker whose incarnation lives on reports a run its fence killed (``fenced``): the
    assignment ends lost (``self_fence``), the job is pending again at once with one loss and
    no attempt spent (one when it counts losses), and can be placed again on the same worker; a
    copy of the report changes nothing, nor does one for an assignment the leader ended."""
    incarnation = await cluster.register("w-1")
    job_id, counting = await cluster.submit(), await cluster.submit()
    await cluster.admin.execute("UPDATE jobs SET count_lost = true, max_attempts = 3 WHERE id = $1", counting)
    aid = await cluster.place(job_id, "w-1", incarnation)
    counting_aid = await cluster.place(counting, "w-1", incarnation)
    assert aid is not None and counting_aid is not None
    detail = "killed by its reaper at the fence deadline: killed by signal 9"
    reports = [outcome(a, j, "fenced", -9, detail) for a, j in ((aid, job_id), (counting_aid, counting))]
    await cluster.heartbeat("w-1", incarnation, *reports)
    assert await cluster.assignment(aid) == {
        "state": "lost",
        "end_reason": "self_fence",
        "outcome": None,
        "exit_code": None,
    }
    rows = {
        r["id"]: dict(r)
        for r in await cluster.admin.fetch(
            "SELECT id, state, failures, losses, not_before FROM jobs WHERE id = ANY($1::bigint[])",
            [job_id, counting],
        )
    }
    assert rows[job_id] == {"id": job_id, "state": "pending", "failures": 0, "losses": 1, "not_before": None}
    assert rows[counting] == {
        "id": counting,
        "state": "pending",
        "failures": 1,
        "losses": 1,
        "not_before": None,
    }
    await cluster.heartbeat("w-1", incarnation, *reports)  # a copy
    assert (await cluster.job(job_id))["state"] == "pending"
    again = await cluster.place(job_id, "w-1", incarnation)
    assert again is not None and again != aid
    await cluster.heartbeat("w-1", incarnation, reports[0])  # late: of the ended assignment
    assert (await cluster.assignment(again))["state"] == "active"
    assert (await cluster.job(job_id))["state"] == "assigned"


UNSPENT = ("not_started", "released", "drained", "worker_left")
"""Ends of a running job's assignment that spend no attempt and count no loss."""
LOST = ("worker_dead", "withdrawn")
"""Ends that count a loss (the orphan sweep of a dead worker; an unconfirmed assignment withdrawn)."""


async def test_every_end_of_an_assignment_leaves_its_job_by_one_rule(cluster: Cluster) -> None:
    """However a running job's assignment ends without an outcome, its job goes by one rule
    (schema.sql, after_loss): when its cancel was asked, cancelled with its run's start and its
    reason kept (the user's acknowledged cancel as well); else pending with no start, at once
    with no reason after an end that spent nothing, after a backoff that its reason names after
    a loss."""
    caps = [60.0]
    found: dict[tuple[str, bool], dict[str, object]] = {}
    for how in (*UNSPENT, *LOST, "cancel_acknowledged"):
        for cancel in (False, True):
            if how == "cancel_acknowledged" and not cancel:
                continue
            worker_id = f"w-{how}-{cancel}"
            incarnation = await cluster.register(worker_id)
            job_id = await cluster.submit()
            aid = await cluster.place(job_id, worker_id, incarnation)
            assert aid is not None
            await cluster.admin.execute(
                "UPDATE jobs SET state = 'running', started_at = now(), reason = 'r',"
                " cancel_requested = $2 WHERE id = $1",
                job_id,
                cancel,
            )
            if how == "not_started":
                await cluster.heartbeat(
                    worker_id, incarnation, outcome(aid, job_id, "not_started", None, "x")
                )
            elif how == "released":
                await cluster.admin.fetchval(queries.RELEASE_UNHELD_ASSIGNMENTS, worker_id, incarnation, [])
            elif how == "drained":
                await cluster.admin.fetch(queries.END_DRAINED_ASSIGNMENTS, EPOCH, [aid])
            elif how in ("worker_left", "worker_dead"):
                state = "left" if how == "worker_left" else "dead"
                await cluster.admin.execute("UPDATE workers SET state = $2 WHERE id = $1", worker_id, state)
                await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, caps, 500)
            else:
                requeue = how == "withdrawn"
                await cluster.admin.fetch(
                    queries.END_CANCELLED_ASSIGNMENTS, EPOCH, [aid], how, requeue, caps if requeue else []
                )
            row = await cluster.admin.fetchrow(
                "SELECT state, started_at IS NOT NULL AS started, losses,"
                " CASE WHEN reason LIKE 'backoff: placed again after %' THEN 'backoff' ELSE reason END"
                " AS reason FROM jobs WHERE id = $1",
                job_id,
            )
            assert row is not None
            found[how, cancel] = dict(row)
    lost = {how: int(how in LOST) for how in (*UNSPENT, *LOST, "cancel_acknowledged")}
    assert found == {
        (how, cancel): {"state": "cancelled", "started": True, "reason": "r", "losses": lost[how]}
        if cancel
        else {
            "state": "pending",
            "started": False,
            "reason": "backoff" if lost[how] else "",
            "losses": lost[how],
        }
        for how, cancel in found
    }


async def test_a_reported_run_is_dated_by_the_databases_clock(cluster: Cluster) -> None:
    """An outcome says how long its run lasted and how long before its report it ended, by the
    worker's monotonic clock: the job finished that long before the database recorded the report
    (the assignment's end) and started the run's length before that."""
    incarnation = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", incarnation)
    assert aid is not None
    await cluster.backdate(job_id, 3600.0)  # placed an hour ago: nothing clamps the run's times
    await cluster.heartbeat("w-1", incarnation, outcome(aid, job_id, run_ms=90_000, ended_ago_ms=250))
    times = await cluster.times(aid)
    assert times["finished"] == pytest.approx(times["ended"] - 0.25, abs=1e-6)
    assert times["started"] == pytest.approx(times["finished"] - 90.0, abs=1e-6)


@pytest.mark.parametrize(
    ("run_ms", "ended_ago_ms"),
    [(0, 0), (10_000_000, 0), (0, 10_000_000), (3_153_600_000_000, 3_153_600_000_000)],
)
async def test_a_runs_dates_never_leave_its_assignment(
    cluster: Cluster, run_ms: int, ended_ago_ms: int
) -> None:
    """However long a worker says its run lasted, or how long ago it ended (up to the limit), the
    job starts no earlier than its assignment was created (nor its submission) and finishes no
    earlier than it started and no later than the database recorded its end."""
    incarnation = await cluster.register("w-1")
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, "w-1", incarnation)
    assert aid is not None
    await cluster.heartbeat(
        "w-1", incarnation, outcome(aid, job_id, run_ms=run_ms, ended_ago_ms=ended_ago_ms)
    )
    times = await cluster.times(aid)
    assert all(t is not None for t in times.values())
    assert times["submitted"] <= times["created"] <= times["started"] <= times["finished"] <= times["ended"]  # type: ignore[operator]
