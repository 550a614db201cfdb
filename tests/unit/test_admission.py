"""The ingest's admission rules: the pure shedding decision (hypothesis) and the connection gate
that keeps capacity for liveness work (trio, mock clock)."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.admission import LIVENESS_RPCS, ConnectionGate, Load, shed_reason
from runtime.errors import InvalidArgument
from runtime.settings import IngestSettings

SETTINGS = IngestSettings(shed_lag_s=0.25, max_waiting_requests=4)
OTHER_RPCS = ("submit_job", "submit_jobs", "cancel_job", "get_job", "list_jobs", "status")

loads = st.builds(
    Load,
    lag_s=st.floats(0.0, 10.0, allow_nan=False),
    waiting=st.integers(0, 100),
    would_wait=st.booleans(),
)


@given(rpc=st.sampled_from(sorted(LIVENESS_RPCS)), load=loads)
def test_liveness_work_is_never_shed(rpc: str, load: Load) -> None:
    """Heartbeats, registrations and the presence record go ahead whatever the load."""
    assert shed_reason(rpc, load, cp_id="cp-1", settings=SETTINGS) is None


@given(rpc=st.sampled_from(OTHER_RPCS), load=loads)
def test_other_work_is_shed_exactly_when_the_loop_lags_or_the_queue_is_full(rpc: str, load: Load) -> None:
    """New work is refused iff the loop's lag exceeds shed_lag_s, or it would wait for a
    connection behind max_waiting_requests others."""
    expected = load.lag_s > SETTINGS.shed_lag_s or (
        load.would_wait and load.waiting >= SETTINGS.max_waiting_requests
    )
    assert (shed_reason(rpc, load, cp_id="cp-1", settings=SETTINGS) is not None) == expected


def test_a_request_that_gets_a_connection_at_once_is_not_shed_even_with_no_waiting_allowed() -> None:
    """max_waiting_requests=0 refuses only requests that would wait; a free connection is used."""
    settings = IngestSettings(max_waiting_requests=0)
    assert (
        shed_reason("submit_job", Load(lag_s=0.0, waiting=0, would_wait=False), cp_id="c", settings=settings)
        is None
    )
    assert shed_reason(
        "submit_job", Load(lag_s=0.0, waiting=0, would_wait=True), cp_id="c", settings=settings
    )


def test_the_busy_message_names_the_replica_the_measures_and_their_limits() -> None:
    """The answer says who is busy, by how much, and what to do."""
    reason = shed_reason(
        "submit_jobs", Load(lag_s=0.42, waiting=14, would_wait=True), cp_id="cp-1", settings=SETTINGS
    )
    assert reason == (
        "busy: cp-1 is overloaded (event loop lag 0.42 s, limit 0.25 s; 14 requests waiting for the "
        "database, limit 4), try another replica"
    )


def test_the_reserve_must_leave_room_for_other_work() -> None:
    """liveness_reserved_connections must be below pool_size, naming both."""
    with pytest.raises(InvalidArgument, match="liveness_reserved_connections must be < pool_size = 4"):
        IngestSettings(pool_size=4, liveness_reserved_connections=4)


async def test_other_work_never_takes_the_reserved_slots() -> None:
    """With 3 slots and 1 reserved, a third request of other work waits while liveness work
    still gets the last slot at once."""
    gate = ConnectionGate(size=3, reserved=1)
    await gate.acquire(liveness=False)
    await gate.acquire(liveness=False)
    assert gate.would_wait(liveness=False) and not gate.would_wait(liveness=True)
    await gate.acquire(liveness=True)
    assert gate.held == 3 and gate.would_wait(liveness=True)


async def test_liveness_can_use_every_slot() -> None:
    """Liveness work is not limited to the reserve: it may hold all slots."""
    gate = ConnectionGate(size=3, reserved=1)
    for _ in range(3):
        await gate.acquire(liveness=True)
    assert gate.held == 3 and gate.would_wait(liveness=False)


async def test_a_freed_slot_goes_to_waiting_liveness_work_before_earlier_other_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Other work that waited first still comes after liveness work that waits too."""
    gate = ConnectionGate(size=2, reserved=1)
    await gate.acquire(liveness=False)
    await gate.acquire(liveness=True)
    order: list[str] = []

    async def take(name: str, liveness: bool) -> None:
        await gate.acquire(liveness=liveness)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "other", False)
        await trio.sleep(1)
        nursery.start_soon(take, "heartbeat", True)
        await trio.sleep(1)
        assert (gate.waiting_other, gate.waiting_liveness) == (1, 1)
        gate.release(liveness=False)  # an other-work slot frees: liveness work gets it
        await trio.sleep(1)
        assert order == ["heartbeat"]
        gate.release(liveness=True)
        await trio.sleep(1)
        assert order == ["heartbeat", "other"]
    assert gate.held == 2


async def test_other_work_is_served_in_arrival_order(autojump_clock: trio.testing.MockClock) -> None:
    """A released slot is handed to the oldest waiter; a newcomer does not overtake it."""
    gate = ConnectionGate(size=2, reserved=1)
    await gate.acquire(liveness=False)
    order: list[int] = []

    async def take(n: int) -> None:
        await gate.acquire(liveness=False)
        order.append(n)
        await trio.sleep(10)
        gate.release(liveness=False)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(take, n)
            await trio.sleep(1)
        gate.release(liveness=False)
    assert order == [0, 1, 2]
    assert gate.held == 0


async def test_a_cancelled_wait_takes_no_slot(autojump_clock: trio.testing.MockClock) -> None:
    """A request whose client gave up while it waited leaves the gate as it found it."""
    gate = ConnectionGate(size=2, reserved=1)
    await gate.acquire(liveness=False)
    with trio.move_on_after(1):
        await gate.acquire(liveness=False)
    assert (gate.held, gate.waiting_other) == (1, 0)
    gate.release(liveness=False)
    assert gate.held == 0 and not gate.would_wait(liveness=False)


async def test_refusals_are_logged_at_most_once_per_shed_log_every_s(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """Many refusals within shed_log_every_s give one line; the next carries the counts since."""
    from actors.ingest import ControlPlaneService

    service = ControlPlaneService(cp_id="cp-1", pool=None, settings=IngestSettings(shed_log_every_s=5.0))  # type: ignore[arg-type]
    for _ in range(3):
        service._record_shed("submit_jobs", "busy: cp-1 ...")
        await trio.sleep(1)
    service._record_shed("status", "busy: cp-1 ...")
    await trio.sleep(2)
    service._record_shed("status", "busy: cp-1 ...")
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "shedding new work" in line]
    assert len(lines) == 2
    assert "'submit_jobs': 1" in lines[0]
    assert "'submit_jobs': 2" in lines[1] and "'status': 2" in lines[1]
