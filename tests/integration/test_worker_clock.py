"""A worker whose wall clock is ten minutes off, and stepped while its job runs, on a real
PostgreSQL through real gRPC: the job's times are the database's, in order with its submission,
its assignment and the assignment's end; its history reads in one order; and the times of the
worker's own log (what the checker reads) are on the database's clock too.

The agent runs in the test's process with ``time.time`` shifted (the process's wall clock, as a
machine without NTP has it); its command jobs' reapers are other processes, on the true clock,
as they are under libfaketime (they get a clean environment).
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from serving import HOLD_LEASE, serve_ingests

from actors import queries
from agent.core import Agent
from agent.main import run_agent
from ops.checker import runs_from_records
from protocol import pb
from runtime.aio import GrpcChannel, PgConnection
from runtime.client import ControlPlaneClient
from runtime.settings.agent import AgentSettings
from runtime.settings.control_plane import IngestSettings
from runtime.text import read_jsonl

EPOCH = 1
TIMEOUT_S = 20.0
RUN_S = 1.5
"""How long each job runs."""
OFF_S = 600.0


@attrs.define
class WallClock:
    """The test process's wall clock, ``offset_s`` from the true one (stepped by the test)."""

    offset_s: float
    true_time: Any = time.time
    true_time_ns: Any = time.time_ns

    def time(self) -> float:
        return float(self.true_time()) + self.offset_s

    def time_ns(self) -> int:
        return int(self.true_time_ns()) + int(self.offset_s * 1e9)


@attrs.define
class Cluster:
    cp: ControlPlaneClient
    agent: Agent
    admin: PgConnection
    work_dir: Path

    async def run(self, spec: pb.JobSpec) -> tuple[int, int]:
        """Submit ``spec``, place it on w-1 (as the leader of epoch 1 would) and send it there;
        its id and assignment id once a heartbeat listed it as running."""
        job_id = int((await self.cp.call("submit_job", pb.SubmitJobRequest(spec=spec))).job_id)
        incarnation = self.agent.incarnation
        assert incarnation is not None
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS, [job_id], ["w-1"], [incarnation], EPOCH, True, [], [], [], [], []
        )
        aid = int(rows[0]["assignment_id"])
        channel = GrpcChannel(self.agent.address)
        try:
            request = pb.AssignRequest(
                epoch=EPOCH,
                worker_id="w-1",
                incarnation=incarnation,
                assignments=[
                    pb.Assignment(assignment_id=aid, job_id=job_id, spec=spec, committed_epoch=EPOCH)
                ],
            )
            reply = await channel.call(channel.stub(pb.WorkerStub).assign, request, timeout_s=TIMEOUT_S)
        finally:
            channel.close()
        assert list(reply.accepted_ids) == [aid]
        with trio.fail_after(TIMEOUT_S):
            while not await self.admin.fetchval(  # noqa: ASYNC110 (the database's state, polled)
                "SELECT confirmed_at IS NOT NULL FROM assignments WHERE id = $1", aid
            ):
                await trio.sleep(0.05)
        return job_id, aid

    async def ended(self, job_id: int) -> str:
        query = "SELECT state FROM jobs WHERE id = $1"
        with trio.fail_after(TIMEOUT_S):
            while (state := await self.admin.fetchval(query, job_id)) not in ("succeeded", "failed"):  # noqa: ASYNC110 (polled)
                await trio.sleep(0.05)
        return str(state)

    async def times(self, aid: int) -> dict[str, float]:
        """Unix s, database time: the job's ``submitted``, ``started``, ``finished``; its
        assignment's ``created``, ``confirmed``, ``ended``."""
        row = await self.admin.fetchrow(
            "SELECT extract(epoch FROM j.submitted_at)::float8 AS submitted,"
            " extract(epoch FROM j.started_at)::float8 AS started,"
            " extract(epoch FROM j.finished_at)::float8 AS finished,"
            " extract(epoch FROM a.created_at)::float8 AS created,"
            " extract(epoch FROM a.confirmed_at)::float8 AS confirmed,"
            " extract(epoch FROM a.ended_at)::float8 AS ended"
            " FROM assignments a JOIN jobs j ON j.id = a.job_id WHERE a.id = $1",
            aid,
        )
        assert row is not None
        return dict(row)


