"""How long a fenced write may hold the lease's share lock, on a real PostgreSQL: a dead worker's
thousands of assignments end in fenced transactions of at most max_rows_per_fenced_write while
the leader's renewals keep passing; a refusal midway stops the batches; a new leader ends the
rest; the ledger refuses a write larger than the bound; and a statement stuck on a row lock
gives the lock up at the ledger's statement timeout instead of costing the renewal."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import pytest
import trio
from seeding import insert_job

from actors import queries
from actors.ledger import Ledger
from actors.messages import (
    CommitPlacements,
    CommittedAssignment,
    DispatcherInbox,
    Elected,
    EndAssignments,
    EpochSuperseded,
    LeaseInbox,
    LedgerInbox,
    Placement,
    QueryRole,
    RoleChange,
)
from actors.reconciler import Reconciler
from actors.reconciler_store import PgReconcilerStore
from actors.role import RoleView
from runtime import faults
from runtime.aio import PgConnection, asyncio_bridge
from runtime.errors import DatabaseUnavailable, InvalidArgument
from runtime.reply import Reply
from runtime.settings.leader import (
    LeaseSettings,
    LedgerSettings,
    ReconcilerSettings,
)

LEDGER = LedgerSettings()
BATCH = LEDGER.max_rows_per_fenced_write
HOLD_BOUND_S = LEDGER.longest_share_lock_hold_s
"""The longest a fenced write may hold the share lock (0.4 s): what these tests hold it to."""
RENEWAL_TIMEOUT_S = LeaseSettings().statement_timeout_s


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[PgConnection]:
    """An admin connection to a fresh database (with the bridge open); cp-1 leads under epoch 1
    (for a minute)."""
    async with asyncio_bridge():
        conn = await PgConnection.connect(database_url)
        await conn.execute(
            "UPDATE lease SET holder = 'cp-1', epoch = 1, expires_at = now() + interval '1 minute'"
        )
        try:
            yield conn
        finally:
            await conn.close()


async def silent_worker_running(conn: PgConnection, count: int) -> None:
    """Worker w-1 (incarnation 1), silent for a minute, running ``count`` jobs (ids 1..count),
    each with one confirmed active assignment committed under epoch 1."""
    await conn.execute(
        "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation, last_heartbeat_at)"
        " VALUES ('w-1', '127.0.0.1:1', 1000000, 1000000, 1, now() - interval '1 minute')"
    )
    await conn.execute(
        "WITH j AS (INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, state, attempts)"
        "           SELECT 'j' || g, 10, 16, 'sleep', 60000, 'running', 1"
        "             FROM generate_series(1, $1) g RETURNING id)"
        " INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch,"
        "                          confirmed_at)"
        " SELECT id, 'w-1', 1, 10, 16, 1, now() FROM j",
        count,
    )


async def rows_per_transaction(conn: PgConnection, where: str) -> list[int]:
    """How many of the assignments ``where`` selects each transaction last wrote (by xmin)."""
    rows = await conn.fetch(f"SELECT count(*) AS n FROM assignments WHERE {where} GROUP BY xmin::text")
    return sorted(int(r["n"]) for r in rows)


@attrs.define
class Renewals:
    """cp-1's renewals, sent back to back as the lease keeper sends them, on a connection whose
    ``lock_timeout`` is :data:`HOLD_BOUND_S`: a renewal that waits for the share lock longer
    than a fenced write may hold it fails, and is recorded."""

    conn: PgConnection
    epoch: int = 1
    durations_s: list[float] = attrs.field(factory=list)
    failures: list[str] = attrs.field(factory=list)

    @classmethod
    async def open(cls, url: str) -> Renewals:
        conn = await PgConnection.connect(
            url,
            server_settings={
                "statement_timeout": str(int(RENEWAL_TIMEOUT_S * 1000)),
                "lock_timeout": str(int(HOLD_BOUND_S * 1000)),
            },
        )
        return cls(conn)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                renewed = await self.conn.fetchval(queries.RENEW_LEASE, "cp-1", self.epoch, 60.0)
            except DatabaseUnavailable as exc:
                self.failures.append(str(exc))
            else:
                if renewed is None:
                    return  # taken over: nothing left to renew
                self.durations_s.append(time.monotonic() - started)
            await trio.sleep(0.005)


@attrs.define
class Leader:
    """A ledger and a reconciler leading under ``epoch`` on the real database; the test holds
    the lease keeper's side (answers QueryRole, collects EpochSuperseded) and drops dispatches."""

    epoch: int
    superseded: list[EpochSuperseded] = attrs.field(factory=list)
    settings: ReconcilerSettings = attrs.field(factory=lambda: ReconcilerSettings(reconcile_interval_s=0.25))

    async def run(self, url: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        lease_send, lease_recv = trio.open_memory_channel[LeaseInbox](64)
        ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](16)
        dispatch_send, dispatch_recv = trio.open_memory_channel[DispatcherInbox](1024)
        _, roles_recv = trio.open_memory_channel[RoleChange](8)
        ledger = Ledger(
            cp_id="cp-1", database_url=url, settings=LEDGER, inbox=ledger_recv, lease_inbox=lease_send
        )
        store = PgReconcilerStore(database_url=url, application_name="stockade test reconciler")
        reconciler = Reconciler(
            settings=self.settings,
            store=store,
            role=RoleView(changes=roles_recv, lease_inbox=lease_send),
            ledger=ledger_send,
            dispatcher=dispatch_send,
            max_rows_per_fenced_write=BATCH,
        )

        async def lease_keeper() -> None:
            async for message in lease_recv:
                match message:
                    case QueryRole(reply=reply):
                        reply.set(Elected(seq=1, epoch=self.epoch))
                    case EpochSuperseded():
                        self.superseded.append(message)

        async def dispatcher() -> None:
            async for _ in dispatch_recv:
                pass

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lease_keeper)
                nursery.start_soon(dispatcher)
                await nursery.start(ledger.run)
                await nursery.start(reconciler.run)
                task_status.started()
        finally:
            await store.close()


