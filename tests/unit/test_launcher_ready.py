"""When `stockade up` counts a restarted worker as back (ops/launcher/ready.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing
from scripted_control_plane import ScriptedControlPlane, serve

from ops import rpc
from ops.launcher.ready import (
    STATUS_TIMEOUT_S,
    Progress,
    WaitRule,
    readiness_progress,
    registered_since,
    wait_progressing,
)
from ops.launcher.state import ClusterConfig, ProcessSpec, StateDir
from protocol import pb


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Mock time that jumps ahead whenever every task waits."""
    return trio.testing.MockClock(autojump_threshold=0)


def test_a_restarted_worker_is_back_once_its_log_has_a_registration_since_its_start(tmp_path: Path) -> None:
    """Only a register line written since the new process started counts: the predecessor's
    (the incarnation a restarted agent continues keeps its number) and a missing log do not."""
    log = tmp_path / "agent.jsonl"
    assert not registered_since(log, 100.0)
    lines = [
        {"event": "register", "time": 50.0, "incarnation": 3},
        {"event": "start", "time": 60.0, "incarnation": 3},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert not registered_since(log, 100.0)
    with log.open("a") as file:
        file.write(json.dumps({"event": "register", "time": 101.5, "incarnation": 3}) + "\n")
        file.write("{torn")
    assert registered_since(log, 100.0)


# ---------------------------------------------------------------------------- the wait rule


def progress(
    live: int, *, registered: int | None = None, answered: int = 3, leader: str = "cp-1"
) -> Progress:
    """A poll that saw ``live`` of 500 workers live, ``answered`` of 3 control planes."""
    return Progress(
        answered=tuple(f"cp-{n}" for n in range(1, answered + 1)),
        control_planes=3,
        leader=leader,
        registered=live if registered is None else registered,
        live=live,
        workers=500,
    )


def test_the_cap_grows_with_the_workers() -> None:
    """stockade up's rule: no progress for timeout_s, or timeout_s plus 1 s a worker in all."""
    rule = WaitRule.for_cluster(timeout_s=60.0, workers=500, now=10.0)
    assert (rule.stall_s, rule.cap_s, rule.deadline()) == (60.0, 560.0, 70.0)


def test_a_wait_goes_on_while_workers_keep_going_live() -> None:
    """Each poll with more workers live moves the stall deadline on; one with no more does
    not; after stall_s without progress the wait gives up, saying so."""
    rule = WaitRule(stall_s=5.0, cap_s=100.0, started_at=0.0)
    assert rule.observe(progress(10), 1.0) and rule.deadline() == 6.0
    assert rule.observe(progress(20), 4.0) and rule.deadline() == 9.0
    assert not rule.observe(progress(20), 8.0) and rule.why_give_up(8.9) is None
    assert rule.why_give_up(9.0) == "no progress for 5 s"


def test_a_count_that_falls_and_rises_back_is_not_progress() -> None:
    """Workers churning (live 30, 25, 30) hold no wait: only a new high counts."""
    rule = WaitRule(stall_s=5.0, cap_s=100.0, started_at=0.0)
    rule.observe(progress(30), 1.0)
    assert not rule.observe(progress(25), 2.0)
    assert not rule.observe(progress(30), 3.0)
    assert rule.observe(progress(31), 4.0) and rule.progress_at == 4.0


def test_any_count_rising_is_progress() -> None:
    """A control plane answering, a leader elected, a worker registered: each is progress."""
    rule = WaitRule(stall_s=5.0, cap_s=100.0, started_at=0.0)
    assert rule.observe(progress(0, answered=1, leader=""), 1.0)
    assert rule.observe(progress(0, answered=2, leader=""), 2.0)
    assert rule.observe(progress(0, answered=2), 3.0)
    assert rule.observe(progress(0, registered=7, answered=2), 4.0)
    assert not rule.observe(progress(0, registered=7, answered=1), 5.0)


def test_while_every_control_plane_answers_busy_the_wait_does_not_stall_but_the_cap_still_ends_it() -> None:
    """A registration storm: every replica sheds the status call ('busy') for 20 s, longer than
    stall_s: the wait goes on, saying they are busy; one replica silent (not busy) is a stall
    again; the cap ends the wait whatever they answer."""
    rule = WaitRule(stall_s=5.0, cap_s=30.0, started_at=0.0)
    assert rule.observe(progress(10), 1.0)
    all_busy = attrs.evolve(progress(0, answered=0, leader=""), busy=("cp-1", "cp-2", "cp-3"))
    assert "3 busy" in all_busy.line()
    for t in range(2, 22):
        assert not rule.observe(all_busy, float(t))
        assert rule.why_give_up(float(t)) is None
    two_busy = attrs.evolve(all_busy, busy=("cp-1", "cp-2"))
    assert not rule.observe(two_busy, 22.0)
    assert rule.why_give_up(26.0) == "no progress for 5 s"
    for t in range(22, 30):
        rule.observe(all_busy, float(t))
    assert rule.why_give_up(30.0) == "gave up 30 s after it began (the cap for this many workers)"


def test_the_cap_ends_a_wait_that_keeps_progressing() -> None:
    """Progress at every poll still ends at the cap, and the reason names it."""
    rule = WaitRule(stall_s=5.0, cap_s=12.0, started_at=0.0)
    for t in range(12):
        rule.observe(progress(t + 1), float(t))
    assert rule.deadline() == 12.0
    assert rule.why_give_up(12.0) == "gave up 12 s after it began (the cap for this many workers)"


@attrs.define
class ScriptedStatus:
    """A status source: each poll takes ``poll_s`` and sees the next of ``live``, then the last
    again; ready once ``ready_at`` workers are live."""

    live: list[int]
    ready_at: int = 500
    poll_s: float = 0.5
    polls: int = 0

    async def poll(self) -> tuple[pb.StatusReply | None, list[str], Progress]:
        await trio.sleep(self.poll_s)
        live = self.live[min(self.polls, len(self.live) - 1)]
        self.polls += 1
        missing = [] if live >= self.ready_at else [f"{self.ready_at - live} workers not live"]
        return pb.StatusReply(leader="cp-1"), missing, progress(live)


async def test_a_large_cluster_that_keeps_progressing_is_waited_for_past_the_stall_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """500 workers going live 25 per poll take 20 polls (about 14 s), far past a stall limit of
    3 s: the wait ends ready, and says how far it got on the way, at most every 2 s, and where it
    got in the end."""
    source = ScriptedStatus(live=list(range(25, 501, 25)))
    lines: list[str] = []
    rule = WaitRule.for_cluster(timeout_s=3.0, workers=500, now=trio.current_time())
    status, missing, why = await wait_progressing(source.poll, rule, on_progress=lines.append)
    assert (missing, why, status is not None) == ([], "", True)
    assert trio.current_time() > 3.0 * 4
    assert lines[0].endswith("workers live 25/500 (registered 25)")
    assert len(lines) < source.polls
    assert lines[0].startswith("control planes 3/3 answered (cp-1, cp-2, cp-3; leader cp-1)")
    assert lines[-1].endswith("workers live 500/500 (registered 500)")  # the end, not a poll before


async def test_a_cluster_that_stops_progressing_gives_up_saying_how_far_it_got(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Workers stop going live at 153: the wait gives up stall_s after the last progress, and
    its reason says so and how far it got."""
    source = ScriptedStatus(live=[50, 100, 153])
    rule = WaitRule.for_cluster(timeout_s=3.0, workers=500, now=trio.current_time())
    _, missing, why = await wait_progressing(source.poll, rule)
    assert missing == ["347 workers not live"]
    assert why.startswith("no progress for 3 s; got to: control planes 3/3 answered")
    assert why.endswith("workers live 153/500 (registered 153)")
    assert trio.current_time() == pytest.approx(1.5 + 3.0, abs=0.5)


async def test_a_poll_that_hangs_is_cut_at_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    """A status source that never answers: the wait ends at the stall deadline, saying no
    status call ended."""

    async def hang() -> tuple[pb.StatusReply | None, list[str], Progress]:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    rule = WaitRule(stall_s=4.0, cap_s=100.0, started_at=trio.current_time())
    status, missing, why = await wait_progressing(hang, rule)
    assert status is None and missing and why == "no progress for 4 s; got to: no status call ended"
    assert trio.current_time() == pytest.approx(4.0)


def test_a_status_call_too_slow_for_its_limit_is_asked_again_with_a_longer_one(tmp_path: Path) -> None:
    """A control plane that answers status 2.5 s late (a replica busy with a registration
    storm) misses the first call (a limit of 1 s: a read to one replica is given up after two
    limits); the next poll gives it twice as long, and it counts as answered; its limit is then
    back to 1 s."""

    async def slow_status(request: pb.StatusRequest) -> pb.StatusReply:
        await asyncio.sleep(2.5)
        return pb.StatusReply(leader="cp-1")

    with serve(ScriptedControlPlane(status=slow_status)) as (address,):
        config = ClusterConfig(
            database_url="postgresql://nowhere/db",
            embedded_pg_port=None,
            processes=[ProcessSpec(id="cp-1", kind="cp", address=address, args=("cp",))],
        )
        limits: dict[str, float] = {}

        async def two_polls(_client: object) -> list[Progress]:
            seen = []
            for _ in range(2):
                _, _, got = await readiness_progress(StateDir(tmp_path), config, {}, {}, limits=limits)
                seen.append(got)
            return seen

        first, second = rpc.with_client([address], two_polls)
    assert (first.answered, second.answered) == ((), ("cp-1",))
    assert limits == {"cp-1": STATUS_TIMEOUT_S}


def test_a_worker_counts_live_within_two_of_the_intervals_the_cluster_tells(tmp_path: Path) -> None:
    """500 workers beat every few seconds (the cluster stretches the interval as it grows): a
    worker last heard 6 s ago counts as live while the cluster tells a 5 s interval, and not
    while it tells 2 s (the fixed 2 s floor then rules)."""
    told_ms = [5000]

    async def status(request: pb.StatusRequest) -> pb.StatusReply:
        return pb.StatusReply(
            leader="cp-1",
            heartbeat_interval_ms=told_ms[0],
            workers=[pb.WorkerInfo(id="w-1", state="alive", incarnation=1, last_heartbeat_age_s=6.0)],
        )

    with serve(ScriptedControlPlane(status=status)) as (address,):
        config = ClusterConfig(
            database_url="postgresql://nowhere/db",
            embedded_pg_port=None,
            processes=[
                ProcessSpec(id="cp-1", kind="cp", address=address, args=("cp",)),
                ProcessSpec(id="w-1", kind="agent", address="127.0.0.1:1", args=("agent",)),
            ],
        )

        async def poll(_client: object) -> Progress:
            _, _, got = await readiness_progress(StateDir(tmp_path), config, {}, {})
            return got

        assert rpc.with_client([address], poll).live == 1
        told_ms[0] = 2000
        assert rpc.with_client([address], poll).live == 0
