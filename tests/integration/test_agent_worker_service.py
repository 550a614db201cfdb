"""The agent over real gRPC on 127.0.0.1: a fake ControlPlane service, real Assign/Cancel calls."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agent.core import Agent
from agent.main import run_agent
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, asyncio_bridge, serve_grpc, trio_service
from runtime.errors import InvalidArgument
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl
from runtime.validation import MAX_CANCEL_GRACE_MS

RPC_TIMEOUT_S = 5.0


@attrs.define
class FakeControlPlane:
    """Records registrations and heartbeats; answers with a scripted epoch."""

    epoch: int = 1
    incarnations: int = 0
    registrations: list[pb.RegisterWorkerRequest] = attrs.field(factory=list)
    heartbeats: list[pb.HeartbeatRequest] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.registrations.append(request)
        self.incarnations += 1
        self._touch()
        return pb.RegisterWorkerReply(incarnation=self.incarnations, epoch=self.epoch)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.heartbeats.append(request)
        self._touch()
        return pb.HeartbeatReply(epoch=self.epoch)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        with trio.fail_after(timeout_s):
            while not predicate():
                await self.changed.wait()

    def finished(self) -> dict[int, pb.JobOutcome]:
        return {o.assignment_id: o for hb in self.heartbeats for o in hb.finished}

    # The rest of the ControlPlane service is not used by the agent.
    async def submit_job(self, request: Any) -> Any:
        raise NotImplementedError

    get_job = list_jobs = cancel_job = status = submit_job


@attrs.frozen
class Harness:
    agent: Agent
    cp: FakeControlPlane
    channel: GrpcChannel
    work_dir: Path

    async def assign(
        self, *assignments: pb.Assignment, epoch: int = 1, incarnation: int | None = None
    ) -> pb.AssignReply:
        request = pb.AssignRequest(
            epoch=epoch,
            worker_id="w-1",
            incarnation=(self.agent.incarnation or 0) if incarnation is None else incarnation,
            assignments=list(assignments),
        )
        stub = self.channel.stub(pb.WorkerStub)
        reply: pb.AssignReply = await self.channel.call(stub.assign, request, timeout_s=RPC_TIMEOUT_S)
        return reply

    async def cancel(self, *ids: int, epoch: int = 1, grace_ms: int = 0) -> pb.CancelReply:
        request = pb.CancelRequest(
            epoch=epoch,
            worker_id="w-1",
            incarnation=self.agent.incarnation or 0,
            assignment_ids=list(ids),
            grace_ms=grace_ms,
        )
        stub = self.channel.stub(pb.WorkerStub)
        # A preemption is answered once its jobs ended: up to its grace after the call.
        timeout_s = RPC_TIMEOUT_S + grace_ms / 1000
        reply: pb.CancelReply = await self.channel.call(stub.cancel, request, timeout_s=timeout_s)
        return reply

    def log(self) -> list[dict[str, Any]]:
        return read_jsonl(self.work_dir / "agent.jsonl")


@asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Harness]:
    """A fake control plane and one agent, both on 127.0.0.1 free ports; torn down after."""
    cp = FakeControlPlane()
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        cp_port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, cp)], "127.0.0.1", 0)
        cps = (f"127.0.0.1:{cp_port}",)
        settings = AgentSettings(
            worker_id="w-1",
            control_planes=cps,
            cpu_millis=2000,
            memory_mb=2048,
            work_dir=str(tmp_path),
            heartbeat_interval_s=0.05,
            heartbeat_timeout_s=1.0,
            self_fence_after_s=3.0,
            stop_grace_s=1.0,
            labels={"zone": "test"},
        )
        agent: Agent = await nursery.start(run_agent, settings)
        channel = GrpcChannel(agent.address)
        try:
            with trio.fail_after(10):
                await agent.wait_registered()
            yield Harness(agent=agent, cp=cp, channel=channel, work_dir=tmp_path)
        finally:
            channel.close()
            nursery.cancel_scope.cancel()


def sleep_assignment(aid: int, duration_ms: int = 60_000) -> pb.Assignment:
    return pb.Assignment(
        assignment_id=aid,
        job_id=aid * 10,
        committed_epoch=1,
        spec=pb.JobSpec(
            name=f"sleep-{aid}", cpu_millis=500, memory_mb=100, sleep=pb.SleepRuntime(duration_ms=duration_ms)
        ),
    )


def command_assignment(aid: int, argv: list[str]) -> pb.Assignment:
    return pb.Assignment(
        assignment_id=aid,
        job_id=aid * 10,
        committed_epoch=1,
        spec=pb.JobSpec(
            name=f"cmd-{aid}", cpu_millis=500, memory_mb=100, command=pb.CommandRuntime(argv=argv)
        ),
    )


async def test_agent_registers_with_its_address_and_capacity(tmp_path: Path) -> None:
    """The agent registers its bound address, capacity and labels, then heartbeats."""
    async with cluster(tmp_path) as h:
        await h.cp.wait_for(lambda: len(h.cp.heartbeats) >= 2)
        registration = h.cp.registrations[0]
        assert registration.address == h.agent.address
        assert (registration.worker_id, registration.cpu_millis, registration.memory_mb) == (
            "w-1",
            2000,
            2048,
        )
        # The agent adds whether it runs container jobs (its engine answered a ping, or not),
        # and how it enforces command jobs' resources.
        labels = dict(registration.labels)
        assert labels.pop("container") in ("docker", "none")
        assert labels.pop("resources") in ("cgroup2", "cgroup1", "rlimit")
        assert labels == {"zone": "test"}
        assert h.cp.heartbeats[-1].incarnation == 1


async def test_sleep_job_runs_and_is_reported_finished(tmp_path: Path) -> None:
    """An assigned sleep job runs, and a heartbeat reports it succeeded."""
    async with cluster(tmp_path) as h:
        reply = await h.assign(sleep_assignment(1, duration_ms=200))
        assert list(reply.accepted_ids) == [1] and not reply.refused
        await h.cp.wait_for(lambda: any(1 in hb.running_assignment_ids for hb in h.cp.heartbeats))
        await h.cp.wait_for(lambda: 1 in h.cp.finished())
        outcome = h.cp.finished()[1]
        assert (outcome.state, outcome.job_id, outcome.has_exit_code, outcome.exit_code) == (
            "succeeded",
            10,
            True,
            0,
        )
        assert outcome.run_ms >= 200
    assert [(r["event"], r.get("reason")) for r in h.log() if r["assignment_id"] == 1] == [
        ("start", None),
        ("stop", "succeeded"),
    ]


async def test_command_job_records_exit_code_and_stdout(tmp_path: Path) -> None:
    """A command job's exit code 3 is reported failed and its stdout holds what it printed."""
    async with cluster(tmp_path) as h:
        reply = await h.assign(command_assignment(2, ["sh", "-c", "echo hi; exit 3"]))
        assert list(reply.accepted_ids) == [2]
        await h.cp.wait_for(lambda: 2 in h.cp.finished())
        outcome = h.cp.finished()[2]
    assert (outcome.state, outcome.has_exit_code, outcome.exit_code) == ("failed", True, 3)
    stdout = trio.Path(outcome.stdout_path)
    assert stdout.is_absolute()
    assert stdout.parent == await (trio.Path(tmp_path) / "jobs" / "20-2").resolve()
    assert await stdout.read_text() == "hi\n"
    stop = next(r for r in h.log() if r["event"] == "stop")
    assert (stop["reason"], stop["exit_code"]) == ("failed", 3)