async def until(check: Callable[[], Awaitable[bool]], limit_s: float = 20.0) -> None:
    with trio.fail_after(limit_s):
        while not await check():  # noqa: ASYNC110 (the database's state, polled)
            await trio.sleep(0.02)


async def test_a_dead_workers_thousands_of_assignments_end_in_bounded_fenced_writes_while_renewals_pass(
    db: PgConnection, database_url: str
) -> None:
    """A silent worker running 3,000 jobs is declared dead and all its assignments end as lost,
    at most 500 per fenced transaction (six or more transactions); every job is pending again,
    requeued exactly once; meanwhile no renewal of the leader's lease waits for the share lock
    longer than a fenced write may hold it (0.4 s), which the single transaction this replaces,
    quadratic in its rows, overran."""
    await silent_worker_running(db, 3000)
    renewals = await Renewals.open(database_url)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(renewals.run)
            await trio.sleep(0.1)
            await nursery.start(Leader(epoch=1).run, database_url)

            async def all_ended() -> bool:
                return await db.fetchval("SELECT count(*) FROM assignments WHERE state = 'active'") == 0

            await until(all_ended)
            await trio.sleep(0.3)  # a further pass: it finds nothing more to end
            nursery.cancel_scope.cancel()
    finally:
        await renewals.conn.close()
    assert renewals.failures == []
    assert max(renewals.durations_s) < RENEWAL_TIMEOUT_S, max(renewals.durations_s)
    sizes = await rows_per_transaction(db, "worker_id = 'w-1'")
    assert sum(sizes) == 3000 and max(sizes) <= BATCH, sizes
    assert len(sizes) >= 6, sizes  # six of 500 (more if the server cancelled one: half as many rows)
    assert await db.fetchval("SELECT state FROM workers WHERE id = 'w-1'") == "dead"
    assert await db.fetchval("SELECT count(*) FROM worker_deaths WHERE epoch = 1") == 1
    ended = await db.fetchrow(
        "SELECT count(*) AS n, bool_and(state = 'lost' AND end_reason = 'worker_dead' AND ended_epoch = 1)"
        " AS lost FROM assignments"
    )
    assert ended is not None and (ended["n"], ended["lost"]) == (3000, True)
    jobs = await db.fetchrow(
        "SELECT count(*) AS n, bool_and(state = 'pending' AND losses = 1) AS requeued_once,"
        " count(DISTINCT pending_seq) AS seqs FROM jobs"
    )
    assert jobs is not None and (jobs["n"], jobs["requeued_once"], jobs["seqs"]) == (3000, True, 3000)


async def take_over_as_cp_2(conn: PgConnection) -> None:
    await conn.execute(
        "UPDATE lease SET holder = 'cp-2', epoch = epoch + 1, expires_at = now() + interval '1 minute'"
    )


