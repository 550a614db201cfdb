"""The ingest's admission rules: the pure shedding, waiting and loop-share decisions (hypothesis)
and the gate that bounds work in progress and keeps capacity for liveness work (trio, mock
clock)."""

from __future__ import annotations

from collections.abc import Generator

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.admission import (
    LIVENESS_RPCS,
    AdmissionGate,
    Load,
    LoopShare,
    admission_wait_s,
    queue_full_reason,
    shed_reason,
    turn_timeout_reason,
)
from runtime.errors import InvalidArgument
from runtime.settings.control_plane import IngestSettings

SETTINGS = IngestSettings(shed_lag_s=0.25, max_waiting_requests=4)
OTHER_RPCS = ("submit_job", "submit_jobs", "cancel_job", "get_job", "list_jobs", "status")

loads = st.builds(
    Load,
    lag_s=st.floats(0.0, 10.0, allow_nan=False),
    in_progress=st.integers(0, 8),
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
        shed_reason(
            "submit_job",
            Load(lag_s=0.0, in_progress=0, waiting=0, would_wait=False),
            cp_id="c",
            settings=settings,
        )
        is None
    )
    assert shed_reason(
        "submit_job", Load(lag_s=0.0, in_progress=2, waiting=0, would_wait=True), cp_id="c", settings=settings
    )


def test_the_busy_message_names_the_replica_the_measures_and_their_limits() -> None:
    """The answer says who is busy, by how much, and what to do."""
    reason = shed_reason(
        "submit_jobs",
        Load(lag_s=0.42, in_progress=2, waiting=14, would_wait=True),
        cp_id="cp-1",
        settings=SETTINGS,
    )
    assert reason == (
        "busy: cp-1 is overloaded (event loop lag 0.42 s, limit 0.25 s; 2 requests in progress, "
        "limit 2; 14 waiting, limit 4), try another replica"
    )


def test_the_reserve_must_leave_room_for_other_work() -> None:
    """liveness_reserved_connections must be below pool_size, naming both."""
    with pytest.raises(InvalidArgument, match="liveness_reserved_connections must be < pool_size = 4"):
        IngestSettings(pool_size=4, liveness_reserved_connections=4)


async def test_other_work_never_takes_the_reserved_slots() -> None:
    """With 3 slots and 1 reserved, a third request of other work waits while liveness work
    still gets the last slot at once."""
    gate = AdmissionGate(size=3, reserved=1)
    await gate.acquire(liveness=False)
    await gate.acquire(liveness=False)
    assert gate.would_wait(liveness=False) and not gate.would_wait(liveness=True)
    await gate.acquire(liveness=True)
    assert gate.held == 3 and gate.would_wait(liveness=True)


async def test_liveness_can_use_every_slot() -> None:
    """Liveness work is not limited to the reserve: it may hold all slots."""
    gate = AdmissionGate(size=3, reserved=1)
    for _ in range(3):
        await gate.acquire(liveness=True)
    assert gate.held == 3 and gate.would_wait(liveness=False)