async def test_duplicate_assign_is_acknowledged_and_started_once(tmp_path: Path) -> None:
    """Assigning the same id twice is acknowledged both times but the log shows one start."""
    async with cluster(tmp_path) as h:
        first = await h.assign(sleep_assignment(3))
        second = await h.assign(sleep_assignment(3))
        assert list(first.accepted_ids) == list(second.accepted_ids) == [3]
        assert h.agent.running_assignment_ids == (3,)
    starts = [r for r in h.log() if r["event"] == "start"]
    assert [r["assignment_id"] for r in starts] == [3]


async def test_integers_outside_their_type_are_refused_and_nothing_runs(tmp_path: Path) -> None:
    """An Assign whose cpu_millis is 2**32 + 500 (read as 500 before) or whose epoch is -1 (read
    as 2**64 - 1, past every real epoch), and a Cancel of id 2**63: INVALID_ARGUMENT naming the
    field and the value sent; nothing runs, and the agent's newest epoch is unchanged."""
    async with cluster(tmp_path) as h:
        huge = sleep_assignment(8)
        assert huge.spec is not None
        huge.spec.cpu_millis = 2**32 + 500
        with pytest.raises(InvalidArgument) as info:
            await h.assign(huge)
        assert str(info.value) == (
            "assignments[0].spec.cpu_millis must be between 0 and 4294967295 (uint32), got 4294967796"
        )
        with pytest.raises(InvalidArgument) as info:
            await h.assign(sleep_assignment(9), epoch=-1)
        assert str(info.value) == (
            "epoch must be between 0 and 9223372036854775807 (uint64), got 18446744073709551615 "
            "(-1 as a signed 64-bit integer)"
        )
        with pytest.raises(InvalidArgument) as info:
            await h.cancel(2**63)
        assert str(info.value).startswith(
            "assignment_ids[0] must be between 0 and 9223372036854775807 (uint64), got 9223372036854775808"
        )
        assert h.agent.running_assignment_ids == ()
        assert list((await h.assign(sleep_assignment(10))).accepted_ids) == [10]
    assert [r["assignment_id"] for r in h.log() if r["event"] == "start"] == [10]


