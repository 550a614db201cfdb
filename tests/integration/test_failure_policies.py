"""Failure policies on a real PostgreSQL: retry_on_exit, no_retry_on (schema.sql, retry_refusal
through after_run and record_outcomes) and an array's max_failed_tasks (array_task_failed).

The leader's statements are run directly on an admin connection holding the lease at epoch 1;
what a worker sends goes through an ingest actor, as in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
from serving import ingest_and_leader
from test_retries import Cluster as RetriesCluster

from actors import queries
from ops import checker
from ops.invariants import wrong_final_states
from protocol import pb
from runtime.aio import PgConnection
from runtime.errors import InvalidArgument
from runtime.jobs import ArrayRange

EPOCH = 1


@attrs.frozen
class Cluster(RetriesCluster):
    """test_retries' cluster (register, heartbeat, submit, place), reading what a policy changes."""

    async def job(self, job_id: int) -> dict[str, Any]:
        row = await self.admin.fetchrow(
            "SELECT state, failures, reason, detail, cancel_requested FROM jobs WHERE id = $1", job_id
        )
        assert row is not None
        return dict(row)

    async def tasks(self, array_id: int) -> list[int]:
        rows = await self.admin.fetch(
            "SELECT id FROM jobs WHERE array_id = $1 ORDER BY array_index", array_id
        )
        return [int(r["id"]) for r in rows]

    async def jobs_stored(self) -> int:
        return int(await self.admin.fetchval("SELECT count(*) FROM jobs"))


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH, presence_interval_s=1.0) as (cp, admin):
        yield Cluster(cp=cp, admin=admin)


def failed(assignment_id: int, job_id: int, *, exit_code: int | None = 3, detail: str = "") -> pb.JobOutcome:
    return pb.JobOutcome(
        assignment_id=assignment_id,
        job_id=job_id,
        state="failed",
        has_exit_code=exit_code is not None,
        exit_code=exit_code or 0,
        run_ms=1000,
        detail=detail or f"exit code {exit_code}",
    )


async def test_a_failure_whose_exit_code_is_listed_is_retried(cluster: Cluster) -> None:
    """A run that exits with a code in retry_on_exit is retried as any failure: the job is
    pending again with an attempt spent."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=3, retry_on_exit=(1, 75))
    aid = await cluster.place(job_id, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, failed(aid, job_id, exit_code=75))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("pending", 1)
    assert job["reason"] == "retrying: attempt 1 of 3 failed (exit code 75)"


async def test_a_failure_whose_exit_code_is_not_listed_fails_the_job_at_once(cluster: Cluster) -> None:
    """A run that exits with a code not in retry_on_exit ends the job failed, attempts left
    or not, its detail saying why; the assignment keeps the worker's detail."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=5, retry_on_exit=(1, 75))
    aid = await cluster.place(job_id, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, failed(aid, job_id, exit_code=2))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"], job["reason"]) == ("failed", 1, "")
    assert job["detail"] == "exit code 2 is not in retry_on_exit [1, 75]"
    detail = await cluster.admin.fetchval("SELECT detail FROM assignments WHERE id = $1", aid)
    assert detail == "exit code 2"