async def test_a_freed_slot_goes_to_waiting_liveness_work_before_earlier_other_work(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Other work that waited first still comes after liveness work that waits too."""
    gate = AdmissionGate(size=2, reserved=1)
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
    gate = AdmissionGate(size=2, reserved=1)
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
    gate = AdmissionGate(size=2, reserved=1)
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


@given(
    size=st.integers(2, 12),
    reserved=st.integers(1, 11),
    max_other=st.integers(1, 12),
    arrivals=st.lists(st.booleans(), max_size=40),
)
def test_other_work_in_progress_never_exceeds_its_limit_and_liveness_keeps_its_reserve(
    size: int, reserved: int, max_other: int, arrivals: list[bool]
) -> None:
    """Whatever arrives (True: liveness), other work holds at most min(size - reserved,
    max_other) turns, all turns together at most size, and a liveness request finds a turn
    while fewer than size are held."""
    reserved = min(reserved, size - 1)
    gate = AdmissionGate(size=size, reserved=reserved, max_other=max_other)
    for liveness in arrivals:
        if not gate.would_wait(liveness=liveness):
            gate._take(liveness)
        assert gate.held_other <= min(size - reserved, max_other) == gate.other_limit
        assert gate.held <= size
        assert gate.would_wait(liveness=True) == (gate.held >= size)


@given(
    now=st.floats(0, 1e6, allow_nan=False),
    left_s=st.floats(-10, 100, allow_nan=False),
    liveness=st.booleans(),
    max_wait_s=st.floats(0.01, 10, allow_nan=False),
)
def test_a_request_waits_for_its_turn_at_most_its_limit_and_never_past_its_deadline(
    now: float, left_s: float, liveness: bool, max_wait_s: float
) -> None:
    """Other work waits at most max_admission_wait_s, liveness work liveness_connection_wait_s, and
    neither beyond its client's deadline."""
    settings = IngestSettings(max_admission_wait_s=max_wait_s)
    wait_s = admission_wait_s(now=now, deadline=now + left_s, liveness=liveness, settings=settings)
    assert 0.0 <= wait_s <= max(0.0, left_s) + 1e-9
    assert wait_s <= (settings.liveness_connection_wait_s if liveness else max_wait_s)


def test_the_turn_timeout_message_names_the_replica_the_rpc_the_wait_and_the_limits() -> None:
    """A request refused after waiting says for what, how long, and the limits."""
    assert turn_timeout_reason(
        "list_jobs", waited_s=1.0, in_progress=2, cp_id="cp-1", settings=IngestSettings()
    ) == (
        "busy: cp-1 had no turn for list_jobs within 1.00 s (limit 1 s; 2 requests in progress, "
        "limit 2), try another replica"
    )


def test_submissions_are_refused_exactly_while_the_queue_holds_max_pending_jobs() -> None:
    """Under the limit: no refusal; at or over it: a busy message naming the count, its age,
    the limit and the replica; with the limit 0: never."""
    settings = IngestSettings(max_pending_jobs=20_000)
    assert queue_full_reason(pending=19_999, counted_s_ago=0.1, cp_id="cp-1", settings=settings) is None
    assert queue_full_reason(pending=20_013, counted_s_ago=0.31, cp_id="cp-1", settings=settings) == (
        "busy: 20013 jobs pending (counted 0.31 s ago), limit 20000 (max_pending_jobs); nothing was "
        "stored, try again when the queue is shorter (cp-1)"
    )
    unlimited = IngestSettings(max_pending_jobs=0)
    assert queue_full_reason(pending=10**9, counted_s_ago=0.0, cp_id="cp-1", settings=unlimited) is None


def test_the_wire_share_must_be_a_fraction() -> None:
    """max_wire_work_share above 1 is refused, naming it."""
    with pytest.raises(InvalidArgument, match=r"max_wire_work_share must be a fraction in \(0, 1\]"):
        IngestSettings(max_wire_work_share=1.5)


@given(
    share=st.floats(0.05, 1.0),
    slices=st.lists(st.tuples(st.floats(0, 0.05), st.floats(0, 0.05)), min_size=1, max_size=50),
)
def test_slices_paused_as_the_share_says_take_at_most_their_share_plus_the_burst(
    share: float, slices: list[tuple[float, float]]
) -> None:
    """Running slices (each a duration, then whatever gap the caller adds) and pausing as told,
    the slices' total time stays within share * elapsed + burst + one slice."""
    budget = LoopShare(share=share)
    now = 0.0
    used_total = 0.0
    budget.spend(now=now, used_s=0.0)
    for used_s, gap_s in slices:
        now += used_s
        used_total += used_s
        pause_s = budget.spend(now=now, used_s=used_s)
        now += pause_s + gap_s
    assert used_total <= share * now + budget.burst_s + 1e-9


def test_a_slice_over_budget_pauses_for_what_it_overspent_over_the_share() -> None:
    """At a share of 0.25, a 20 ms slice that 10 ms of savings and its own 5 ms of accrual do
    not cover pauses for the 5 ms left over the share: 20 ms; an idle spell saves up to burst_s."""
    budget = LoopShare(share=0.25, burst_s=0.01)
    assert budget.spend(now=0.0, used_s=0.0) == 0.0  # idle since ever: burst_s saved
    assert budget.spend(now=0.02, used_s=0.02) == pytest.approx(0.005 / 0.25)
    idle = LoopShare(share=0.25, burst_s=0.01)
    idle.spend(now=0.0, used_s=0.0)
    assert idle.spend(now=10.0, used_s=0.01) == 0.0


async def test_a_request_that_waits_max_admission_wait_s_for_a_turn_is_refused_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With both turns for other work held, a listing waits exactly max_admission_wait_s and
    is refused busy, counted as shed; a heartbeat meanwhile gets a turn at once."""
    from actors.ingest import ControlPlaneService
    from runtime.errors import Busy

    settings = IngestSettings(max_admission_wait_s=1.0, max_requests_in_progress=2)
    service = ControlPlaneService(cp_id="cp-1", pool=None, settings=settings)  # type: ignore[arg-type]
    await service.gate.acquire(liveness=False)
    await service.gate.acquire(liveness=False)
    started = trio.current_time()
    with pytest.raises(Busy, match=r"busy: cp-1 had no turn for list_jobs within 1\.00 s"):
        async with service.admitted("list_jobs"):
            pass
    assert trio.current_time() - started == pytest.approx(1.0)
    assert service.gate.waiting_other == 0
    async with service.admitted("heartbeat"):
        assert trio.current_time() - started == pytest.approx(1.0)


async def test_a_turn_is_held_until_the_body_ends_and_then_goes_to_the_next_waiter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A request holds its turn for the whole block (its reply encoded inside it): a second
    request admitted while max_requests_in_progress=1 starts only when the first has ended."""
    from actors.ingest import ControlPlaneService

    service = ControlPlaneService(
        cp_id="cp-1", pool=None, settings=IngestSettings(max_requests_in_progress=1)
    )  # type: ignore[arg-type]
    ends: dict[str, float] = {}

    async def request(name: str, work_s: float) -> None:
        async with service.admitted("list_jobs"):
            await trio.sleep(work_s)
            ends[name] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(request, "first", 0.5)
        await trio.sleep(0.1)
        nursery.start_soon(request, "second", 0.2)
    assert ends == {"first": pytest.approx(0.5), "second": pytest.approx(0.7)}
    assert service.gate.held == 0


async def test_slices_over_their_share_pause_so_other_tasks_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """run_in_slices yields at every step; with a share, a step that used its budget pauses
    for the time the share asks (mock clock: the steps take the time a test gives them)."""
    from actors.ingest_gate import run_in_slices

    def steps() -> Generator[None, None, str]:
        for _ in range(3):
            autojump_clock.jump(0.01)  # a 10 ms slice of work
            yield
        return "done"

    started = trio.current_time()
    share = LoopShare(share=0.5, burst_s=0.0)
    share.spend(now=started, used_s=0.0)
    assert await run_in_slices(steps(), share) == "done"
    # each 10 ms slice at a share of 0.5 is followed by a 10 ms pause: 3 slices, 3 pauses
    assert trio.current_time() - started == pytest.approx(0.06)