async def test_stale_epoch_is_refused(tmp_path: Path) -> None:
    """After an Assign at epoch 5, an Assign at epoch 4 is refused as stale."""
    async with cluster(tmp_path) as h:
        assert list((await h.assign(sleep_assignment(4), epoch=5)).accepted_ids) == [4]
        stale = await h.assign(sleep_assignment(5), epoch=4)
        assert [(r.assignment_id, r.reason) for r in stale.refused] == [(5, "stale_epoch")]
        assert stale.epoch_seen == 5
        await h.cp.wait_for(lambda: any(hb.epoch_seen == 5 for hb in h.cp.heartbeats))


async def test_wrong_incarnation_is_refused(tmp_path: Path) -> None:
    """An Assign for another incarnation of this worker is refused."""
    async with cluster(tmp_path) as h:
        reply = await h.assign(sleep_assignment(6), incarnation=99)
        assert [(r.assignment_id, r.reason) for r in reply.refused] == [(6, "wrong_incarnation")]


async def test_cancel_stops_a_running_job_and_refuses_it_later(tmp_path: Path) -> None:
    """Cancel stops a running job before it answers; a later Assign of that id is refused."""
    async with cluster(tmp_path) as h:
        await h.assign(command_assignment(7, ["sleep", "30"]))
        cancel = await h.cancel(7)
        assert list(cancel.acknowledged_ids) == [7]
        assert h.agent.running_assignment_ids == ()
        stop = [r for r in h.log() if r["event"] == "stop"]
        assert [(r["assignment_id"], r["reason"]) for r in stop] == [(7, "cancelled")]
        again = await h.assign(command_assignment(7, ["sleep", "30"]))
        assert [(r.assignment_id, r.reason) for r in again.refused] == [(7, "cancelled")]
        await trio.sleep(0.2)
        assert 7 not in h.cp.finished()