@asynccontextmanager
async def cluster(
    database_url: str, tmp_path: Path, wall: WallClock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cluster]:
    """One ingest replica, an agent w-1 whose process's wall clock is ``wall``, and an admin
    connection holding the lease for cp-1 at epoch 1."""
    monkeypatch.setattr(time, "time", wall.time)
    monkeypatch.setattr(time, "time_ns", wall.time_ns)
    settings = IngestSettings(pool_size=3, liveness_reserved_connections=1)
    async with (
        serve_ingests(database_url, "cp-1", settings=settings) as ingests,
        trio.open_nursery() as nursery,
    ):
        admin = await PgConnection.connect(database_url)
        await admin.execute(HOLD_LEASE, EPOCH)
        agent_settings = AgentSettings(
            worker_id="w-1",
            control_planes=tuple(i.address for i in ingests),
            cpu_millis=4000,
            memory_mb=4096,
            work_dir=str(tmp_path / "w-1"),
            heartbeat_interval_s=0.1,
            heartbeat_timeout_s=1.0,
            labels={"container": "none"},
        )
        agent: Agent = await nursery.start(run_agent, agent_settings)
        cp = ControlPlaneClient([i.address for i in ingests], timeout_s=TIMEOUT_S)
        try:
            with trio.fail_after(TIMEOUT_S):
                await agent.wait_registered()
            yield Cluster(cp=cp, agent=agent, admin=admin, work_dir=tmp_path / "w-1")
        finally:
            cp.close()
            nursery.cancel_scope.cancel()
            await admin.close()


SPECS = {
    "sleep": pb.JobSpec(
        name="s", cpu_millis=100, memory_mb=16, sleep=pb.SleepRuntime(duration_ms=int(RUN_S * 1000))
    ),
    "command": pb.JobSpec(
        name="c",
        cpu_millis=100,
        memory_mb=16,
        command=pb.CommandRuntime(argv=[sys.executable, "-c", f"import time; time.sleep({RUN_S})"]),
    ),
}


@pytest.mark.parametrize("runtime", sorted(SPECS))
@pytest.mark.parametrize(("first_s", "then_s"), [(OFF_S, -OFF_S), (-OFF_S, OFF_S)])
async def test_a_job_on_a_worker_whose_clock_is_off_and_stepped_reads_in_database_time(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime: str,
    first_s: float,
    then_s: float,
) -> None:
    """A job whose worker's wall clock is ten minutes off, then stepped twenty minutes the other
    way while it runs, starts no earlier than it was submitted and placed, finishes no earlier
    than it started (at least its run's length later) and no later than its assignment ended;
    its history is in one order, ending with its final event; and the worker's log, as the
    checker reads it, has its run within its assignment."""
    wall = WallClock(offset_s=first_s)
    async with cluster(database_url, tmp_path, wall, monkeypatch) as c:
        job_id, aid = await c.run(SPECS[runtime])
        await trio.sleep(RUN_S / 3)
        wall.offset_s = then_s  # the clock is stepped while the job runs
        assert await c.ended(job_id) == "succeeded"
        t = await c.times(aid)
        history: pb.GetJobEventsReply = await c.cp.call(
            "get_job_events", pb.GetJobEventsRequest(job_id=job_id)
        )
    assert t["submitted"] <= t["created"] <= t["started"] <= t["finished"] <= t["ended"]
    assert t["finished"] - t["started"] >= RUN_S - 1e-3  # its run's length (a float's error aside)
    kinds = [e.kind for e in history.events]
    assert kinds == ["submitted", "placed", "confirmed", "ended", "final"]
    at = [e.at_unix_s for e in history.events]
    assert at == sorted(at)
    (run,) = runs_from_records(read_jsonl(c.work_dir / "agent.jsonl"))
    assert (run.job_id, run.assignment_id, run.stop_reason) == (job_id, aid, "succeeded")
    assert t["created"] <= run.started_at <= run.ended_at <= t["ended"]
