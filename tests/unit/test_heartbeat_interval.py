"""The heartbeat interval the cluster tells: the leader's choice (pure), the settings' margin
rules, and the agent taking or refusing what it is told (mock clock, scripted control plane).

docs/design.md, "Heartbeat interval", argues why the self-fence holds when the interval and the
dead_after change; the database's side of it (the dead_after each worker is judged by) is
tested in tests/integration/test_heartbeat_interval_sql.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import structlog
import trio
from hypothesis import given
from hypothesis import strategies as st
from test_agent_heartbeat import ScriptedControlPlane, agent_settings, running_agent
from test_reconciler import SETTINGS as RECONCILER_SETTINGS
from test_reconciler import FakeStore, answer_role, make_harness

from actors.deaths import TokenBucket, judge_deaths
from actors.heartbeat_policy import (
    MAX_WAITED_MS,
    SHRINK_AFTER_S,
    STEP_MS,
    HeartbeatCost,
    HeartbeatPolicy,
    HeartbeatWaits,
    LongestWithin,
    choose_policy,
    dead_after_ms_for,
    default_policy,
    wanted_interval_ms,
)
from actors.messages import DeclareDeadWorkers, ReconcileResult, SetHeartbeatPolicy
from actors.reconciler_store import HeartbeatAge
from agent.fence import fence_after_s, told_refusal
from agent.messages import Registered, Registration
from runtime.errors import InvalidArgument
from runtime.settings.leader import (
    ReconcilerSettings,
    fence_margin_refusal,
)

SETTINGS = ReconcilerSettings()


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


# ---------------------------------------------------------------- the leader's choice


def test_a_small_cluster_gets_the_shortest_interval_and_the_operators_dead_after() -> None:
    """100 workers at 300 µs a heartbeat over 3 replicas want 40 ms: the 250 ms floor and
    dead_after_s (2.5 s, above 4 intervals) hold: today's defaults, unchanged."""
    chosen = choose_policy(workers=100, costs_us=[300, 300, 300], current=None, settings=SETTINGS)
    assert (chosen.interval_ms, chosen.dead_after_ms) == (250, 2500)
    assert chosen == attrs.evolve(
        default_policy(SETTINGS), workers=100, cpu_per_heartbeat_us=300, reason=chosen.reason
    )


def test_a_large_cluster_stretches_the_interval_up_to_the_cap_and_detection_follows() -> None:
    """2,000 workers at 300 µs over 3 replicas at a quarter core want 800 ms; dead_after is
    4 intervals; 50,000 at 3 ms want 200 s, capped at heartbeat_interval_max_s (10 s), and the
    reason says so."""
    chosen = choose_policy(workers=2000, costs_us=[300, 290, 310], current=None, settings=SETTINGS)
    assert (chosen.interval_ms, chosen.dead_after_ms) == (800, 3200)
    assert "2000 workers x 300 us" in chosen.reason
    capped = choose_policy(workers=50_000, costs_us=[3000, 3000, 3000], current=None, settings=SETTINGS)
    assert (capped.interval_ms, capped.dead_after_ms) == (10_000, 40_000)
    assert "capped at heartbeat_interval_max_s = 10" in capped.reason


def test_before_any_cost_is_measured_a_large_cluster_starts_with_a_long_interval() -> None:
    """500 workers registering at once before any replica measured a heartbeat's cost are not
    asked for the shortest interval (2,000 heartbeats a second would bury the control planes):
    the default cost over one replica gives 500 x 4 ms / 0.25 = 8 s; a handful of workers still
    get the shortest."""
    storm = choose_policy(workers=500, costs_us=[], current=None, settings=SETTINGS)
    assert storm.interval_ms == 8000
    assert "not measured yet" in storm.reason
    few = choose_policy(workers=5, costs_us=[], current=None, settings=SETTINGS)
    assert few.interval_ms == 250


def test_once_one_replica_measured_the_heartbeats_are_spread_over_every_live_one() -> None:
    """A cluster starting: one of three live replicas has measured 6 ms a heartbeat. 100
    workers are shared by all three (100 x 6 ms / (3 x 0.25) = 800 ms), not asked for three
    times that as if the one replica took them all; with no cost measured the storm rule still
    counts one replica."""
    early = choose_policy(workers=100, costs_us=[6000], replicas=3, current=None, settings=SETTINGS)
    assert early.interval_ms == 800
    assert "over 3 control planes" in early.reason
    assert choose_policy(workers=100, costs_us=[6000], current=None, settings=SETTINGS).interval_ms == 2400
    assert wanted_interval_ms(workers=100, costs_us=[6000], replicas=3, settings=SETTINGS) == 800
    storm = choose_policy(workers=500, costs_us=[], replicas=3, current=None, settings=SETTINGS)
    assert storm.interval_ms == 8000