async def test_cancel_before_assign_refuses_the_assign(tmp_path: Path) -> None:
    """A cancel for an id never seen is acknowledged and the late Assign is refused."""
    async with cluster(tmp_path) as h:
        assert list((await h.cancel(8)).acknowledged_ids) == [8]
        late = await h.assign(sleep_assignment(8))
        assert [(r.assignment_id, r.reason) for r in late.refused] == [(8, "cancelled")]
    assert not [r for r in h.log() if r["event"] == "start"]


async def test_shutdown_stops_running_command(tmp_path: Path) -> None:
    """Cancelling run_agent stops a running command and logs it with reason shutdown."""
    async with cluster(tmp_path) as h:
        await h.assign(command_assignment(9, ["sleep", "30"]))
        await h.cp.wait_for(lambda: any(9 in hb.running_assignment_ids for hb in h.cp.heartbeats))
    stop = [r for r in h.log() if r["event"] == "stop"]
    assert [(r["assignment_id"], r["reason"], r["exit_code"]) for r in stop] == [(9, "shutdown", -15)]


# A command that says on its stdout when it is up, and each SIGTERM it gets; ``on_term`` is what
# it does then besides (nothing: it runs on until it is killed).
TRAPPING_JOB = "trap 'echo term; {on_term}' TERM; echo up; while :; do sleep 0.05; done"


def stdout_lines(h: Harness, aid: int) -> list[str]:
    path = h.work_dir / "jobs" / f"{aid * 10}-{aid}" / "stdout.log"
    return path.read_text().split() if path.exists() else []


async def wait_for_line(h: Harness, aid: int, line: str, timeout_s: float = 10.0) -> None:
    """Poll the job's stdout (a file: nothing to wait on) until it holds ``line``."""
    with trio.fail_after(timeout_s):
        while True:
            if line in stdout_lines(h, aid):
                return
            await trio.sleep(0.02)


async def test_a_preempted_job_gets_sigterm_and_is_killed_after_its_grace(tmp_path: Path) -> None:
    """A Cancel with grace_ms stops a job that traps SIGTERM and runs on: it got SIGTERM first
    (it said so), was killed later (SIGKILL, exit -9), and is acknowledged, its stop line saying
    ``preempted`` with the grace; no outcome is reported."""
    async with cluster(tmp_path) as h:
        await h.assign(command_assignment(11, ["sh", "-c", TRAPPING_JOB.format(on_term=":")]))
        await wait_for_line(h, 11, "up")
        reply = await h.cancel(11, grace_ms=1500)
        assert (list(reply.acknowledged_ids), list(reply.finished_ids)) == ([11], [])
        assert stdout_lines(h, 11) == ["up", "term"]
        assert h.agent.running_assignment_ids == ()
        await trio.sleep(0.2)
        assert 11 not in h.cp.finished()
    stop = [r for r in h.log() if r["event"] == "stop"]
    assert [(r["assignment_id"], r["reason"], r["grace_ms"], r["exit_code"]) for r in stop] == [
        (11, "preempted", 1500, -9)
    ]


async def test_a_preempted_job_that_exits_on_sigterm_is_acknowledged_not_finished(tmp_path: Path) -> None:
    """A job that exits 0 on the preemption's SIGTERM is acknowledged (stopped by the Cancel),
    never reported finished or succeeded, and the Cancel is answered once it ended."""
    async with cluster(tmp_path) as h:
        await h.assign(command_assignment(12, ["sh", "-c", TRAPPING_JOB.format(on_term="exit 0")]))
        await wait_for_line(h, 12, "up")
        reply = await h.cancel(12, grace_ms=60_000)
        assert (list(reply.acknowledged_ids), list(reply.finished_ids)) == ([12], [])
        assert stdout_lines(h, 12) == ["up", "term"]
        assert h.agent.running_assignment_ids == ()
        await trio.sleep(0.2)
        assert 12 not in h.cp.finished()
    stop = [r for r in h.log() if r["event"] == "stop"]
    assert [(r["assignment_id"], r["reason"], r["grace_ms"], r["exit_code"]) for r in stop] == [
        (12, "preempted", 60_000, 0)
    ]


