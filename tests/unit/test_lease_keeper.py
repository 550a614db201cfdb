"""The lease keeper's takeover, renewal and step-down timing, on trio's mock clock.

The database is a scripted stand-in whose clock is the mock clock, so "database time" and the
keeper's monotonic clock agree and every expected instant is exact.
"""

from __future__ import annotations

import math

import attrs
import pytest
import structlog
import trio
import trio.testing
from prometheus_client import REGISTRY

from actors.lease import LeaseKeeper
from actors.messages import Deposed, Elected, EpochSuperseded, LeaseInbox, QueryRole, RoleChange
from runtime.errors import DatabaseBusy, DatabaseUnavailable
from runtime.reply import Reply
from runtime.settings.leader import LeaseSettings

SETTINGS = LeaseSettings(
    lease_ttl_s=2.0,
    renew_interval_s=0.5,
    step_down_margin_s=0.4,
    takeover_poll_s=0.25,
    statement_timeout_s=1.0,
)


@attrs.define
class FakeLeaseDb:
    """One lease row judged by the mock clock; ``frozen`` makes every call hang;
    ``holder_session_alive`` False stands for a holder whose database session ended."""

    holder: str | None = None
    epoch: int = 0
    expires_at: float = -math.inf
    frozen: bool = False
    error: Exception | None = None
    """Raised by every call while set (a lost or busy database)."""
    holder_session_alive: bool = True
    renew_delay_s: float = 0.0
    """How long every renewal takes to answer."""
    renewals: list[float] = attrs.field(factory=list)
    released: list[int] = attrs.field(factory=list)
    relinquished: list[int] = attrs.field(factory=list)

    async def _maybe_hang(self) -> None:
        if self.frozen:
            await trio.sleep_forever()
        if self.error is not None:
            raise self.error

    async def try_take_over(self, holder: str, ttl_s: float) -> int | None:
        await self._maybe_hang()
        now = trio.current_time()
        if self.expires_at < now or not self.holder_session_alive:
            self.holder, self.epoch, self.expires_at = holder, self.epoch + 1, now + ttl_s
            self.holder_session_alive = True
            return self.epoch
        return None

    async def renew(self, holder: str, epoch: int, ttl_s: float) -> bool:
        await self._maybe_hang()
        await trio.sleep(self.renew_delay_s)
        self.renewals.append(trio.current_time())
        if self.holder == holder and self.epoch == epoch:
            self.expires_at = trio.current_time() + ttl_s
            return True
        return False

    async def release(self, holder: str, epoch: int) -> None:
        if self.holder == holder and self.epoch == epoch:
            self.expires_at = -math.inf
            self.released.append(epoch)

    async def relinquish(self, epoch: int) -> None:
        await self._maybe_hang()
        self.relinquished.append(epoch)

    async def close(self) -> None:
        pass


@attrs.define
class Harness:
    db: FakeLeaseDb
    keeper: LeaseKeeper
    inbox: trio.MemorySendChannel[LeaseInbox]
    changes: trio.MemoryReceiveChannel[RoleChange]

    async def next_change(self) -> tuple[float, RoleChange]:
        change = await self.changes.receive()
        return trio.current_time(), change


def make_harness(db: FakeLeaseDb, settings: LeaseSettings = SETTINGS) -> Harness:
    inbox_send, inbox_recv = trio.open_memory_channel[LeaseInbox](8)
    changes_send, changes_recv = trio.open_memory_channel[RoleChange](8)

    async def open_store() -> FakeLeaseDb:
        return db

    keeper = LeaseKeeper(
        cp_id="cp-1", settings=settings, open_store=open_store, inbox=inbox_recv, subscribers=[changes_send]
    )
    return Harness(db=db, keeper=keeper, inbox=inbox_send, changes=changes_recv)


