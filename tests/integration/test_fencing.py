"""The fence on a real PostgreSQL: stale epochs refused, takeovers wait for open fenced
transactions and for a placement statement in flight, frozen transactions ended by
idle_in_transaction_session_timeout, and the partial unique index that allows one active
assignment per job.

It is one file because it is the one specification of the fence (DESIGN's invariants 1 to 3,
argued in :mod:`actors.ledger`) against a real server: every test runs on the same seeded
database and ledger, and states one behaviour."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from prometheus_client import REGISTRY
from seeding import insert_job
from test_leader_pacing import ALLOCATION_MATCHES

from actors import queries
from actors.ledger import Ledger
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    DeclareDeadWorkers,
    EndAssignments,
    LeaseInbox,
    LedgerInbox,
    Placement,
)
from runtime import faults
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DatabaseUnavailable, DuplicateKey, StaleEpoch
from runtime.jobs import CommandRuntime, SleepRuntime
from runtime.reply import Reply
from runtime.settings.leader import LedgerSettings

MAX_ROWS = LedgerSettings().max_rows_per_fenced_write


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[PgConnection]:
    """An admin connection to a fresh database (with the bridge open), holding one worker
    w-1 (incarnation 1) and two pending jobs (ids 1 and 2)."""
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        await conn.execute(
            "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
            " VALUES ('w-1', '127.0.0.1:1', 8000, 8192, 1)"
        )
        for name in ("a", "b"):
            await insert_job(conn, name, 1000, 100, 0, "sleep", 1000, None)
        try:
            yield conn
        finally:
            await conn.close()


async def take_over(conn: PgConnection, holder: str, ttl_s: float = 2.0) -> int | None:
    """Take the lease if it expired (the expiry path only), as a lease keeper would."""
    seen = await conn.fetchval("SELECT epoch FROM lease WHERE id = 1")
    row = await conn.fetchrow(queries.TAKE_OVER_LEASE, holder, ttl_s, seen, False)
    return None if row is None else int(row["epoch"])


def placements(*job_ids: int) -> tuple[Placement, ...]:
    return tuple(
        Placement(job_id=j, worker_id="w-1", incarnation=1, cpu_millis=1000, memory_mb=100) for j in job_ids
    )


async def commit(
    ledger_inbox: trio.MemorySendChannel[LedgerInbox],
    epoch: int,
    *job_ids: int,
    reasons: tuple[tuple[int, str], ...] = (),
) -> object:
    reply: Reply[object] = Reply()
    await ledger_inbox.send(
        CommitPlacements(epoch=epoch, placements=placements(*job_ids), reasons=reasons, reply=reply)
    )
    return await reply.wait()


async def declare_dead(ledger_inbox: trio.MemorySendChannel[LedgerInbox], epoch: int) -> object:
    """Ask the ledger to declare w-1 (incarnation 1) dead after 5 s of silence, under ``epoch``."""
    reply: Reply[object] = Reply()
    await ledger_inbox.send(
        DeclareDeadWorkers(
            epoch=epoch,
            workers=(("w-1", 1),),
            dead_after_s=5.0,
            requeue_backoff_caps_s=(),
            max_ended=MAX_ROWS,
            reply=reply,
        )
    )
    return await reply.wait()


async def server_up_for(db: PgConnection, seconds: float) -> None:
    """Return once the database server has been up ``seconds``: silence counts from its start
    at the earliest (DECLARE_DEAD_WORKERS), and a test run first in its session may find the
    server just started."""
    up_s = await db.fetchval("SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8")
    await trio.sleep(max(0.0, seconds - up_s) + 0.05)


async def run_ledger(
    nursery: trio.Nursery, url: str, settings: LedgerSettings = LedgerSettings()
) -> tuple[trio.MemorySendChannel[LedgerInbox], trio.MemoryReceiveChannel[LeaseInbox]]:
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](8)
    ledger = Ledger(
        cp_id="cp-1", database_url=url, settings=settings, inbox=ledger_recv, lease_inbox=lease_send
    )
    await nursery.start(ledger.run)
    return ledger_send, lease_recv


def refusals(write: str, reason: str) -> float:
    """``stockade_fenced_writes_refused_total{write, reason}`` of this process now."""
    labels = {"write": write, "reason": reason}
    return REGISTRY.get_sample_value("stockade_fenced_writes_refused_total", labels) or 0.0


async def test_a_fenced_write_with_a_stale_epoch_is_refused(db: PgConnection, database_url: str) -> None:
    """Epoch 2 holds the lease; a commit under epoch 1 writes nothing (no placement, no pending
    reason), is recorded in stale_writes, and tells the lease keeper it was superseded."""
    assert await take_over(db, "cp-1") == 1
    await db.execute("UPDATE lease SET expires_at = '-infinity'")
    assert await take_over(db, "cp-2") == 2
    refused = refusals("commit_placements", "stale_epoch")
    async with trio.open_nursery() as nursery:
        ledger, lease = await run_ledger(nursery, database_url)
        with pytest.raises(StaleEpoch) as info:
            await commit(ledger, 1, 1, reasons=((2, "unschedulable: test"),))
        assert (info.value.epoch, info.value.epoch_seen) == (1, 2)
        superseded = lease.receive_nowait()
        assert (superseded.epoch, superseded.epoch_seen) == (1, 2)  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()
    assert await db.fetchval("SELECT count(*) FROM assignments") == 0
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE state = 'pending'") == 2
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE reason <> ''") == 0
    assert await db.fetchval("SELECT epoch_seen FROM stale_writes WHERE holder = 'cp-1'") == 2
    assert refusals("commit_placements", "stale_epoch") == refused + 1


async def test_the_current_epoch_commits_and_claims_only_pending_jobs(
    db: PgConnection, database_url: str
) -> None:
    """Under the current epoch the placements commit with that epoch, with the reasons of the
    jobs left pending; placing a job that is no longer pending creates nothing (invariant 3)."""
    assert await take_over(db, "cp-1") == 1
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        first = await commit(ledger, 1, 1, reasons=((2, "unschedulable: test"),))
        assert await db.fetchval("SELECT reason FROM jobs WHERE id = 2") == "unschedulable: test"
        nothing = await commit(ledger, 1, reasons=((2, ""),))
        again = await commit(ledger, 1, 1, 2)
        nursery.cancel_scope.cancel()
    assert [a.job_id for a in first] == [1]  # type: ignore[attr-defined]
    assert nothing == ()
    assert [a.job_id for a in again] == [2]  # type: ignore[attr-defined]
    rows = await db.fetch("SELECT job_id, epoch, state FROM assignments ORDER BY job_id")
    assert [tuple(r) for r in rows] == [(1, 1, "active"), (2, 1, "active")]


async def test_a_takeover_waits_for_an_open_fenced_transaction(db: PgConnection, database_url: str) -> None:
    """With a fenced transaction (a dead-worker declaration) parked after its FOR KEY SHARE check,
    a takeover of the (expired) lease blocks; it completes, with a new epoch, only after the
    fenced write committed."""
    assert await take_over(db, "cp-1") == 1
    await db.execute("UPDATE lease SET expires_at = now() - interval '1 second'")
    parked, release = trio.Event(), trio.Event()
    order: list[str] = []
    both_done = trio.Semaphore(0)

    async def park() -> None:
        parked.set()
        await release.wait()

    standby = await PgConnection.connect(database_url)

    async def standby_takes_over() -> None:
        order.append(f"takeover epoch {await take_over(standby, 'cp-2')}")
        both_done.release()

    try:
        async with faults.installed("ledger.after_epoch_check", park), trio.open_nursery() as nursery:
            ledger, _ = await run_ledger(nursery, database_url)

            async def leader_declares() -> None:
                await declare_dead(ledger, 1)
                order.append("declaration epoch 1")
                both_done.release()

            nursery.start_soon(leader_declares)
            with trio.fail_after(10):
                await parked.wait()
            nursery.start_soon(standby_takes_over)
            await trio.sleep(0.5)
            assert order == []  # the takeover is waiting on the share lock
            release.set()
            with trio.fail_after(10):
                await both_done.acquire()
                await both_done.acquire()
            nursery.cancel_scope.cancel()
    finally:
        await standby.close()
    assert sorted(order) == ["declaration epoch 1", "takeover epoch 2"]  # both went through, in lock order


async def test_a_takeover_waits_for_a_placement_statement_in_flight(
    db: PgConnection, database_url: str
) -> None:
    """A placement statement holds the lease's share lock from its fence to its end: with the
    statement stuck on a job row another session locked (its statement timeout raised to 5 s
    here), a takeover blocks; once the row is free the statement commits under epoch 1 and
    only then the takeover gets epoch 2."""
    assert await take_over(db, "cp-1") == 1
    await db.execute("UPDATE lease SET expires_at = now() - interval '1 second'")
    order: list[str] = []
    both_done = trio.Semaphore(0)
    blocker = await PgConnection.connect(database_url)
    standby = await PgConnection.connect(database_url)

    async def standby_takes_over() -> None:
        order.append(f"takeover epoch {await take_over(standby, 'cp-2')}")
        both_done.release()

    async def ledger_waits_on_a_lock() -> bool:
        waiting = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'stockade cp-1 ledger' AND wait_event_type = 'Lock'"
        )
        return bool(waiting)

    try:
        async with trio.open_nursery() as nursery:
            ledger, _ = await run_ledger(nursery, database_url, LedgerSettings(statement_timeout_s=5.0))
            await blocker.execute("BEGIN")
            await blocker.execute("SELECT id FROM jobs WHERE id = 1 FOR UPDATE")

            async def leader_commits() -> None:
                await commit(ledger, 1, 1)
                order.append("commit epoch 1")
                both_done.release()

            nursery.start_soon(leader_commits)
            with trio.fail_after(10):  # the statement waits on the job row (lock_timeout is 5 s)
                while not await ledger_waits_on_a_lock():  # noqa: ASYNC110 (another session's state)
                    await trio.sleep(0.01)
            nursery.start_soon(standby_takes_over)
            await trio.sleep(0.2)
            assert order == []  # the statement waits on the row, the takeover on the share lock
            await blocker.execute("ROLLBACK")
            with trio.fail_after(10):
                await both_done.acquire()
                await both_done.acquire()
            nursery.cancel_scope.cancel()
    finally:
        await standby.close()
        await blocker.close()
    assert sorted(order) == ["commit epoch 1", "takeover epoch 2"]
    assert await db.fetchval("SELECT epoch FROM assignments WHERE job_id = 1") == 1


async def test_the_leaders_renewal_and_release_never_wait_for_its_fenced_writes(
    db: PgConnection, database_url: str
) -> None:
    """With a fenced transaction parked after its fence and a placement statement stuck on a
    job row (both holding the lease's share lock), the leader's renewal and its release go
    through at once, while a takeover still waits for both writes; the writes then commit
    under epoch 1 and the takeover gets epoch 2."""
    assert await take_over(db, "cp-1") == 1
    parked, release = trio.Event(), trio.Event()
    order: list[str] = []
    done = trio.Semaphore(0)
    leader = await PgConnection.connect(database_url)
    standby = await PgConnection.connect(database_url)
    blocker = await PgConnection.connect(database_url)

    async def park() -> None:
        parked.set()
        await release.wait()

    async def standby_takes_over() -> None:
        seen = await standby.fetchval("SELECT epoch FROM lease WHERE id = 1")
        row = await standby.fetchrow(queries.TAKE_OVER_LEASE, "cp-2", 2.0, seen, True)
        order.append(f"takeover epoch {None if row is None else row['epoch']}")
        done.release()

    async def lock_waiters() -> int:
        return int(
            await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name LIKE 'stockade cp-1 ledger%'"
            )
        )

    try:
        async with (
            faults.installed("ledger.declare_dead_workers.after_epoch_check", park),
            trio.open_nursery() as nursery,
        ):
            declarer, _ = await run_ledger(
                nursery, database_url, LedgerSettings(idle_in_transaction_timeout_s=30)
            )
            placer, _ = await run_ledger(nursery, database_url, LedgerSettings(statement_timeout_s=5.0))
            await blocker.execute("BEGIN")
            await blocker.execute("SELECT id FROM jobs WHERE id = 1 FOR UPDATE")

            async def leader_declares() -> None:
                await declare_dead(declarer, 1)
                order.append("declaration epoch 1")
                done.release()

            async def leader_commits() -> None:
                await commit(placer, 1, 1)
                order.append("commit epoch 1")
                done.release()

            nursery.start_soon(leader_declares)
            with trio.fail_after(10):
                await parked.wait()
            nursery.start_soon(leader_commits)
            with trio.fail_after(10):
                while not await lock_waiters():  # noqa: ASYNC110 (another session's state)
                    await trio.sleep(0.01)
            with trio.fail_after(10):
                assert await leader.fetchval(queries.RENEW_LEASE, "cp-1", 1, 2.0) == 1
                await leader.execute(queries.RELEASE_LEASE, "cp-1", 1)
            nursery.start_soon(standby_takes_over)
            await trio.sleep(0.3)
            assert order == []  # the takeover waits on the writes' share lock
            release.set()
            await blocker.execute("ROLLBACK")
            with trio.fail_after(10):
                for _ in range(3):
                    await done.acquire()
            nursery.cancel_scope.cancel()
    finally:
        for conn in (leader, standby, blocker):
            await conn.close()
    # Both writes committed under epoch 1 and the takeover got epoch 2: the takeover waited for
    # them (had it committed first, the writes would have seen epoch 2 and been refused).
    assert sorted(order) == ["commit epoch 1", "declaration epoch 1", "takeover epoch 2"]


async def test_idle_in_transaction_ends_a_frozen_fenced_transaction(
    db: PgConnection, database_url: str
) -> None:
    """A leader frozen inside its fenced transaction (declaring a silent worker dead) loses its
    session after the idle timeout; the standby takes over meanwhile; the leader's commit on
    waking is refused, counted as a stale write, and nothing it wrote survives."""
    assert await take_over(db, "cp-1") == 1
    await db.execute("UPDATE lease SET expires_at = now() - interval '1 second'")
    await db.execute("UPDATE workers SET last_heartbeat_at = now() - interval '1 minute'")
    parked = trio.Event()
    standby_epoch: list[int | None] = []
    refused = refusals("declare_dead_workers", "session_ended")

    async def freeze() -> None:
        parked.set()
        await trio.sleep(1.5)  # sends nothing: the session sits idle in its transaction

    standby = await PgConnection.connect(database_url)
    try:
        async with faults.installed("ledger.before_commit", freeze), trio.open_nursery() as nursery:
            ledger, _ = await run_ledger(
                nursery, database_url, LedgerSettings(idle_in_transaction_timeout_s=0.5)
            )

            async def standby_takes_over() -> None:
                await parked.wait()
                standby_epoch.append(await take_over(standby, "cp-2"))

            nursery.start_soon(standby_takes_over)
            with pytest.raises(StaleEpoch) as info:
                await declare_dead(ledger, 1)
            nursery.cancel_scope.cancel()
    finally:
        await standby.close()
    assert standby_epoch == [2]
    assert (info.value.epoch, info.value.epoch_seen) == (1, 2)
    assert await db.fetchval("SELECT state FROM workers WHERE id = 'w-1'") == "alive"
    assert await db.fetchval("SELECT count(*) FROM worker_deaths") == 0
    assert "session ended" in await db.fetchval("SELECT what FROM stale_writes")
    assert refusals("declare_dead_workers", "session_ended") == refused + 1


async def test_the_partial_unique_index_refuses_a_second_active_assignment(db: PgConnection) -> None:
    """Two active assignments for one job cannot exist, whatever writes them (invariant 1)."""
    insert = (
        "INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch)"
        " VALUES (1, 'w-1', 1, 1000, 100, $1)"
    )
    await db.execute(insert, 1)
    with pytest.raises(DuplicateKey) as info:
        await db.execute(insert, 2)
    assert info.value.constraint == "assignments_one_active_per_job"
    await db.execute("UPDATE assignments SET state = 'finished'")
    await db.execute(insert, 3)  # once the first ended, a new one may be active


async def test_dead_worker_declaration_rechecks_the_heartbeat_and_requeues(
    db: PgConnection, database_url: str
) -> None:
    """A worker named dead is declared dead only if still silent for dead_after by database
    time; then its active assignments end as lost and their jobs are pending again. Placed
    again, the job's assignment says it was placed before (its worker reports the start at
    once); the first did not."""
    assert await take_over(db, "cp-1") == 1
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        (first,) = await commit(ledger, 1, 1)  # type: ignore[misc]

        async def declare() -> object:
            reply: Reply[object] = Reply()
            await ledger.send(
                DeclareDeadWorkers(
                    epoch=1,
                    workers=(("w-1", 1),),
                    dead_after_s=5.0,
                    requeue_backoff_caps_s=(),
                    max_ended=MAX_ROWS,
                    reply=reply,
                )
            )
            return await reply.wait()

        # Heard from just now (the setup may have taken seconds on a loaded machine).
        await db.execute("UPDATE workers SET last_heartbeat_at = now()")
        fresh = await declare()
        assert fresh.dead_worker_ids == ()  # type: ignore[attr-defined]
        await db.execute("UPDATE workers SET last_heartbeat_at = now() - interval '6 seconds'")
        await server_up_for(db, 6.0)
        dead = await declare()
        assert await db.fetchval("SELECT state FROM workers") == "dead"
        assert await db.fetchval("SELECT end_reason FROM assignments WHERE job_id = 1") == "worker_dead"
        assert await db.fetchval("SELECT state FROM jobs WHERE id = 1") == "pending"
        await db.execute("UPDATE workers SET state = 'alive', incarnation = 2, last_heartbeat_at = now()")
        reply: Reply[tuple[CommittedAssignment, ...]] = Reply()
        again = Placement(job_id=1, worker_id="w-1", incarnation=2, cpu_millis=1000, memory_mb=100)
        await ledger.send(CommitPlacements(epoch=1, placements=(again,), reasons=(), reply=reply))
        (moved,) = await reply.wait()
        nursery.cancel_scope.cancel()
    assert dead.dead_worker_ids == ("w-1",)  # type: ignore[attr-defined]
    assert dead.requeued_job_ids == (1,)  # type: ignore[attr-defined]
    assert await db.fetchval("SELECT epoch FROM worker_deaths") == 1
    assert not first.placed_before
    assert moved.job_id == 1 and moved.placed_before


async def test_worker_allocation_follows_every_assignment_that_starts_or_ends(
    db: PgConnection, database_url: str
) -> None:
    """Committing, finishing (heartbeat), cancelling and losing assignments keep each worker's
    allocation equal to the sum over its active assignments (the placer reads only that)."""
    assert await take_over(db, "cp-1") == 1
    for name in ("c", "d"):
        await insert_job(db, name, 500, 50, 0, "sleep", 1000, None)
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        await commit(ledger, 1, 1, 2, 3, 4)
        assert await db.fetchval("SELECT cpu_allocated_millis FROM worker_allocations") == 3000
        assert await db.fetchval(ALLOCATION_MATCHES)
        await db.fetchrow(
            queries.HEARTBEAT,
            "w-1",
            0,
            [],
            [1],
            ["succeeded"],
            [0],
            [None],
            [None],
            [None],
            [None],
            [""],
            0,
            0,
            250,
            2500,
        )
        reply: Reply[object] = Reply()
        await ledger.send(
            EndAssignments(
                epoch=1,
                assignment_ids=(2,),
                requeue=True,
                reason="unconfirmed",
                requeue_backoff_caps_s=(),
                reply=reply,
            )
        )
        await reply.wait()
        assert await db.fetchval(ALLOCATION_MATCHES)
        await db.execute("UPDATE workers SET last_heartbeat_at = now() - interval '1 minute'")
        await server_up_for(db, 6.0)
        dead: Reply[object] = Reply()
        await ledger.send(
            DeclareDeadWorkers(
                epoch=1,
                workers=(("w-1", 1),),
                dead_after_s=5.0,
                requeue_backoff_caps_s=(),
                max_ended=MAX_ROWS,
                reply=dead,
            )
        )
        await dead.wait()
        nursery.cancel_scope.cancel()
    assert await db.fetchval(ALLOCATION_MATCHES)
    assert await db.fetchval("SELECT cpu_allocated_millis FROM worker_allocations") == 0


async def test_a_placement_statement_behind_an_uncommitted_takeover_writes_nothing(
    db: PgConnection, database_url: str
) -> None:
    """A takeover's UPDATE of the lease is in flight (not committed) when the old leader's
    placement statement reaches its fence: the statement waits for it, then reads the new
    epoch from the locked row, not from its snapshot, writes nothing and is refused."""
    assert await take_over(db, "cp-1") == 1
    standby = await PgConnection.connect(database_url)
    try:
        await standby.execute("BEGIN")
        await standby.execute("UPDATE lease SET epoch = epoch + 1, holder = 'cp-2' WHERE id = 1")
        async with trio.open_nursery() as nursery:
            # The statement waits for the takeover as long as this test takes to commit it.
            ledger, _ = await run_ledger(nursery, database_url, LedgerSettings(statement_timeout_s=5.0))
            outcome: list[BaseException] = []

            async def leader_commits() -> None:
                try:
                    await commit(ledger, 1, 1)
                except StaleEpoch as exc:
                    outcome.append(exc)

            nursery.start_soon(leader_commits)
            with trio.fail_after(10):  # the statement waits on the lease row
                while not await db.fetchval(  # noqa: ASYNC110 (another session's state)
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = 'stockade cp-1 ledger' AND wait_event_type = 'Lock'"
                ):
                    await trio.sleep(0.01)
            await standby.execute("COMMIT")
            with trio.fail_after(10):
                while not outcome:  # noqa: ASYNC110 (set by the task above)
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        await standby.close()
    assert [(e.epoch, e.epoch_seen) for e in outcome] == [(1, 2)]  # type: ignore[attr-defined]
    assert await db.fetchval("SELECT count(*) FROM assignments") == 0
    assert await db.fetchval("SELECT state FROM jobs WHERE id = 1") == "pending"


async def test_an_unanswered_fenced_write_drops_its_connection_and_the_next_one_works(
    db: PgConnection, database_url: str
) -> None:
    """A placement statement stuck (here on a row another session locked) past the answer
    deadline is given up: the asker gets DatabaseUnavailable, the connection is dropped and
    the server ends the abandoned statement; the next write uses a new connection and
    commits."""
    assert await take_over(db, "cp-1") == 1
    blocker = await PgConnection.connect(database_url)
    try:
        async with trio.open_nursery() as nursery:
            ledger, _ = await run_ledger(
                nursery, database_url, LedgerSettings(answer_timeout_s=0.3, statement_timeout_s=30.0)
            )
            await blocker.execute("BEGIN")
            await blocker.execute("SELECT id FROM jobs WHERE id = 1 FOR UPDATE")
            with pytest.raises(DatabaseUnavailable, match=r"no answer within 0\.3 s"):
                await commit(ledger, 1, 1)
            await trio.sleep(1.0)  # the server notices the dropped client and ends the statement
            await blocker.execute("ROLLBACK")
            again = await commit(ledger, 1, 1)
            nursery.cancel_scope.cancel()
    finally:
        await blocker.close()
    assert [a.job_id for a in again] == [1]  # type: ignore[attr-defined]
    assert await db.fetchval("SELECT count(*) FROM assignments") == 1


async def test_committed_command_jobs_carry_their_argv(db: PgConnection, database_url: str) -> None:
    """The placement statement returns small rows; a command's argv (read after the commit)
    still reaches the assignment the worker is sent, and a sleep job has none."""
    assert await take_over(db, "cp-1") == 1
    argv = ["python3", "-c", "print('x' * 100)", "y" * 60_000]
    await insert_job(db, "cmd", 1000, 100, 0, "command", None, argv)
    async with trio.open_nursery() as nursery:
        ledger, _ = await run_ledger(nursery, database_url)
        committed = await commit(ledger, 1, 1, 3)
        nursery.cancel_scope.cancel()
    by_job = {a.job_id: a.spec for a in committed}  # type: ignore[attr-defined]
    assert by_job[3].runtime == CommandRuntime(argv=argv) and by_job[3].name == "cmd"
    assert by_job[1].runtime == SleepRuntime(duration_ms=1000)
