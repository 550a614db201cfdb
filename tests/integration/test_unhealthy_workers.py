"""Worker health and retries on a real PostgreSQL.

The statements first: what the leader's health read judges (queries.WORKER_RUNS), its fenced
write (RECORD_WORKER_HEALTH) and the operator's uncordon, the placement statement refusing an
unhealthy worker until its probe is due, and the pending read naming where a job failed; what a
worker sends goes through a real ingest, the leader's statements run on an admin connection
holding the lease at epoch 1.

Then the whole: one control plane (every actor, in this process) and three real agents, one of
which fails every job it runs: it is marked unhealthy, gets nothing new after its mark, the
jobs that failed there are retried elsewhere and succeed, status shows the mark and its reason,
and the operator's uncordon clears it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from serving import ingest_and_leader
from test_retries import EPOCH, Cluster, failed

from actors import queries
from actors.control_plane import run_control_plane
from actors.health import JOB_FAULTS, judge_health
from actors.reconciler_store import worker_runs
from agent.main import run_agent
from ops.client.results import ClusterStatus, status_from_pb
from protocol import pb
from runtime.aio import PgConnection, asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.constraints import parse_constraint
from runtime.jobs import ArrayRange, CommandRuntime, JobSpec
from runtime.settings.agent import AgentSettings
from runtime.settings.control_plane import ControlPlaneSettings
from runtime.settings.leader import (
    PlacerSettings,
    ReconcilerSettings,
)
from runtime.wire_jobs import job_spec_to_pb


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH, presence_interval_s=1.0) as (cp, admin):
        yield Cluster(cp=cp, admin=admin)


def succeeded(assignment_id: int, job_id: int) -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state="succeeded",
        has_exit_code=True,
        exit_code=0,
        run_ms=1000,
        detail="exit code 0",
    )


async def run_once(cluster: Cluster, worker_id: str, incarnation: int, outcome: Any) -> tuple[int, int]:
    """A job submitted, placed on ``worker_id`` and ended there with ``outcome(aid, job_id)``."""
    job_id = await cluster.submit()
    aid = await cluster.place(job_id, worker_id, incarnation)
    await cluster.heartbeat(worker_id, incarnation, outcome(aid, job_id))
    return job_id, aid


async def health_read(admin: PgConnection, window_s: float = 600.0) -> dict[str, dict[str, Any]]:
    rows = await admin.fetch(queries.WORKER_RUNS, 10, window_s, list(JOB_FAULTS))
    return {r["id"]: dict(r) for r in rows}


async def record(
    admin: PgConnection, worker_id: str, version: int, unhealthy: bool, probe_after_s: float
) -> list[Any]:
    rows = await admin.fetch(
        queries.RECORD_WORKER_HEALTH, [worker_id], [version], [unhealthy], ["unhealthy: test"], probe_after_s
    )
    return [tuple(r) for r in rows]


async def test_the_health_read_judges_the_runs_a_worker_ended_itself_newest_first(cluster: Cluster) -> None:
    """A failure, a success and a timeout (the job's own doing, not judged) ended on w-1: the
    read lists the first two, newest first, with their details; w-2 has none."""
    one = await cluster.register("w-1")
    await cluster.register("w-2")
    first, _ = await run_once(cluster, "w-1", one, failed)
    second, _ = await run_once(cluster, "w-1", one, succeeded)
    await run_once(cluster, "w-1", one, lambda aid, job: failed(aid, job, "timeout: ran past its timeout_s"))
    read = await health_read(cluster.admin)
    assert (read["w-1"]["job_ids"], read["w-1"]["failed"], read["w-1"]["details"]) == (
        [second, first],
        [False, True],
        ["exit code 0", "exit code 3"],
    )
    assert (read["w-1"]["health_version"], read["w-1"]["unhealthy"], read["w-1"]["takes_placements"]) == (
        0,
        False,
        True,
    )
    assert read["w-2"]["job_ids"] == []


async def test_a_mark_is_written_at_the_judged_version_only_and_an_uncordon_clears_it(
    cluster: Cluster,
) -> None:
    """The leader's mark applies to the version it judged, once; status shows it with its
    reason; a run that was there before it and ends after it is flagged, until the mark is
    renewed (which keeps when it was first made); an uncordon clears it and the runs before it
    are no longer judged, and a judgement of the version before the uncordon is not written."""
    one = await cluster.register("w-1")
    await run_once(cluster, "w-1", one, failed)
    running = await cluster.submit()
    running_aid = await cluster.place(running, "w-1", one)
    assert await record(cluster.admin, "w-1", 0, True, 0.0) == [("w-1", True)]
    assert await record(cluster.admin, "w-1", 0, True, 0.0) == []  # the version moved on
    status: pb.StatusReply = await cluster.cp.call("status", pb.StatusRequest())
    (worker,) = status.workers
    assert (worker.unhealthy, worker.unhealthy_reason) == (True, "unhealthy: test")
    assert worker.unhealthy_since_unix_s > 0
    await cluster.heartbeat("w-1", one, failed(running_aid, running))  # it was there before the mark
    assert (await health_read(cluster.admin))["w-1"]["after_mark"] == [True, False]
    since = await cluster.admin.fetchval("SELECT unhealthy_at FROM workers WHERE id = 'w-1'")
    assert await record(cluster.admin, "w-1", 1, True, 0.0) == [("w-1", True)]  # renewed
    assert (await health_read(cluster.admin))["w-1"]["after_mark"] == [False, False]
    assert await cluster.admin.fetchval("SELECT unhealthy_at FROM workers WHERE id = 'w-1'") == since

    reply: pb.WorkerScheduleReply = await cluster.cp.call(
        "uncordon_worker", pb.UncordonWorkerRequest(worker_id="w-1")
    )
    assert (reply.unhealthy, reply.unhealthy_reason) == (False, "")
    read = (await health_read(cluster.admin))["w-1"]
    assert (read["unhealthy"], read["health_version"], read["job_ids"]) == (False, 3, [])
    assert await record(cluster.admin, "w-1", 2, True, 0.0) == []


async def test_no_placement_commits_on_an_unhealthy_worker_until_its_probe_is_due(cluster: Cluster) -> None:
    """Marked with a probe an hour away, w-1 is refused by the placement statement; once the
    probe is due it takes the placement; clearing the mark by a success records when."""
    one = await cluster.register("w-1")
    await record(cluster.admin, "w-1", 0, True, 3600.0)
    job_id = await cluster.submit()
    rows = await cluster.admin.fetch(
        queries.COMMIT_PLACEMENTS, [job_id], ["w-1"], [one], EPOCH, True, [], [], [], [], []
    )
    assert [r["assignment_id"] for r in rows] == [None]
    await cluster.admin.execute("UPDATE workers SET unhealthy_probe_at = now() WHERE id = 'w-1'")
    aid = await cluster.place(job_id, "w-1", one)
    await cluster.heartbeat("w-1", one, succeeded(aid, job_id))
    assert (await health_read(cluster.admin))["w-1"]["after_mark"] == [True]
    assert await record(cluster.admin, "w-1", 1, False, 3600.0) == [("w-1", False)]
    row = await cluster.admin.fetchrow(
        "SELECT unhealthy_at, unhealthy_reason, unhealthy_probe_at, health_since IS NOT NULL AS since"
        " FROM workers WHERE id = 'w-1'"
    )
    assert row is not None and tuple(row) == (None, "", None, True)


async def test_the_pending_read_names_the_workers_where_a_job_failed(cluster: Cluster) -> None:
    """A job that failed on w-2 then w-1 is read pending with both (sorted); a fresh one with none."""
    one, two = await cluster.register("w-1"), await cluster.register("w-2")
    job_id = await cluster.submit(max_attempts=3, retry_backoff_s=0)
    for worker_id, incarnation in (("w-2", two), ("w-1", one)):
        aid = await cluster.place(job_id, worker_id, incarnation)
        await cluster.heartbeat(worker_id, incarnation, failed(aid, job_id))
    fresh = await cluster.submit()
    row = await cluster.admin.fetchrow(queries.PENDING_JOBS, 100)
    assert row is not None
    assert dict(zip(row["p_id"], row["p_failed_on"], strict=True)) == {job_id: "w-1 w-2", fresh: None}


async def test_the_health_read_says_where_else_each_job_failed_or_succeeded_and_its_siblings(
    cluster: Cluster,
) -> None:
    """For each judged run: how long ago it ended (newest first, so never less than the run
    before), whether the same job failed on another worker (a retry that failed there too) or
    succeeded on one (the worker's failure, then), and what it runs: jobs of one command share a
    digest, other commands do not; a job of no array has none."""
    one = await cluster.register("w-1")
    two = await cluster.register("w-2")

    async def on_both(outcome_elsewhere: Any) -> int:
        job_id = await cluster.submit(max_attempts=3)
        for (worker_id, incarnation), outcome in (("w-1", one), failed), (("w-2", two), outcome_elsewhere):
            aid = await cluster.place(job_id, worker_id, incarnation)
            await cluster.heartbeat(worker_id, incarnation, outcome(aid, job_id))
        return job_id

    failing_too = await on_both(failed)
    fine_elsewhere = await on_both(succeeded)
    other = JobSpec(name="t", cpu_millis=100, memory_mb=16, runtime=CommandRuntime(argv=("true",)))
    reply = await cluster.cp.call("submit_job", pb.SubmitJobRequest(spec=job_spec_to_pb(other.check())))
    other_id = int(reply.job_id)
    aid = await cluster.place(other_id, "w-1", one)
    await cluster.heartbeat("w-1", one, succeeded(aid, other_id))

    read = (await health_read(cluster.admin))["w-1"]
    assert read["job_ids"] == [other_id, fine_elsewhere, failing_too]
    assert read["failed_elsewhere"] == [False, False, True]
    assert read["succeeded_elsewhere"] == [False, True, False]
    assert read["array_ids"] == [None, None, None]
    keys = read["spec_keys"]
    assert keys[1] == keys[2] and keys[0] != keys[1]
    ages = read["ages_s"]
    assert 0 <= ages[0] <= ages[1] <= ages[2]


async def test_the_health_read_finds_a_jobs_other_runs_by_the_job_whatever_the_plan(cluster: Cluster) -> None:
    """The health read's look at a job's runs on other workers goes through the job (index
    assignments_by_job), also in the generic plan a prepared statement is given after five runs
    and keeps, made here while the table is small: a plan through
    assignments_finished_by_worker scans every run that ended in the window for each judged run
    (it made the statement take 1.3 to 2.8 s a pass with 10,000 runs)."""
    one = await cluster.register("w-1")
    two = await cluster.register("w-2")
    for worker_id, incarnation in (("w-1", one), ("w-2", two), ("w-1", one)):
        await run_once(cluster, worker_id, incarnation, failed)
    admin = cluster.admin
    await admin.execute(
        "PREPARE health_read(int, float8, text[]) AS " + queries.WORKER_RUNS + ";"
        " SET plan_cache_mode = force_generic_plan"
    )
    try:
        faults = ", ".join(f"'{reason}'" for reason in JOB_FAULTS)  # constants, no quotes in them
        rows = await admin.fetch(f"EXPLAIN EXECUTE health_read(10, 600, ARRAY[{faults}])")
    finally:
        await admin.execute("RESET plan_cache_mode; DEALLOCATE health_read")
    plan = [str(r[0]) for r in rows]
    other_runs = [line for line in plan if " on assignments o" in line]
    assert other_runs, "\n".join(plan)
    assert not any("assignments_finished_by_worker" in line for line in other_runs), "\n".join(plan)


async def on_trial(admin: PgConnection, trial_run_s: float = 5.0) -> dict[str, bool]:
    """Which live workers the placer's reads say are on trial (both reads must agree)."""
    rows = await admin.fetch(queries.LIVE_WORKERS, 600.0, trial_run_s)
    row = await admin.fetchrow(queries.ROUND_READ, 600.0, 0, 0, 100, [], trial_run_s, False)
    assert row is not None
    trial = {r["id"]: r["trial"] for r in rows}
    assert dict(zip(row["w_id"], row["w_trial"], strict=True)) == trial
    return trial


async def test_a_worker_is_on_trial_until_a_run_there_succeeds_or_runs_long_enough(cluster: Cluster) -> None:
    """A new worker is on trial; a failed run does not end it, a success does; a clear of its
    mark (here the operator's uncordon) puts it on trial again, as does its re-registration;
    a run that has run trial_run_s since a heartbeat listed it ends the trial too, also once it
    was cancelled; a trial_run_s of 0 puts no worker on trial."""
    one = await cluster.register("w-1")
    assert await on_trial(cluster.admin) == {"w-1": True}
    assert await on_trial(cluster.admin, 0.0) == {"w-1": False}
    await run_once(cluster, "w-1", one, failed)
    assert await on_trial(cluster.admin) == {"w-1": True}
    await run_once(cluster, "w-1", one, succeeded)
    assert await on_trial(cluster.admin) == {"w-1": False}

    assert await record(cluster.admin, "w-1", 0, True, 0.0) == [("w-1", True)]
    await cluster.cp.call("uncordon_worker", pb.UncordonWorkerRequest(worker_id="w-1"))
    assert await on_trial(cluster.admin) == {"w-1": True}
    await run_once(cluster, "w-1", one, succeeded)
    assert await on_trial(cluster.admin) == {"w-1": False}

    one = await cluster.register("w-1")  # the agent restarted
    assert await on_trial(cluster.admin) == {"w-1": True}
    long_running = await cluster.submit()
    aid = await cluster.place(long_running, "w-1", one)
    await cluster.admin.execute(
        "UPDATE assignments SET confirmed_at = now() - interval '4 seconds' WHERE id = $1", aid
    )
    assert await on_trial(cluster.admin) == {"w-1": True}
    await cluster.admin.execute(
        "UPDATE assignments SET confirmed_at = now() - interval '6 seconds' WHERE id = $1", aid
    )
    assert await on_trial(cluster.admin) == {"w-1": False}

    # A run cancelled (here as the leader ends a user's cancel) ends the trial if it had run
    # trial_run_s before its end, not if it had not.
    for ran_s, trial in ((2, True), (6, False)):
        one = await cluster.register("w-1")
        aid = await cluster.place(await cluster.submit(), "w-1", one)
        await cluster.admin.execute(
            "UPDATE assignments SET confirmed_at = now() - make_interval(secs => $2), state = 'cancelled',"
            " ended_at = now(), ended_epoch = 1, end_reason = 'cancelled_by_user' WHERE id = $1",
            aid,
            float(ran_s),
        )
        assert await on_trial(cluster.admin) == {"w-1": trial}, ran_s


# ---------------------------------------------------------------- a whole cluster

TIMEOUT_S = 120.0
JOBS = 24
BAD = "w-bad"
FAULTS = {
    # The worker: its jobs may hold one process only, so a job that forks fails at once.
    "pids_max": (1, ("sh", "-c", "sleep 1; true")),
    # A worker on which the job's command fails (wherever cgroups are not to be had): the job
    # runs in its folder under its worker's work_dir.
    "command": (4096, ("sh", "-c", f'case "$PWD" in */{BAD}/*) exit 3;; esac; sleep 1')),
}


@attrs.frozen
class Whole:
    """One control plane (cp-1, every actor) and three agents (w-1, w-2 and :data:`BAD`), a
    client of the control plane and an admin connection."""

    client: ControlPlaneClient
    admin: PgConnection

    async def submit(self, argv: tuple[str, ...], count: int) -> list[int]:
        spec = JobSpec(
            name="t", cpu_millis=1000, memory_mb=64, runtime=CommandRuntime(argv=argv), max_attempts=4,
            retry_backoff_s=0.2,
        )  # fmt: skip
        request = pb.SubmitJobsRequest(specs=[job_spec_to_pb(spec.check())] * count)
        reply: pb.SubmitJobsReply = await self.client.call("submit_jobs", request)
        return [int(j) for j in reply.job_ids]

    async def submit_array(self, argv: tuple[str, ...], tasks: int, *constraints: str) -> list[int]:
        """An array of ``tasks`` tasks of ``argv`` (each with two attempts), placed only where
        ``constraints`` hold; its tasks' ids."""
        spec = JobSpec(
            name="a", cpu_millis=1000, memory_mb=64, runtime=CommandRuntime(argv=argv), max_attempts=2,
            retry_backoff_s=0.2, array=ArrayRange(first_index=1, last_index=tasks),
            constraints=tuple(parse_constraint(c) for c in constraints),
        )  # fmt: skip
        reply: pb.SubmitJobReply = await self.client.call(
            "submit_job", pb.SubmitJobRequest(spec=job_spec_to_pb(spec.check()))
        )
        rows = await self.admin.fetch("SELECT id FROM jobs WHERE array_id = $1", int(reply.job_id))
        return [int(r["id"]) for r in rows]

    async def status(self) -> ClusterStatus:
        return status_from_pb(await self.client.call("status", pb.StatusRequest()))

    async def until(self, what: str, check: Any) -> Any:
        """Poll ``check()`` (async) until it returns something true; fail after TIMEOUT_S."""
        with trio.fail_after(TIMEOUT_S):
            while not (found := await check()):  # noqa: ASYNC110 (the database's state, polled)
                await trio.sleep(0.1)
        return found

    async def all_ended(self, job_ids: list[int]) -> bool:
        states = await self.admin.fetch("SELECT state FROM jobs WHERE id = ANY($1::bigint[])", job_ids)
        return all(r["state"] in ("succeeded", "failed", "cancelled") for r in states)


@asynccontextmanager
async def whole_cluster(database_url: str, tmp_path: Path, *, bad_pids_max: int) -> AsyncIterator[Whole]:
    """:class:`Whole`, the leader judging health every 0.25 s, with no probes (nothing but a
    success there or an uncordon clears a mark); :data:`BAD`'s jobs may hold ``bad_pids_max``
    processes. Deaths and self-fences are kept far off: a loaded machine must not move jobs."""
    settings = ControlPlaneSettings(
        cp_id="cp-1",
        database_url=database_url,
        placer=PlacerSettings(round_interval_s=0.05),
        reconciler=ReconcilerSettings(dead_after_s=30.0, health_interval_s=0.25, health_probe_after_s=0.0),
    )
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp = await nursery.start(run_control_plane, settings)
        agents = []
        for worker_id in ("w-1", "w-2", BAD):
            agent_settings = AgentSettings(
                worker_id=worker_id,
                control_planes=(cp.address,),
                cpu_millis=4000,
                memory_mb=4096,
                work_dir=str(tmp_path / worker_id),
                heartbeat_interval_s=0.1,
                heartbeat_timeout_s=1.0,
                self_fence_after_s=20.0,
                labels={"container": "none", "node": worker_id},
                job_pids_max=bad_pids_max if worker_id == BAD else 4096,
            )
            agents.append(await nursery.start(run_agent, agent_settings))
        with trio.fail_after(TIMEOUT_S):
            for agent in agents:
                await agent.wait_registered()
        client = ControlPlaneClient([cp.address], timeout_s=10.0)
        admin = await PgConnection.connect(database_url)
        try:
            yield Whole(client=client, admin=admin)
        finally:
            client.close()
            await admin.close()
            nursery.cancel_scope.cancel()


async def test_arrays_that_fail_everywhere_mark_no_worker(database_url: str, tmp_path: Path) -> None:
    """The issue's F1a, on three healthy workers whose last runs succeeded: an array of
    ``false`` that reaches one worker first (only it may run it: its ten last runs fail while
    the others' still succeeded), then one that fails on every worker, marks no worker at any
    time (no health change was ever written), and the rule, applied to the database's runs once
    every job has ended, marks none either."""
    async with whole_cluster(database_url, tmp_path, bad_pids_max=4096) as c:
        for worker_id in ("w-1", "w-2", BAD):
            done = await c.submit_array(("true",), 10, f"node={worker_id}")
            await c.until(f"{worker_id}'s successes", lambda done=done: c.all_ended(done))
        first = await c.submit_array(("false",), 20, "node=w-1")
        await c.until("the first array to fail", lambda: c.all_ended(first))
        everywhere = await c.submit_array(("false",), 60)
        await c.until("the second array to fail", lambda: c.all_ended(everywhere))

        failing = first + everywhere
        states = await c.admin.fetch("SELECT state FROM jobs WHERE id = ANY($1::bigint[])", failing)
        assert {r["state"] for r in states} == {"failed"}
        health = await c.admin.fetch("SELECT id, health_version, unhealthy_at FROM workers")
        assert {r["id"]: (r["health_version"], r["unhealthy_at"]) for r in health} == {
            w: (0, None) for w in ("w-1", "w-2", BAD)
        }
        settings = ReconcilerSettings()
        rows = await c.admin.fetch(
            queries.WORKER_RUNS, settings.health_window_runs, settings.health_window_s, list(JOB_FAULTS)
        )
        workers = [worker_runs(r) for r in rows]
        assert all(len(w.runs) == settings.health_window_runs for w in workers)
        assert judge_health(workers, settings).changes == ()


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_worker_that_fails_every_job_is_marked_and_its_jobs_succeed_elsewhere(
    database_url: str, tmp_path: Path, fault: str
) -> None:
    """Beside two healthy workers, one whose every job fails is marked unhealthy with its reason
    (status); nothing is placed there after its mark, no job runs there twice (its retries go
    elsewhere), and every job succeeds; the operator's uncordon clears the mark, after which it
    takes placements again, one at a time (it is on trial), fails them and is marked again."""
    bad_pids_max, argv = FAULTS[fault]
    async with whole_cluster(database_url, tmp_path, bad_pids_max=bad_pids_max) as c:
        if fault == "pids_max":
            labels = await c.admin.fetchval("SELECT labels->>'resources' FROM workers WHERE id = $1", BAD)
            if labels == "rlimit":
                pytest.skip("no cgroups on this machine: a pids limit is not enforced (resources=rlimit)")
        job_ids = await c.submit(argv, JOBS)

        async def marked() -> Any:
            return await c.admin.fetchrow(
                "SELECT unhealthy_at, unhealthy_reason FROM workers"
                " WHERE id = $1 AND unhealthy_at IS NOT NULL",
                BAD,
            )

        mark = await c.until("the bad worker to be marked", marked)
        assert mark["unhealthy_reason"].startswith("unhealthy: ")
        await c.until("every job to end", lambda: c.all_ended(job_ids))

        status = await c.status()
        shown = {w.id: w for w in status.workers}
        # Runs placed there before the mark and failing after it renew it: its reason is the last.
        reason = await c.admin.fetchval("SELECT unhealthy_reason FROM workers WHERE id = $1", BAD)
        assert shown[BAD].unhealthy and shown[BAD].unhealthy_reason == reason
        assert shown[BAD].unhealthy_since_unix_s == pytest.approx(mark["unhealthy_at"].timestamp(), abs=1e-3)
        assert not shown["w-1"].unhealthy and not shown["w-2"].unhealthy
        runs = await c.admin.fetch(
            "SELECT job_id, worker_id, outcome, created_at FROM assignments WHERE job_id = ANY($1::bigint[])",
            job_ids,
        )
        on_bad = [r for r in runs if r["worker_id"] == BAD]
        assert on_bad, "the bad worker ran nothing: the test shows nothing"
        assert all(r["outcome"] == "failed" for r in on_bad)
        assert all(r["created_at"] < mark["unhealthy_at"] for r in on_bad), "placed there after its mark"
        assert len({r["job_id"] for r in on_bad}) == len(on_bad), "a retry went back where it failed"
        states = await c.admin.fetch("SELECT state FROM jobs WHERE id = ANY($1::bigint[])", job_ids)
        assert {r["state"] for r in states} == {"succeeded"}

        # The operator clears it: it takes placements again (and, failing them, is marked again).
        reply: pb.WorkerScheduleReply = await c.client.call(
            "uncordon_worker", pb.UncordonWorkerRequest(worker_id=BAD)
        )
        assert not reply.unhealthy
        assert not (await c.status()).workers[-1].unhealthy
        cleared_at = await c.admin.fetchval("SELECT health_since FROM workers WHERE id = $1", BAD)
        more = await c.submit(argv, JOBS)
        await c.until("the bad worker to be marked again", marked)
        placed_again = await c.admin.fetchval(
            "SELECT count(*) FROM assignments WHERE worker_id = $1 AND created_at > $2", BAD, cleared_at
        )
        assert placed_again >= 1
        await c.until("the second batch to end", lambda: c.all_ended(more))
        # Re-admitted beside two proven workers, it was on trial: one job at a time, never a
        # burst (each run there was placed only once the one before had ended).
        trial_runs = await c.admin.fetch(
            "SELECT created_at, ended_at FROM assignments WHERE worker_id = $1 AND created_at > $2"
            " ORDER BY created_at",
            BAD,
            cleared_at,
        )
        for before, after in itertools.pairwise(trial_runs):
            assert before["ended_at"] is not None and after["created_at"] >= before["ended_at"]