async def test_takes_an_expired_lease_at_once_and_bumps_the_epoch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A standby takes an expired lease on its first attempt, with epoch + 1."""
    h = make_harness(FakeLeaseDb(holder="cp-9", epoch=4, expires_at=-1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        assert isinstance((await h.next_change())[1], Deposed)  # the "starting" reset
        at, change = await h.next_change()
        assert change == Elected(seq=2, epoch=5)
        assert at == 0.0
        assert h.db.holder == "cp-1"
        nursery.cancel_scope.cancel()


async def test_waits_for_a_live_lease_to_expire_by_database_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A standby does not take a lease held until t=10; it takes it at the first poll after."""
    h = make_harness(FakeLeaseDb(holder="cp-9", epoch=4, expires_at=10.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        at, change = await h.next_change()
        assert isinstance(change, Elected) and change.epoch == 5
        assert at == pytest.approx(10.25)  # polls every 0.25 s; at 10.0 it is not yet expired
        nursery.cancel_scope.cancel()


async def test_leader_renews_every_renew_interval(autojump_clock: trio.testing.MockClock) -> None:
    """The leader renews at 0.5 s steps after its takeover, and stays leader."""
    h = make_harness(FakeLeaseDb())
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        await trio.sleep(2.2)
        assert h.db.renewals == pytest.approx([0.5, 1.0, 1.5, 2.0])
        assert h.keeper.epoch == 1
        nursery.cancel_scope.cancel()


def renewal_histogram() -> tuple[float, float]:
    """(count, sum) of ``stockade_lease_renewal_seconds`` now."""
    count = REGISTRY.get_sample_value("stockade_lease_renewal_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("stockade_lease_renewal_seconds_sum") or 0.0
    return count, total


async def test_each_renewal_counts_its_time_from_send_to_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Renewals answered 0.3 s after they are sent are each counted with 0.3 s in
    stockade_lease_renewal_seconds."""
    h = make_harness(FakeLeaseDb(renew_delay_s=0.3))
    before = renewal_histogram()
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        await trio.sleep(1.9)
        assert h.db.renewals == pytest.approx([0.8, 1.3, 1.8])
        nursery.cancel_scope.cancel()
    count, total = renewal_histogram()
    assert (count - before[0], total - before[1]) == pytest.approx((3, 0.9))


async def test_steps_down_locally_when_renewals_hang(autojump_clock: trio.testing.MockClock) -> None:
    """With the database frozen after the 0.5 s renewal, the leader steps down at exactly
    0.5 + ttl - margin = 2.1 s, before the lease (renewed at 0.5 s until 2.5 s) expires."""
    db = FakeLeaseDb()
    h = make_harness(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        await trio.sleep(0.75)
        db.frozen = True
        at, change = await h.next_change()
        assert isinstance(change, Deposed)
        assert at == pytest.approx(0.5 + 2.0 - 0.4)
        assert at < db.expires_at
        assert h.keeper.epoch is None
        nursery.cancel_scope.cancel()


async def test_a_leader_whose_session_ended_is_replaced_without_waiting_for_expiry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A lease held until t=10 by a replica whose database session ended at t=2.9 (killed) is
    taken at the first poll after that (polls every 0.25 s: t=3.0), not at expiry."""
    db = FakeLeaseDb(holder="cp-9", epoch=4, expires_at=10.0)
    h = make_harness(db)

    async def kill_holder() -> None:
        await trio.sleep(2.9)
        db.holder_session_alive = False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill_holder)
        await nursery.start(h.keeper.run)
        await h.next_change()
        at, change = await h.next_change()
        assert change == Elected(seq=2, epoch=5)
        assert at == pytest.approx(3.0)
        nursery.cancel_scope.cancel()


async def test_deposed_when_renewal_finds_another_holder(autojump_clock: trio.testing.MockClock) -> None:
    """A renewal that finds the lease taken (no row back) deposes the leader at that renewal."""
    db = FakeLeaseDb()
    h = make_harness(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        await trio.sleep(0.6)
        db.holder, db.epoch = "cp-2", 2
        at, change = await h.next_change()
        assert isinstance(change, Deposed) and change.epoch == 1
        assert at == pytest.approx(1.0)
        await trio.sleep(0.01)
        assert db.relinquished == [1]  # the deposed leader lets go of its epoch's lock
        nursery.cancel_scope.cancel()


async def test_epoch_superseded_deposes_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """A report of a newer epoch (from the ledger or a worker) deposes without waiting."""
    h = make_harness(FakeLeaseDb())
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        await trio.sleep(0.1)
        await h.inbox.send(EpochSuperseded(epoch=1, epoch_seen=2))
        at, change = await h.next_change()
        assert isinstance(change, Deposed)
        assert at == pytest.approx(0.1)
        nursery.cancel_scope.cancel()


async def test_query_role_answers_the_latest_change(autojump_clock: trio.testing.MockClock) -> None:
    """QueryRole returns the role last published, so a restarted actor catches up."""
    h = make_harness(FakeLeaseDb())
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        reply: Reply[RoleChange] = Reply()
        await h.inbox.send(QueryRole(reply=reply))
        assert await reply.wait() == Elected(seq=2, epoch=1)
        nursery.cancel_scope.cancel()


async def test_releases_the_lease_when_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    """Stopping the leader expires its lease so a standby can take over at once."""
    db = FakeLeaseDb()
    h = make_harness(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await h.next_change()
        await h.next_change()
        nursery.cancel_scope.cancel()
    assert db.released == [1]
    assert db.expires_at == -math.inf


async def test_steps_down_when_the_main_loop_stops_running(autojump_clock: trio.testing.MockClock) -> None:
    """A leader whose main loop has been silent longer than max_main_loop_stall_s steps down at
    its next renewal, though the database would renew it; while the loop stays silent it takes
    nothing over, and it leads again once the loop runs."""
    settings = attrs.evolve(SETTINGS, max_main_loop_stall_s=3.0)
    db = FakeLeaseDb()
    h = make_harness(db, settings)
    main_loop_last_ran = [0.0]
    h.keeper.main_loop_silent_s = lambda: trio.current_time() - main_loop_last_ran[0]
    async with trio.open_nursery() as nursery:

        async def main_loop_runs_until(stop_at: float) -> None:
            while trio.current_time() < stop_at:
                main_loop_last_ran[0] = trio.current_time()
                await trio.sleep(0.1)

        nursery.start_soon(main_loop_runs_until, 1.05)  # last runs at 1.0, then stops
        await nursery.start(h.keeper.run)
        await h.next_change()  # the "starting" reset
        assert (await h.next_change()) == (0.0, Elected(seq=2, epoch=1))
        at, change = await h.next_change()
        assert isinstance(change, Deposed) and "main loop has not run" in change.reason
        # Renewals every 0.5 s; at 4.0 the loop (last ran at 1.0) is 3.0 s silent, at 4.5 3.5 s.
        assert at == pytest.approx(4.5)
        assert db.epoch == 1  # nothing taken over since
        await trio.sleep(5.0)
        assert db.epoch == 1
        nursery.start_soon(main_loop_runs_until, math.inf)
        at, change = await h.next_change()
        assert isinstance(change, Elected) and change.epoch == 2
        nursery.cancel_scope.cancel()


def lease_warnings(logs: list[dict[str, object]]) -> list[object]:
    return [entry["event"] for entry in logs if entry["log_level"] == "warning"]


async def test_a_lost_database_adds_no_line_per_takeover_probe(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A standby whose database is gone for 5 s (20 probes) logs nothing itself (its store's
    connection logs the outage once); then, after a probe that worked, a busy one for 5 s logs
    one line for the whole run."""
    h = make_harness(FakeLeaseDb(holder="cp-9", epoch=4, expires_at=100.0))
    with structlog.testing.capture_logs() as logs:
        h.keeper._log = structlog.get_logger().bind(actor="lease")
        async with trio.open_nursery() as nursery:
            await nursery.start(h.keeper.run)
            h.db.error = DatabaseUnavailable("database connection lost")
            await trio.sleep(5.0)
            h.db.error = None  # the lease is live: probes answer None
            await trio.sleep(1.0)
            h.db.error = DatabaseBusy("database busy: statement timeout")
            await trio.sleep(5.0)
            nursery.cancel_scope.cancel()
    assert lease_warnings(logs) == ["takeover attempt failed"]


async def test_failed_renewals_are_logged_once_before_stepping_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A leader whose renewals fail until its step-down logs 'renewal failed' once, then
    'deposed'."""
    h = make_harness(FakeLeaseDb())
    with structlog.testing.capture_logs() as logs:
        h.keeper._log = structlog.get_logger().bind(actor="lease")
        async with trio.open_nursery() as nursery:
            await nursery.start(h.keeper.run)
            await h.next_change()
            await h.next_change()  # elected at 0
            h.db.error = DatabaseUnavailable("database connection lost")
            at, change = await h.next_change()
            assert isinstance(change, Deposed)
            assert at == pytest.approx(SETTINGS.lease_ttl_s - SETTINGS.step_down_margin_s)
            nursery.cancel_scope.cancel()
    assert lease_warnings(logs) == ["renewal failed", "deposed"]
