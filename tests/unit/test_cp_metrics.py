"""The control plane's Prometheus metrics move when their events happen, on trio's mock clock:
lease elections and step-downs by cause with the epoch led, the reconcile pass time, and the
leader's cluster packing gauges (gone to 0 once it steps down)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import attrs
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY
from test_lease_keeper import SETTINGS, FakeLeaseDb, Harness, make_harness
from test_placer_freeze import FakeStore as FakePlacerStore
from test_placer_freeze import Harness as PlacerHarness
from test_placer_freeze import make_harness as make_placer_harness
from test_reconciler import FakeStore as FakeReconcilerStore
from test_reconciler import answer_role
from test_reconciler import make_harness as make_reconciler_harness

from actors.messages import (
    DeclareDeadWorkers,
    Deposed,
    Elected,
    EpochSuperseded,
    QueryRole,
    ReconcileResult,
    WorkerRef,
)
from actors.placer import packing
from actors.placer_store import LiveWorker
from actors.reconciler_store import SilenceReading
from actors.rooms import WorkerRoom
from runtime.errors import StaleEpoch
from runtime.metrics import STEP_DOWN_CAUSES


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample of the process's registry now (0 when it has none)."""
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def step_downs() -> dict[str, float]:
    return {cause: sample("stockade_lease_step_downs_total", {"cause": cause}) for cause in STEP_DOWN_CAUSES}


async def until_elected(h: Harness) -> None:
    assert isinstance((await h.next_change())[1], Deposed)  # the "starting" reset
    assert isinstance((await h.next_change())[1], Elected)