def test_a_change_within_the_hysteresis_keeps_the_policy_in_force() -> None:
    """A cost that moved a little keeps the interval (the same object back: nothing to write);
    one that moved a lot changes it."""
    current = choose_policy(workers=2000, costs_us=[300] * 3, current=None, settings=SETTINGS)
    assert choose_policy(workers=2000, costs_us=[315] * 3, current=current, settings=SETTINGS) is current
    moved = choose_policy(workers=2000, costs_us=[150] * 3, current=current, settings=SETTINGS)
    assert moved.interval_ms < current.interval_ms


def test_answers_slower_than_the_cost_allows_lengthen_the_interval() -> None:
    """500 workers at 1,272 µs over 3 replicas want 850 ms by the cost (the CPU measure of a
    machine shared with other work stays low while answers wait for the CPU); heartbeats whose
    answers waited up to 2,100 ms (the largest replica's 99th percentile) get 2,100 ms, and
    detection 8.4 s, saying why."""
    by_cost = choose_policy(workers=500, costs_us=[1272] * 3, current=None, settings=SETTINGS)
    assert by_cost.interval_ms == 850
    slow = choose_policy(
        workers=500, costs_us=[1272] * 3, waits_ms=[900, 2100, 1500], current=None, settings=SETTINGS
    )
    assert (slow.interval_ms, slow.dead_after_ms) == (2100, 8400)
    assert "waited up to 2100 ms" in slow.reason
    fast = choose_policy(workers=500, costs_us=[1272] * 3, waits_ms=[40, 35], current=None, settings=SETTINGS)
    assert fast == by_cost


def test_the_interval_shrinks_only_to_the_longest_wanted_over_the_window() -> None:
    """Wanted 2,000 ms at 0 s, then less: the window keeps 2,000 until it is 30 s old, then the
    longest of what came after it (900 ms); a longer value replaces every shorter one at once."""
    window = LongestWithin()
    assert window.add(0.0, 2000) == 2000
    assert window.add(10.0, 800) == 2000
    assert window.add(29.9, 900) == 2000
    assert window.add(SHRINK_AFTER_S, 850) == 900
    assert window.add(40.0, 700) == 900
    assert window.add(60.0, 700) == 700
    assert window.add(61.0, 3000) == 3000
    held = choose_policy(workers=500, costs_us=[1272] * 3, current=None, settings=SETTINGS, floor_ms=2000)
    assert held.interval_ms == 2000 and "held at 2000 ms" in held.reason
    # The default cost stands in before any replica measured one: a guess, not held.
    assert wanted_interval_ms(workers=500, costs_us=[], settings=SETTINGS) is None
    assert wanted_interval_ms(workers=500, costs_us=[1272], waits_ms=[3000], settings=SETTINGS) == 3000


def test_the_wait_percentile_is_over_workers_needs_enough_of_them_and_forgets_old_ones() -> None:
    """Each worker counts once, by its largest wait within 10 s (its latest once that is older);
    0 (not said) is not a wait; a wait counts as at most MAX_WAITED_MS; fewer than min_workers
    reporting: None. Nearest-rank 99th percentile, never one of the three largest workers'."""
    waits = HeartbeatWaits(window_s=10.0, min_workers=10)
    for i in range(9):
        waits.add(0.0, f"w-{i}", 100 + i)
    waits.add(0.0, "w-9", 0)
    assert waits.p99_ms(1.0) is None  # 9 workers said a wait
    waits.add(1.0, "w-9", 109)
    assert waits.p99_ms(1.0) == 106.0  # rank min(10, 10 - 3) = 7
    for _ in range(50):
        waits.add(2.0, "w-0", 1000)  # many heartbeats of one worker are one value
    assert waits.p99_ms(2.0) == 107.0
    waits.add(3.0, "w-1", 10)  # a shorter wait does not replace the largest within the window
    assert waits.p99_ms(3.0) == 107.0
    waits.add(12.0, "w-1", 10)  # its 101 ms is 12 s old: the latest counts
    assert waits.p99_ms(12.0) is None  # only w-0 (2 s) and w-1 reported in the last 10 s
    for i in range(200):
        waits.add(13.0, f"v-{i}", 10**9 if i < 4 else i + 1)
    assert waits.p99_ms(13.0) == float(MAX_WAITED_MS)  # four of 202 at the cap