async def test_a_failure_for_a_reason_in_no_retry_on_fails_the_job_at_once(cluster: Cluster) -> None:
    """A run that failed for a reason no_retry_on names ends the job failed at once, its
    detail the run's and why it was not retried; a reason it does not name is retried, and
    retry_on_exit does not judge runs that failed for a reason."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=5, retry_on_exit=(1,), no_retry_on=("oom_killed",))
    first = await cluster.place(job_id, "w-1", incarnation)
    timeout = "timeout: ran past its timeout_s of 1 s and was stopped"
    await cluster.heartbeat("w-1", incarnation, failed(first, job_id, exit_code=None, detail=timeout))
    assert (await cluster.job(job_id))["state"] == "pending"
    await cluster.admin.execute("UPDATE jobs SET not_before = NULL WHERE id = $1", job_id)
    second = await cluster.place(job_id, "w-1", incarnation)
    oom = "oom_killed: the kernel killed it"
    await cluster.heartbeat("w-1", incarnation, failed(second, job_id, exit_code=137, detail=oom))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("failed", 2)
    assert job["detail"] == oom + " (not retried: oom_killed is in no_retry_on [oom_killed])"


async def test_the_leaders_timeout_of_a_job_with_no_retry_on_timeout_fails_it_at_once(
    cluster: Cluster,
) -> None:
    """A run the leader stops past its timeout fails for reason timeout: with timeout in
    no_retry_on, the job ends failed although attempts are left."""
    incarnation = await cluster.register()
    job_id = await cluster.submit(max_attempts=3, timeout_s=0.001, no_retry_on=("timeout",))
    aid = await cluster.place(job_id, "w-1", incarnation)
    await trio.sleep(0.05)
    await cluster.admin.fetch(queries.END_TIMED_OUT_ASSIGNMENTS, EPOCH, [aid])
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("failed", 1)
    assert job["detail"].startswith("timeout: the leader stopped it")
    assert job["detail"].endswith("(not retried: timeout is in no_retry_on [timeout])")


async def test_a_run_lost_with_its_worker_spends_nothing_whatever_the_policy(cluster: Cluster) -> None:
    """A run lost with its worker is no failure: the job with a retry_on_exit is pending
    again with no attempt spent (unless count_lost, as before)."""
    old = await cluster.register()
    job_id = await cluster.submit(max_attempts=2, retry_on_exit=(1,), no_retry_on=("timeout",))
    await cluster.place(job_id, "w-1", old)
    await cluster.register()  # a new incarnation: the old one's runs are lost
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("pending", 0)


async def test_a_counted_loss_spends_an_attempt_but_is_never_refused_by_the_policy(cluster: Cluster) -> None:
    """With count_lost, a run lost with its worker spends an attempt, and with attempts left the
    job is pending again: a loss has no exit code or reason for the policy to judge."""
    old = await cluster.register()
    job_id = await cluster.submit(max_attempts=2, count_lost=True, retry_on_exit=(1,))
    await cluster.place(job_id, "w-1", old)
    await cluster.register()
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("pending", 1)


async def test_a_late_failure_the_policy_refuses_ends_the_requeued_job_failed(cluster: Cluster) -> None:
    """The failure of a run lost with its worker arrives after the requeue: an exit code not
    in retry_on_exit ends the pending job failed, saying why, though attempts are left."""
    old = await cluster.register()
    job_id = await cluster.submit(max_attempts=3, retry_on_exit=(1,))
    aid = await cluster.place(job_id, "w-1", old)
    new = await cluster.register()
    await cluster.admin.fetchrow(queries.END_ORPHANED_ASSIGNMENTS, EPOCH, [], 500)
    assert (await cluster.job(job_id))["state"] == "pending"
    await cluster.heartbeat("w-1", new, failed(aid, job_id, exit_code=4))
    job = await cluster.job(job_id)
    assert (job["state"], job["failures"]) == ("failed", 1)
    assert job["detail"] == "exit code 4 is not in retry_on_exit [1]"


async def test_an_array_cancels_its_other_tasks_once_max_failed_tasks_have_failed(cluster: Cluster) -> None:
    """An array of 4 with max_failed_tasks 2: the first failed task changes nothing else; the
    second ends the array: its pending task is cancelled at once and its running one is
    asked to stop, both with a detail naming max_failed_tasks, and the array reads failed."""
    incarnation = await cluster.register()
    array_id = await cluster.submit(array=ArrayRange(first_index=0, last_index=3, max_failed_tasks=2))
    t0, t1, t2, t3 = await cluster.tasks(array_id)
    a0 = await cluster.place(t0, "w-1", incarnation)
    a1 = await cluster.place(t1, "w-1", incarnation)
    await cluster.place(t2, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, failed(a0, t0))
    assert (await cluster.job(t3))["state"] == "pending"
    assert not (await cluster.job(t2))["cancel_requested"]
    await cluster.heartbeat("w-1", incarnation, failed(a1, t1))
    pending = await cluster.job(t3)
    assert pending["state"] == "cancelled"
    assert pending["detail"].startswith("max_failed_tasks: cancelled because 2 of the array's tasks failed")
    running = await cluster.job(t2)
    assert (running["state"], running["cancel_requested"]) == ("assigned", True)
    assert running["detail"].startswith("max_failed_tasks:")
    states = await cluster.admin.fetch("SELECT state FROM dependency_states($1)", [array_id])
    assert [r["state"] for r in states] == ["failed"]


async def test_a_task_failing_while_max_failed_tasks_stops_it_ends_failed_and_the_checker_accepts_it(
    cluster: Cluster, database_url: str
) -> None:
    """A running task asked to stop by its array's max_failed_tasks that fails on its own before
    it stops ends failed with attempts left (no retry once a cancel was asked), and the
    checker's final-state rule accepts that end."""
    incarnation = await cluster.register()
    array_id = await cluster.submit(
        array=ArrayRange(first_index=0, last_index=2, max_failed_tasks=1), max_attempts=2
    )
    t0, t1, _ = await cluster.tasks(array_id)
    a1 = await cluster.place(t1, "w-1", incarnation)
    for _ in range(2):  # t0 spends both its attempts: failed for good
        a0 = await cluster.place(t0, "w-1", incarnation)
        await cluster.heartbeat("w-1", incarnation, failed(a0, t0))
    assert (await cluster.job(t0))["state"] == "failed"
    assert (await cluster.job(t1))["cancel_requested"]
    await cluster.heartbeat("w-1", incarnation, failed(a1, t1))
    ended = await cluster.job(t1)
    assert (ended["state"], ended["failures"]) == ("failed", 1)
    history = await checker.load_history(database_url)
    assert t1 not in wrong_final_states(history)