async def test_an_election_is_counted_and_the_epoch_led_shown(autojump_clock: trio.testing.MockClock) -> None:
    """A takeover of epoch 4's expired lease counts one election and shows epoch 5."""
    elections = sample("stockade_lease_elections_total")
    h = make_harness(FakeLeaseDb(holder="cp-9", epoch=4, expires_at=-1.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await until_elected(h)
        assert sample("stockade_lease_elections_total") == elections + 1
        assert sample("stockade_lease_epoch") == 5
        nursery.cancel_scope.cancel()


async def _deposed_by_the_database(h: Harness) -> None:
    await trio.sleep(0.6)
    h.db.holder, h.db.epoch = "cp-2", 2


async def _renewals_hang(h: Harness) -> None:
    await trio.sleep(0.75)
    h.db.frozen = True


async def _main_loop_stops(h: Harness) -> None:
    h.keeper.main_loop_silent_s = lambda: trio.current_time()  # it never ran


async def _newer_epoch_seen(h: Harness) -> None:
    await trio.sleep(0.1)
    await h.inbox.send(EpochSuperseded(epoch=1, epoch_seen=2))


CAUSES: dict[str, Callable[[Harness], Awaitable[None]]] = {
    "deposed": _deposed_by_the_database,
    "renewal_late": _renewals_hang,
    "main_loop_stalled": _main_loop_stops,
    "epoch_superseded": _newer_epoch_seen,
}


@pytest.mark.parametrize("cause", sorted(CAUSES))
async def test_a_step_down_is_counted_under_its_cause_alone(
    cause: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Each way of losing the lease counts one step-down under its own cause, none under
    another, and shows epoch 0."""
    before = step_downs()
    h = make_harness(FakeLeaseDb(), attrs.evolve(SETTINGS, max_main_loop_stall_s=3.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await until_elected(h)
        await CAUSES[cause](h)
        assert isinstance((await h.next_change())[1], Deposed)
        assert sample("stockade_lease_epoch") == 0
        nursery.cancel_scope.cancel()
    after = step_downs()
    assert {c: after[c] - before[c] for c in STEP_DOWN_CAUSES} == {
        c: 1.0 if c == cause else 0.0 for c in STEP_DOWN_CAUSES
    }


async def test_a_clean_stop_counts_a_release(autojump_clock: trio.testing.MockClock) -> None:
    """A leader stopped while leading releases its lease: one step-down, cause released."""
    before = step_downs()
    h = make_harness(FakeLeaseDb())
    async with trio.open_nursery() as nursery:
        await nursery.start(h.keeper.run)
        await until_elected(h)
        nursery.cancel_scope.cancel()
    assert h.db.expires_at == -math.inf
    assert step_downs()["released"] == before["released"] + 1
    assert sample("stockade_lease_epoch") == 0


def _worker(worker_id: str, cpu: int, cpu_used: int, memory: int, memory_used: int) -> LiveWorker:
    return LiveWorker(
        ref=WorkerRef(worker_id=worker_id, address="127.0.0.1:1", incarnation=1),
        room=WorkerRoom(
            worker_id=worker_id,
            cpu_millis=cpu,
            memory_mb=memory,
            cpu_allocated_millis=cpu_used,
            memory_allocated_mb=memory_used,
        ),
    )


def test_packing_sums_the_capacity_and_allocation_of_the_workers_read() -> None:
    """(workers, cpu_millis, cpu_allocated_millis, memory_mb, memory_allocated_mb), summed."""
    workers = [_worker("w-1", 4000, 1000, 8192, 512), _worker("w-2", 8000, 7500, 16384, 16000)]
    assert packing(workers) == (2, 12000, 8500, 24576, 16512)
    assert packing([]) == (0, 0, 0, 0, 0)


def packing_gauges() -> tuple[float, ...]:
    names = ("live_workers", "cpu_capacity_millis", "cpu_allocated_millis", "memory_capacity_mb")
    return (*(sample(f"stockade_cluster_{n}") for n in names), sample("stockade_cluster_memory_allocated_mb"))


async def test_the_leaders_placer_shows_the_packing_it_read_and_a_standbys_shows_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Elected, the placer's first round shows the capacity and allocation of the workers it
    read; deposed, it shows zeros (the leader's gauges are the cluster's)."""
    h = make_placer_harness()
    assert isinstance(h.placer.store, FakePlacerStore)
    h.placer.store.workers = [_worker("w-1", 4000, 1000, 8192, 512), _worker("w-2", 8000, 0, 16384, 0)]
    h.placer.store.jobs = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_placer_role, h)
        await nursery.start(h.placer.run)
        await trio.sleep(0.05)
        assert packing_gauges() == (2, 12000, 1000, 24576, 512)
        await h.roles.send(Deposed(seq=5, epoch=3, reason="test"))
        await trio.sleep(0.3)
        assert packing_gauges() == (0, 0, 0, 0, 0)
        nursery.cancel_scope.cancel()


async def _answer_placer_role(h: PlacerHarness) -> None:
    message = await h.lease.receive()
    assert isinstance(message, QueryRole)
    message.reply.set(Elected(seq=1, epoch=3))


@attrs.define
class SlowReads(FakeReconcilerStore):
    """Heartbeat ages that take ``read_s`` of mock time to read."""

    read_s: float = 0.3

    async def heartbeat_ages(self) -> SilenceReading:
        await trio.sleep(self.read_s)
        return await super().heartbeat_ages()


async def test_a_reconcile_pass_is_timed_and_counted_by_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A pass whose read takes 0.3 s is observed as 0.3 s and counted done; a pass whose
    fenced write is refused is counted deposed."""
    count = sample("stockade_reconcile_pass_seconds_count")
    total_s = sample("stockade_reconcile_pass_seconds_sum")
    done = sample("stockade_reconcile_passes_total", {"outcome": "done"})
    deposed = sample("stockade_reconcile_passes_total", {"outcome": "deposed"})
    h = make_reconciler_harness(SlowReads(last_heartbeat={"w-1": 10.0**6}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_role, h.lease, 3)
        await nursery.start(h.reconciler.run)
        for refuse in (False, True):
            message = await h.ledger.receive()
            assert isinstance(message, DeclareDeadWorkers)
            if refuse:
                message.reply.fail(StaleEpoch(3, 4))
            else:
                message.reply.set(
                    ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
                )
        await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert sample("stockade_reconcile_pass_seconds_count") == count + 2
    assert sample("stockade_reconcile_pass_seconds_sum") == pytest.approx(total_s + 0.6)
    assert sample("stockade_reconcile_passes_total", {"outcome": "done"}) == done + 1
    assert sample("stockade_reconcile_passes_total", {"outcome": "deposed"}) == deposed + 1