def test_a_few_frozen_or_starved_workers_do_not_set_a_clusters_wait() -> None:
    """50 workers whose heartbeats wait 20 ms and three that report 30 s at every heartbeat
    (thawed after a freeze, or on a machine of their own that their jobs starve): the
    percentile stays 20 ms; a fourth is no longer a few."""
    waits = HeartbeatWaits()
    for beat in range(10):
        for i in range(50):
            waits.add(beat * 0.5, f"w-{i}", 20)
        for i in range(3):
            waits.add(beat * 0.5, f"slow-{i}", 30_000)
    assert waits.p99_ms(5.0) == 20.0
    waits.add(5.0, "slow-3", 30_000)
    assert waits.p99_ms(5.0) == 30_000.0


@given(
    workers=st.integers(0, 100_000),
    costs=st.lists(st.floats(-10, 1e5) | st.just(float("nan")) | st.just(float("inf")), max_size=5),
    waits=st.lists(st.floats(-10, 1e6) | st.just(float("nan")) | st.just(float("inf")), max_size=3),
    floor_ms=st.integers(0, 100_000),
    low_ms=st.integers(10, 2000),
    span_ms=st.integers(0, 20_000),
    intervals=st.floats(3, 20),
)
def test_every_choice_is_within_the_bounds_and_its_dead_after_follows_the_rule(
    workers: int,
    costs: list[float],
    waits: list[float],
    floor_ms: int,
    low_ms: int,
    span_ms: int,
    intervals: float,
) -> None:
    """Whatever the size, the costs, the waits and the floor (bad measurements included): a
    whole number of steps within the operator's bounds, at least the wanted one, and dead_after
    = max(dead_after_s, intervals x interval), always longer than the interval."""
    settings = ReconcilerSettings(
        heartbeat_interval_min_s=low_ms / 1000,
        heartbeat_interval_max_s=(low_ms + span_ms) / 1000,
        dead_after_s=max(2.5, low_ms / 1000 + 0.1),
        dead_after_intervals=intervals,
    )
    chosen = choose_policy(
        workers=workers, costs_us=costs, waits_ms=waits, current=None, settings=settings, floor_ms=floor_ms
    )
    wanted = wanted_interval_ms(workers=workers, costs_us=costs, waits_ms=waits, settings=settings)
    assert wanted is None or chosen.interval_ms >= wanted
    low = max(STEP_MS, -(-low_ms // STEP_MS) * STEP_MS)
    assert chosen.interval_ms % STEP_MS == 0
    assert low <= chosen.interval_ms <= max(low, low_ms + span_ms)
    assert chosen.dead_after_ms == dead_after_ms_for(chosen.interval_ms, settings)
    assert chosen.dead_after_ms >= settings.dead_after_s * 1000 - 1e-6
    assert chosen.dead_after_ms >= intervals * chosen.interval_ms - 1e-6
    assert chosen.dead_after_ms > chosen.interval_ms


@given(workers=st.integers(0, 50_000), more=st.integers(0, 50_000), cost=st.floats(1, 5000))
def test_more_workers_never_get_a_shorter_interval(workers: int, more: int, cost: float) -> None:
    """The interval grows (or stays) with the cluster's size at a given cost."""
    small = choose_policy(workers=workers, costs_us=[cost], current=None, settings=SETTINGS)
    large = choose_policy(workers=workers + more, costs_us=[cost], current=None, settings=SETTINGS)
    assert large.interval_ms >= small.interval_ms


def test_the_cost_is_the_threads_cpu_per_heartbeat_smoothed_and_needs_enough_heartbeats() -> None:
    """No value before a span of at least min_heartbeats; then CPU per heartbeat, smoothed."""
    cost = HeartbeatCost(min_heartbeats=10, weight=0.5)
    assert cost.measure(1.0, 0) is None
    assert cost.measure(1.5, 5) is None  # too few: added to the next span
    assert cost.measure(2.0, 1000) == pytest.approx(1000.0)  # 1 s / 1,000 heartbeats
    assert cost.measure(2.5, 2000) == pytest.approx(750.0)  # half of 1000 + half of 500


# ---------------------------------------------------------------- the margin rules at start


@pytest.mark.parametrize(
    ("overrides", "field", "named"),
    [
        ({"heartbeat_interval_min_s": 2.0, "heartbeat_interval_max_s": 1.0}, "heartbeat_interval_max_s", "2"),
        (
            {"heartbeat_interval_min_s": 3.0, "heartbeat_interval_max_s": 5.0},
            "heartbeat_interval_min_s",
            "2.5",
        ),
        ({"dead_after_intervals": 2.0}, "dead_after_intervals", ">= 3"),
    ],
)
def test_control_plane_bounds_that_break_the_margin_rules_are_refused_naming_both_values(
    overrides: dict[str, float], field: str, named: str
) -> None:
    """An interval range upside down, a shortest interval not below dead_after_s, or too few
    intervals before a death: refused at start, naming the field, its value and the other one."""
    with pytest.raises(InvalidArgument) as refused:
        ReconcilerSettings(**overrides)
    assert field in str(refused.value)
    assert named in str(refused.value)


def test_an_agent_interval_outside_its_own_bounds_is_refused_at_start(tmp_path: Path) -> None:
    """heartbeat_interval_s must lie within the agent's told-interval bounds."""
    with pytest.raises(InvalidArgument, match=r"heartbeat_interval_s.*heartbeat_interval_max_s = 10"):
        agent_settings(tmp_path, heartbeat_interval_s=20.0)


@pytest.mark.parametrize(
    ("overrides", "refused_at_s"),
    [
        ({"dead_after_s": 1.2}, "0.25"),  # the shortest interval: 1.2 - 1.0 leaves 0.2 s
        ({"dead_after_s": 1.25, "heartbeat_interval_min_s": 0.3, "heartbeat_interval_max_s": 0.3}, "0.3"),
    ],
)
def test_a_dead_after_that_leaves_no_fence_longer_than_an_interval_is_refused(
    overrides: dict[str, float], refused_at_s: str
) -> None:
    """The control plane's start check: with the agents' default stop grace and margin, some
    interval it may tell would get a self-fence span no longer than itself. It names the
    interval, the dead_after and the span; the default settings and the bench's pinned 1 s
    with a 5 s dead_after pass."""
    why = fence_margin_refusal(ReconcilerSettings(**overrides))
    assert why is not None and f"heartbeat interval of {refused_at_s} s" in why and "self-fence span" in why
    assert fence_margin_refusal(ReconcilerSettings()) is None
    pinned = ReconcilerSettings(dead_after_s=5.0, heartbeat_interval_min_s=1.0, heartbeat_interval_max_s=1.0)
    assert fence_margin_refusal(pinned) is None


def test_an_agent_interval_not_below_its_own_fence_is_refused_at_start(tmp_path: Path) -> None:
    """An agent whose own interval is not shorter than its self-fence span would pause its jobs
    at every heartbeat: refused, naming both; min above max names max."""
    with pytest.raises(InvalidArgument, match=r"heartbeat_interval_s.*self_fence_after_s = 3"):
        agent_settings(tmp_path, heartbeat_interval_s=3.0, heartbeat_interval_min_s=2.0)
    with pytest.raises(InvalidArgument, match=r"heartbeat_interval_max_s.*heartbeat_interval_min_s = 5"):
        agent_settings(tmp_path, heartbeat_interval_min_s=5.0, heartbeat_interval_max_s=1.0)


# ---------------------------------------------------------------- the agent's side


def test_a_longer_told_interval_stretches_the_fence_within_dead_after() -> None:
    """The fence stretches with the interval (as many missed heartbeats tolerated), but never
    past dead_after - stop grace - margin; the agent's own interval changes nothing."""
    settings = agent_settings(Path("w"))  # interval 0.5, fence 3, stop grace 1, margin 0.5
    assert fence_after_s(settings, 10.0, 0.5) == 3.0
    assert fence_after_s(settings, 100.0, 2.0) == 12.0
    assert fence_after_s(settings, 10.0, 2.0) == 8.5


async def test_each_heartbeat_says_how_long_the_previous_one_waited(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """The first heartbeat says nothing (0); then each says the round trip of the one before,
    and nothing after a call no control plane answered (how long it waited measures the
    outage, not the replicas)."""
    cp = ScriptedControlPlane(answer_delay_s=0.2)
    async with running_agent(tmp_path, cp, db_outage_grace_s=20.0) as agent:
        await agent.wait_registered()
        await trio.sleep(1.0)
        cp.mode = "down"  # a call fails after 1 s
        await trio.sleep(1.5)
        cp.mode = "up"
        await trio.sleep(1.5)
    said = [report.waited_ms for _, report in cp.heartbeats]
    assert said[:5] == [0, 200, 0, 0, 200]


@pytest.mark.parametrize(
    ("interval_s", "dead_after_s", "reason"),
    [
        (0.0, 10.0, "must be > 0"),
        (-1.0, 10.0, "must be > 0"),
        (float("nan"), 10.0, "must be > 0"),
        (0.01, 10.0, "outside heartbeat_interval_min_s = 0.05"),
        (20.0, 100.0, "heartbeat_interval_max_s = 10"),
        (2.0, 3.0, "must be longer than the heartbeat interval 2"),
    ],
)
def test_the_agent_refuses_a_told_interval_that_is_not_a_good_one(
    interval_s: float, dead_after_s: float, reason: str
) -> None:
    """0, negative, not a number, outside the agent's bounds, or leaving a fence no longer than
    itself: refused, and the refusal says which rule and which values."""
    why = told_refusal(agent_settings(Path("w")), interval_s, dead_after_s)
    assert why is not None and reason in why


async def test_a_told_interval_spaces_the_heartbeats_and_each_says_the_dead_after_in_use(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Told 2 s with a dead_after of 10 s in the reply to the first heartbeat: the next ones
    are 2 s apart, the fence is 8.5 s, and every later heartbeat says it uses 10 s (the earlier
    ones, none: the registration told nothing)."""
    cp = ScriptedControlPlane()
    cp.next_answer = {"heartbeat_interval_s": 2.0, "dead_after_s": 10.0}
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        t0 = cp.registrations[0][0]
        await trio.sleep(5.0)
        assert agent.metrics_reading().fence_after_s == 8.5
    times = [t - t0 for t, _ in cp.heartbeats]
    assert times[:3] == pytest.approx([0.5, 2.5, 4.5])
    assert [r.dead_after_in_use_ms for _, r in cp.heartbeats][:3] == [0, 10000, 10000]
    sent = [r.sent_monotonic_us for _, r in cp.heartbeats]
    assert sent == sorted(sent) and len(set(sent)) == len(sent)


@attrs.define
class TellingControlPlane(ScriptedControlPlane):
    """Tells ``told`` (interval, dead_after) in every reply, registrations included."""

    told: tuple[float | None, float | None] = (None, None)

    async def register(self, request: Registration, *, deadline_s: float) -> Registered:
        registered = await super().register(request, deadline_s=deadline_s)
        return attrs.evolve(registered, heartbeat_interval_s=self.told[0], dead_after_s=self.told[1])

    async def heartbeat(self, request: Any, *, deadline_s: float) -> Any:
        self.next_answer = {"heartbeat_interval_s": self.told[0], "dead_after_s": self.told[1]}
        return await super().heartbeat(request, deadline_s=deadline_s)


@pytest.mark.parametrize("bad_interval_s", [0.0, -0.25, 30.0])
async def test_a_bad_told_interval_is_refused_with_one_log_line_and_the_last_good_one_kept(
    tmp_path: Path, autojump_clock: Any, bad_interval_s: float
) -> None:
    """Told 1 s at registration, then a bad interval in every reply: the agent keeps 1 s,
    logs the refusal once (not at every reply), and still takes the dead_after told with it."""
    cp = TellingControlPlane(told=(1.0, 8.0))
    with structlog.testing.capture_logs() as logs:
        async with running_agent(tmp_path, cp) as agent:
            await agent.wait_registered()
            t0 = cp.registrations[0][0]
            cp.told = (bad_interval_s, 9.0)
            await trio.sleep(4.5)
            assert agent.heartbeat_interval_s == 1.0
            assert agent.dead_after_s == 9.0
    times = [t - t0 for t, _ in cp.heartbeats]
    assert times[:4] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    refusals = [
        line
        for line in logs
        if line["event"].startswith("heartbeat interval told by the control plane refused")
    ]
    assert len(refusals) == 1
    assert refusals[0]["told_interval_s"] == bad_interval_s


async def test_a_registration_told_a_short_dead_after_lowers_the_fence_even_with_a_refused_interval(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Safety first: a dead_after is never refused. Told 2.5 s with an interval of 0 (bad), the
    fence fits below it (2.5 - 1 - 0.5 = 1 s) and the interval stays the agent's own."""
    cp = TellingControlPlane(told=(0.0, 2.5))
    async with running_agent(tmp_path, cp) as agent:
        await agent.wait_registered()
        assert agent.metrics_reading().fence_after_s == 1.0
        assert agent.heartbeat_interval_s == 0.5


def test_policy_values_survive_a_round_trip_as_written() -> None:
    """A policy is a plain value: equal policies compare equal (the leader writes only changes)."""
    a = HeartbeatPolicy(
        interval_ms=800, dead_after_ms=3200, workers=2000, cpu_per_heartbeat_us=300.0, reason="x"
    )
    assert a == attrs.evolve(a)


# ---------------------------------------------------------------- the leader's pass


def test_a_worker_is_judged_by_the_longer_dead_after_its_row_records() -> None:
    """dead_after_s 5 s: silent 6 s, w-1 (told nothing) is named, w-2 (told 8 s) is not; and a
    suspect of mass silence counts from the same share of each one's dead_after."""
    settings = ReconcilerSettings(dead_after_s=5.0, death_burst=10, mass_silence_min_workers=100)
    ages = [
        HeartbeatAge(worker_id="w-1", incarnation=1, age_s=6.0),
        HeartbeatAge(worker_id="w-2", incarnation=1, age_s=6.0, dead_after_s=8.0),
        HeartbeatAge(worker_id="w-3", incarnation=1, age_s=9.0, dead_after_s=8.0),
    ]
    verdict = judge_deaths(ages, settings, TokenBucket(10.0, 0.0), 0.0)
    assert verdict.declare == (("w-3", 1), ("w-1", 1))


async def policy_writes(
    store: FakeStore, *, until_s: float, beat_s: float = 0.5, on_beat: Callable[[], None] = lambda: None
) -> list[tuple[float, SetHeartbeatPolicy]]:
    """Run a leader's reconciler (epoch 4) on ``store`` until mock time ``until_s``, every worker
    heartbeating every ``beat_s`` (``on_beat`` runs at each); return the policy writes with their
    times, each applied to the store."""
    h = make_harness(store)
    written: list[tuple[float, SetHeartbeatPolicy]] = []

    async def beating() -> None:
        while True:
            for worker in store.last_heartbeat:
                store.last_heartbeat[worker] = trio.current_time()
            on_beat()
            await trio.sleep(beat_s)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beating)
        nursery.start_soon(answer_role, h.lease, 4)
        await nursery.start(h.reconciler.run)
        while trio.current_time() < until_s:
            with trio.move_on_after(1.0):
                message = await h.ledger.receive()
                if isinstance(message, SetHeartbeatPolicy):
                    written.append((trio.current_time(), message))
                    store.policy = message.policy
                    message.reply.set(None)
                else:
                    assert isinstance(message, DeclareDeadWorkers)
                    message.reply.set(
                        ReconcileResult(dead_worker_ids=(), requeued_job_ids=(), orphaned_assignment_ids=())
                    )
        nursery.cancel_scope.cancel()
    return written


async def test_the_leader_writes_a_longer_interval_once_the_cluster_grows_and_not_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """2,000 alive workers at 300 µs a heartbeat over 3 replicas: the first pass writes 800 ms
    (fenced, under its epoch); later passes, with the policy in force, write nothing more."""
    store = FakeStore(last_heartbeat={f"w-{i}": 0.0 for i in range(2000)}, costs_us=(300.0, 300.0, 300.0))
    written = await policy_writes(store, until_s=3 * RECONCILER_SETTINGS.heartbeat_policy_every_s)
    assert [(m.epoch, m.policy.interval_ms, m.policy.dead_after_ms) for _, m in written] == [(4, 800, 5000)]


async def test_the_leader_lengthens_the_interval_when_answers_wait_and_shortens_it_30_s_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """100 workers at 300 µs keep the shortest interval until the replicas report answers that
    waited 1,500 ms: the next policy pass writes 1,500 ms (dead_after 6 s). The waits fall back
    at once, but the interval shortens only once the 1,500 ms wanted is 30 s old."""
    store = FakeStore(last_heartbeat={f"w-{i}": 0.0 for i in range(100)}, costs_us=(300.0, 300.0, 300.0))

    def waits() -> None:
        store.waits_ms = (1500.0,) if 5.0 <= trio.current_time() < 7.0 else (20.0,)

    writes = await policy_writes(store, until_s=60.0, beat_s=0.25, on_beat=waits)
    written = [(at, m.policy.interval_ms) for at, m in writes]
    assert [ms for _, ms in written] == [1500, 250]
    (grew_at, _), (shrank_at, _) = written
    assert 5.0 <= grew_at <= 5.0 + 2 * RECONCILER_SETTINGS.heartbeat_policy_every_s
    assert shrank_at >= grew_at + SHRINK_AFTER_S