async def test_an_array_without_max_failed_tasks_lets_each_task_end_by_itself(cluster: Cluster) -> None:
    """Without max_failed_tasks, a failed task leaves its siblings as they were (as before)."""
    incarnation = await cluster.register()
    array_id = await cluster.submit(array=ArrayRange(first_index=1, last_index=2))
    first, second = await cluster.tasks(array_id)
    aid = await cluster.place(first, "w-1", incarnation)
    await cluster.heartbeat("w-1", incarnation, failed(aid, first))
    assert (await cluster.job(first))["state"] == "failed"
    assert (await cluster.job(second))["state"] == "pending"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"retry_on_exit": [0]}, r"^retry_on_exit\[0\] must be between 1 and 255, got 0"),
        ({"retry_on_exit": [256]}, r"^retry_on_exit\[0\] must be between 1 and 255, got 256"),
        ({"retry_on_exit": [1, 75, 1]}, r"^retry_on_exit must list each exit code once \(1 twice\)"),
        ({"no_retry_on": ["oom"]}, r"^no_retry_on\[0\] must be a failure reason: timeout, oom_killed"),
        ({"no_retry_on": ["timeout", "timeout"]}, r"^no_retry_on must list each reason once"),
        (
            {"array": pb.JobArray(first_index=1, last_index=3, max_failed_tasks=4)},
            r"^array\.max_failed_tasks must be between 1 and the array's 3 tasks",
        ),
    ],
)
async def test_a_bad_failure_policy_is_refused_naming_the_field_and_nothing_is_stored(
    cluster: Cluster, changes: dict[str, Any], message: str
) -> None:
    """An exit code out of 1..255 or listed twice, an unknown or repeated reason, or a
    max_failed_tasks above the array's tasks is refused naming the field, the value and the
    limit; nothing is stored."""
    spec = pb.JobSpec(name="t", cpu_millis=100, memory_mb=16, command=pb.CommandRuntime(argv=["false"]))
    for name, value in changes.items():
        setattr(spec, name, value)
    with pytest.raises(InvalidArgument, match=message):
        await cluster.cp.call("submit_job", pb.SubmitJobRequest(spec=spec))
    with pytest.raises(InvalidArgument, match=message.replace("^", r"^specs\[0\]\.")):
        await cluster.cp.call("submit_jobs", pb.SubmitJobsRequest(specs=[spec]))
    assert await cluster.jobs_stored() == 0