async def test_a_preemption_outlasts_the_workers_own_stop_grace(tmp_path: Path) -> None:
    """During a preemption's grace the job runs on past the worker's own ``stop_grace_s`` after
    its SIGTERM (it is not killed then), and ends when it chooses to: acknowledged, exit 0."""
    async with cluster(tmp_path) as h:
        go = tmp_path / "go"
        on_term = f"while [ ! -e {go} ]; do sleep 0.05; done; echo done; exit 0"
        await h.assign(command_assignment(13, ["sh", "-c", TRAPPING_JOB.format(on_term=on_term)]))
        await wait_for_line(h, 13, "up")
        async with trio.open_nursery() as nursery:
            replies: list[pb.CancelReply] = []

            async def preempt() -> None:
                replies.append(await h.cancel(13, grace_ms=60_000))

            nursery.start_soon(preempt)
            await wait_for_line(h, 13, "term")
            await trio.sleep(h.agent.settings.stop_grace_s + 0.5)  # past the worker's own grace
            assert h.agent.running_assignment_ids == (13,)
            assert not replies
            go.touch()
        assert (list(replies[0].acknowledged_ids), list(replies[0].finished_ids)) == ([13], [])
        assert stdout_lines(h, 13) == ["up", "term", "done"]
    stop = [r for r in h.log() if r["event"] == "stop"]
    assert [(r["assignment_id"], r["reason"], r["exit_code"]) for r in stop] == [(13, "preempted", 0)]


async def test_a_grace_over_the_limit_is_refused_and_stops_nothing(tmp_path: Path) -> None:
    """A Cancel whose grace_ms is over MAX_CANCEL_GRACE_MS: INVALID_ARGUMENT naming the field,
    the value and the limit; the job runs on, and the id is not remembered as cancelled (an
    Assign of it again is accepted)."""
    async with cluster(tmp_path) as h:
        await h.assign(command_assignment(14, ["sleep", "30"]))
        with pytest.raises(InvalidArgument) as info:
            await h.cancel(14, grace_ms=MAX_CANCEL_GRACE_MS + 1)
        assert str(info.value) == "grace_ms must be between 0 and 600000 ms (ten minutes), got 600001"
        assert h.agent.running_assignment_ids == (14,)
        again = await h.assign(command_assignment(14, ["sleep", "30"]))
        assert (list(again.accepted_ids), list(again.refused)) == ([14], [])
        assert not [r for r in h.log() if r["event"] == "stop"]


async def test_a_shutdown_during_a_preemption_stops_the_job_with_the_workers_own_grace(
    tmp_path: Path,
) -> None:
    """An agent shut down while a preemption's grace (ten minutes) runs, its Cancel call gone,
    does not wait the grace out: the job that ignores SIGTERM is killed after the worker's own
    stop grace, and its stop line still says ``preempted``."""
    with trio.fail_after(60):  # far less than the grace: the shutdown did not wait for it
        async with cluster(tmp_path) as h:
            await h.assign(command_assignment(15, ["sh", "-c", TRAPPING_JOB.format(on_term=":")]))
            await wait_for_line(h, 15, "up")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(h.cancel, 15, grace_ms=600_000))
                await wait_for_line(h, 15, "term")
                nursery.cancel_scope.cancel()  # the caller gives up: the job's stop goes on
            assert h.agent.running_assignment_ids == (15,)
    stop = [r for r in h.log() if r["event"] == "stop"]
    assert [(r["assignment_id"], r["reason"], r["grace_ms"], r["exit_code"]) for r in stop] == [
        (15, "preempted", 600_000, -9)
    ]
    assert stdout_lines(h, 15) == ["up", "term"]