async def refusals_of(conn: PgConnection, what: str) -> int:
    """How many of cp-1's writes under epoch 1 were refused as stale (epoch 2 seen), of ``what``."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM stale_writes WHERE epoch = 1 AND epoch_seen = 2 AND what = $1", what
        )
    )


@attrs.define
class TakeOverAfterTwoBatches:
    """The fault point's hook before each of cp-1's batches: once two batches have committed,
    cp-2 takes the lease over just before the next one is sent. A batch's size depends on how
    fast the server wrote the one before (a cancelled write halves the next:
    :mod:`actors.write_size`), so the test counts what committed rather than assuming 500."""

    db: PgConnection
    taken_over: bool = False
    batches_after: int = 0
    """Batches cp-1 tried after the one the takeover refused: none, by the rule tested."""

    async def __call__(self) -> None:
        if self.taken_over:
            self.batches_after += 1
        elif len(await rows_per_transaction(self.db, "state = 'lost'")) == 2:
            await take_over_as_cp_2(self.db)
            self.taken_over = True  # the batch about to be sent is refused


async def test_a_refused_batch_stops_the_batches_and_nothing_more_is_written(
    db: PgConnection, database_url: str
) -> None:
    """1,600 assignments of a dead worker end in batches of at most 500; cp-2 takes the lease
    over just before the third fenced transaction: that batch is refused (and recorded), the
    pass sends no further batch, and the passes that follow under the old epoch write nothing:
    the assignments of the two committed batches ended under epoch 1, the rest are still
    active."""
    await silent_worker_running(db, 1600)
    hook = TakeOverAfterTwoBatches(db)
    leader = Leader(epoch=1)
    async with (
        faults.installed("ledger.end_orphaned_assignments.before_transaction", hook),
        trio.open_nursery() as nursery,
    ):
        await nursery.start(leader.run, database_url)

        async def three_passes_refused_after() -> bool:
            # The refused batch, then three more passes of cp-1 under epoch 1, each refused.
            return bool(leader.superseded) and await refusals_of(db, "declare dead workers") >= 3

        await until(three_passes_refused_after)
        nursery.cancel_scope.cancel()
    assert hook.taken_over and hook.batches_after == 0
    sizes = await rows_per_transaction(db, "state = 'lost'")
    assert len(sizes) == 2 and max(sizes) <= BATCH, sizes
    ended = sum(sizes)
    lost = await db.fetchval("SELECT count(*) FROM assignments WHERE state = 'lost' AND ended_epoch = 1")
    assert lost == ended
    assert await db.fetchval("SELECT count(*) FROM assignments WHERE state = 'active'") == 1600 - ended
    assert await db.fetchval("SELECT count(*) FROM jobs WHERE state = 'pending'") == ended
    refusals = await db.fetch("SELECT what FROM stale_writes WHERE epoch = 1 AND epoch_seen = 2 ORDER BY id")
    assert refusals[0]["what"] == "end orphaned assignments"
    assert len(refusals) >= 4 and {r["what"] for r in refusals[1:]} == {"declare dead workers"}


async def test_a_new_leader_ends_the_rest_of_a_refused_series(db: PgConnection, database_url: str) -> None:
    """After cp-1's series of batches was cut short by cp-2's takeover, cp-2's first pass ends
    the dead worker's remaining assignments under epoch 2: every job was requeued exactly once,
    each assignment ended once, by one leader or the other."""
    await silent_worker_running(db, 1600)
    hook = TakeOverAfterTwoBatches(db)
    old = Leader(epoch=1)
    async with (
        faults.installed("ledger.end_orphaned_assignments.before_transaction", hook),
        trio.open_nursery() as nursery,
    ):
        await nursery.start(old.run, database_url)

        async def refused() -> bool:
            return bool(old.superseded)

        await until(refused)
        nursery.cancel_scope.cancel()
    ended_by_old = sum(await rows_per_transaction(db, "state = 'lost'"))
    async with trio.open_nursery() as nursery:
        await nursery.start(Leader(epoch=2).run, database_url)

        async def all_ended() -> bool:
            return await db.fetchval("SELECT count(*) FROM assignments WHERE state = 'active'") == 0

        await until(all_ended)
        nursery.cancel_scope.cancel()
    by_epoch = await db.fetch("SELECT ended_epoch, count(*) AS n FROM assignments GROUP BY 1 ORDER BY 1")
    assert 0 < ended_by_old < 1600
    assert [(r["ended_epoch"], r["n"]) for r in by_epoch] == [(1, ended_by_old), (2, 1600 - ended_by_old)]
    assert await db.fetchval("SELECT bool_and(state = 'pending' AND losses = 1) FROM jobs")
    assert await db.fetchval("SELECT count(*) FROM worker_deaths") == 1


async def run_ledger(nursery: trio.Nursery, url: str) -> trio.MemorySendChannel[LedgerInbox]:
    ledger_send, ledger_recv = trio.open_memory_channel[LedgerInbox](8)
    lease_send, _ = trio.open_memory_channel[LeaseInbox](8)
    ledger = Ledger(
        cp_id="cp-1", database_url=url, settings=LEDGER, inbox=ledger_recv, lease_inbox=lease_send
    )
    await nursery.start(ledger.run)
    return ledger_send


async def test_the_ledger_refuses_a_write_larger_than_its_bound(db: PgConnection, database_url: str) -> None:
    """Ending 501 assignments in one fenced write is refused before anything is sent: the asker
    gets InvalidArgument naming the bound, nothing ends, no stale write is recorded, and the
    ledger goes on serving."""
    await silent_worker_running(db, 501)
    async with trio.open_nursery() as nursery:
        ledger = await run_ledger(nursery, database_url)

        async def end(ids: tuple[int, ...]) -> tuple[int, ...]:
            reply: Reply[tuple[int, ...]] = Reply()
            await ledger.send(
                EndAssignments(
                    epoch=1,
                    assignment_ids=ids,
                    requeue=True,
                    reason="unconfirmed",
                    requeue_backoff_caps_s=(),
                    reply=reply,
                )
            )
            return await reply.wait()

        with pytest.raises(
            InvalidArgument, match="assignment_ids must be <= max_rows_per_fenced_write = 500"
        ):
            await end(tuple(range(1, 502)))
        assert await end((1,)) == (1,)
        nursery.cancel_scope.cancel()
    assert await db.fetchval("SELECT count(*) FROM assignments WHERE state = 'active'") == 500
    assert await db.fetchval("SELECT count(*) FROM stale_writes") == 0


async def test_a_fenced_statement_stuck_on_a_row_lock_gives_the_share_lock_up_for_the_renewal(
    db: PgConnection, database_url: str
) -> None:
    """A placement statement waits for a job row another session holds: after the ledger's
    statement timeout (0.2 s) the server cancels it, releasing the lease's share lock, so a
    renewal sent meanwhile succeeds well within its own timeout; the placement fails as
    retryable and writes nothing."""
    await db.execute(
        "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
        " VALUES ('w-2', '127.0.0.1:1', 8000, 8192, 1)"
    )
    job_id = await insert_job(db, "a", 1000, 100, 0, "sleep", 1000, None)
    blocker = await PgConnection.connect(database_url)
    renewals = await Renewals.open(database_url)
    outcome: list[BaseException] = []
    try:
        async with trio.open_nursery() as nursery:
            ledger = await run_ledger(nursery, database_url)
            await blocker.execute("BEGIN")
            await blocker.execute("SELECT id FROM jobs WHERE id = $1 FOR UPDATE", job_id)

            async def leader_commits() -> None:
                reply: Reply[tuple[CommittedAssignment, ...]] = Reply()
                placement = Placement(
                    job_id=job_id, worker_id="w-2", incarnation=1, cpu_millis=1000, memory_mb=100
                )
                await ledger.send(CommitPlacements(epoch=1, placements=(placement,), reasons=(), reply=reply))
                try:
                    await reply.wait()
                except DatabaseUnavailable as exc:
                    outcome.append(exc)

            nursery.start_soon(leader_commits)
            await trio.sleep(0.05)  # the statement holds the share lock and waits for the row
            nursery.start_soon(renewals.run)

            async def failed() -> bool:
                return bool(outcome)

            await until(failed, 5.0)
            await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    finally:
        await blocker.execute("ROLLBACK")
        await blocker.close()
        await renewals.conn.close()
    assert "canceling statement due to" in str(outcome[0])
    assert renewals.failures == [] and renewals.durations_s
    assert renewals.durations_s[0] < LEDGER.statement_timeout_s + 0.1, renewals.durations_s[0]
    assert await db.fetchval("SELECT count(*) FROM assignments") == 0