@pytest.mark.parametrize(
    ("retry_on_exit", "no_retry_on", "detail", "exit_code", "refusal"),
    [
        ([], [], "exit code 2", 2, None),
        ([1, 75], [], "exit code 75", 75, None),
        ([1, 75], [], "exit code 2", 2, "exit code 2 is not in retry_on_exit [1, 75]"),
        ([1], [], "exit code -9", -9, "exit code -9 is not in retry_on_exit [1]"),
        ([1], [], "cannot start", None, "it ended with no exit code, and retry_on_exit is [1]: cannot start"),
        ([1], [], "timeout: ran past its timeout_s", None, None),
        ([1], ["timeout"], "timeout", None, "timeout (not retried: timeout is in no_retry_on [timeout])"),
        (
            [],
            ["oom_killed", "timeout"],
            "oom_killed: killed",
            137,
            "oom_killed: killed (not retried: oom_killed is in no_retry_on [oom_killed, timeout])",
        ),
        ([], ["oom_killed"], "workdir_not_found: /x", None, None),
    ],
)
async def test_retry_refusal_is_the_one_rule_of_failure_policies(
    cluster: Cluster,
    retry_on_exit: list[int],
    no_retry_on: list[str],
    detail: str,
    exit_code: int | None,
    refusal: str | None,
) -> None:
    """A run naming a reason (the word before its colon, or a bare word) is judged by
    no_retry_on only; one naming none by its exit code against retry_on_exit only (a signal's
    negative code, or none, is never listed); empty lists refuse nothing."""
    got = await cluster.admin.fetchval(
        "SELECT retry_refusal($1::int[], $2::text[], $3, $4)", retry_on_exit, no_retry_on, detail, exit_code
    )
    assert got == refusal


async def test_tasks_failing_in_concurrent_transactions_count_each_other(
    cluster: Cluster, database_url: str
) -> None:
    """Two tasks of an array with max_failed_tasks 2 failing in two transactions at once: the
    second waits on the array's lock for the first's commit, then counts both and cancels the
    rest."""
    array_id = await cluster.submit(array=ArrayRange(first_index=0, last_index=2, max_failed_tasks=2))
    t0, t1, t2 = await cluster.tasks(array_id)
    fail = "UPDATE jobs SET state = 'failed', finished_at = now() WHERE id = $1"
    waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    other = await PgConnection.connect(database_url)
    try:
        async with trio.open_nursery() as nursery:

            async def second() -> None:
                async with other.transaction():
                    await other.execute(fail, t1)

            async with cluster.admin.transaction():
                await cluster.admin.execute(fail, t0)
                nursery.start_soon(second)
                with trio.fail_after(30):  # until the second waits on the array's lock
                    while not await cluster.admin.fetchval(waiting):  # noqa: ASYNC110 (another process's lock)
                        await trio.sleep(0.01)
                assert (await cluster.job(t2))["state"] == "pending"
            # The first committed (having counted 1 failed task); the second goes on.
    finally:
        await other.close()
    job = await cluster.job(t2)
    assert job["state"] == "cancelled"
    assert job["detail"].startswith("max_failed_tasks: cancelled because 2 of the array's tasks failed")
