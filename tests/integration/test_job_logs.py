"""ControlPlane.ReadJobLogs over real gRPC on 127.0.0.1, with a real PostgreSQL and a real agent
running real command jobs: a replica that does not hold the lease relays the worker's stream
(follow, tail, a finished job), says what is wrong in words (unknown job, sleep job, a job not
started, its worker left or unreachable), stops the worker's reader when its own caller goes
away; and over mutual TLS, viewers read logs through a control plane while no certificate but
a control plane's may call Worker.ReadLogs."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from prometheus_client import REGISTRY
from serving import HOLD_LEASE, serve_ingests

from actors import queries
from agent.core import Agent
from agent.main import run_agent
from ops import certs as certs_module
from protocol import pb
from protocol.bases import WorkerBase
from runtime.aio import GrpcChannel, PgConnection, StreamLimits
from runtime.client import ControlPlaneClient
from runtime.errors import (
    FailedPrecondition,
    InvalidArgument,
    NoControlPlaneReachable,
    NotFound,
    PeerUnavailable,
    PermissionDenied,
)
from runtime.settings.agent import (
    AgentSettings,
    OutputSettings,
)
from runtime.settings.control_plane import IngestSettings
from runtime.tls import WORKER, ClientTls, Expected, TlsFiles, server_context

EPOCH = 1
TIMEOUT_S = 10.0
SELECT_STATE = "SELECT state FROM jobs WHERE id = $1"


@attrs.define
class Cluster:
    cps: list[str]
    """The replicas' addresses: cp-1 (which the test's lease names) and cp-2."""
    agent: Agent
    admin: PgConnection
    tls: Callable[[str], TlsFiles] | None
    """Certificate files by id; None: plaintext."""
    _channels: list[GrpcChannel] = attrs.field(factory=list)

    def client(self, id: str = "operator", *, replica: int = 1) -> ControlPlaneClient:
        """A client of one replica (cp-2 by default: not the lease's holder)."""
        return ControlPlaneClient(
            [self.cps[replica]], timeout_s=TIMEOUT_S, tls=None if self.tls is None else self.tls(id)
        )

    async def submit(self, script: str | None) -> int:
        """A command job running ``python3 -c script`` (a sleep job for None)."""
        runtime: dict[str, Any] = (
            {"sleep": pb.SleepRuntime(duration_ms=60_000)}
            if script is None
            else {"command": pb.CommandRuntime(argv=[sys.executable, "-c", script])}
        )
        client = self.client()
        try:
            reply = await client.call(
                "submit_job",
                pb.SubmitJobRequest(spec=pb.JobSpec(name="t", cpu_millis=100, memory_mb=16, **runtime)),
            )
        finally:
            client.close()
        return int(reply.job_id)

    async def start(self, script: str) -> tuple[int, int]:
        """Submit a command job, place it on w-1 (as the leader of epoch 1 would) and send it
        there; returns its id and assignment id once a heartbeat listed it as running."""
        job_id = await self.submit(script)
        incarnation = self.agent.incarnation
        assert incarnation is not None
        rows = await self.admin.fetch(
            queries.COMMIT_PLACEMENTS, [job_id], ["w-1"], [incarnation], EPOCH, True, [], [], [], [], []
        )
        aid = int(rows[0]["assignment_id"])
        target = None if self.tls is None else ClientTls(self.tls("cp-1")).target(Expected(WORKER, "w-1"))
        channel = GrpcChannel(self.agent.address, tls=target)
        self._channels.append(channel)
        spec = pb.JobSpec(
            name="t",
            cpu_millis=100,
            memory_mb=16,
            command=pb.CommandRuntime(argv=[sys.executable, "-c", script]),
        )
        request = pb.AssignRequest(
            epoch=EPOCH,
            worker_id="w-1",
            incarnation=incarnation,
            assignments=[pb.Assignment(assignment_id=aid, job_id=job_id, spec=spec, committed_epoch=EPOCH)],
        )
        reply = await channel.call(channel.stub(pb.WorkerStub).assign, request, timeout_s=TIMEOUT_S)
        assert list(reply.accepted_ids) == [aid]
        with trio.fail_after(TIMEOUT_S):
            while not await self.admin.fetchval(  # noqa: ASYNC110 (the database's state, polled)
                "SELECT confirmed_at IS NOT NULL OR outcome IS NOT NULL FROM assignments WHERE id = $1", aid
            ):
                await trio.sleep(0.05)
        return job_id, aid

    async def finished(self, job_id: int) -> None:
        with trio.fail_after(TIMEOUT_S):
            while await self.admin.fetchval(SELECT_STATE, job_id) != "succeeded":  # noqa: ASYNC110 (polled)
                await trio.sleep(0.05)

    async def read(self, job_id: int, *, id: str = "operator", **fields: Any) -> list[pb.LogChunk]:
        client = self.client(id)
        try:
            async with client.stream(
                "read_job_logs", pb.ReadJobLogsRequest(job_id=job_id, **fields), StreamLimits(TIMEOUT_S)
            ) as chunks:
                return [chunk async for chunk in chunks]
        finally:
            client.close()

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@asynccontextmanager
async def cluster(database_url: str, tmp_path: Path, *, secure: bool = False) -> AsyncIterator[Cluster]:
    """Two ingest replicas (cp-1, cp-2), one agent w-1 heartbeating to them, and an admin
    connection holding the lease for cp-1 at epoch 1; mutual TLS with ``secure``."""
    folder = tmp_path / "certs"
    tls: Callable[[str], TlsFiles] | None = None
    if secure:
        certs_module.init_cluster(folder)
        tls = lambda id: TlsFiles.in_dir(folder, id)  # noqa: E731
    settings = IngestSettings(pool_size=3, liveness_reserved_connections=1)
    async with (
        serve_ingests(
            database_url,
            "cp-1",
            "cp-2",
            settings=settings,
            tls=None if tls is None else server_context(tls("cp-1")),
            worker_tls=None if tls is None else (lambda cp_id: ClientTls(tls(cp_id))),
        ) as ingests,
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
            output=OutputSettings(follow_poll_s=0.05),
            tls=None if tls is None else tls("w-1"),
        )
        agent: Agent = await nursery.start(run_agent, agent_settings)
        with trio.fail_after(TIMEOUT_S):
            await agent.wait_registered()
        c = Cluster(cps=[i.address for i in ingests], agent=agent, admin=admin, tls=tls)
        try:
            yield c
        finally:
            c.close()
            nursery.cancel_scope.cancel()
            await admin.close()


def data_of(chunks: list[pb.LogChunk]) -> bytes:
    return b"".join(c.data for c in chunks)


STEPS = "import time\nfor w in ('one', 'two', 'three'):\n    print(w, flush=True)\n    time.sleep(0.3)\n"


async def test_a_replica_that_does_not_lead_relays_a_running_jobs_output_until_it_ends(
    database_url: str, tmp_path: Path
) -> None:
    """Following a running job through cp-2: every line in order, chunks naming w-1 and the
    run, the last saying the job ended."""
    async with cluster(database_url, tmp_path) as c:
        job_id, aid = await c.start(STEPS)
        chunks = await c.read(job_id, follow=True)
    assert data_of(chunks) == b"one\ntwo\nthree\n"
    assert chunks[-1].job_ended
    assert {(ch.worker_id, ch.assignment_id) for ch in chunks} == {("w-1", aid)}


async def test_the_tail_of_a_finished_job_and_its_stderr(database_url: str, tmp_path: Path) -> None:
    """A finished job's last two lines of stdout, and its stderr, through a replica."""
    async with cluster(database_url, tmp_path) as c:
        job_id, _ = await c.start("import sys\nfor i in range(5): print(i)\nprint('oops', file=sys.stderr)")
        await c.finished(job_id)
        assert data_of(await c.read(job_id, has_tail=True, tail_lines=2)) == b"3\n4\n"
        assert data_of(await c.read(job_id, stream="stderr")) == b"oops\n"


async def test_a_run_named_by_its_assignment_is_read_from_an_offset(
    database_url: str, tmp_path: Path
) -> None:
    """A read naming the job's run and an offset gets that run's output from that byte, each
    chunk saying where it begins; a run the job does not have is FAILED_PRECONDITION."""
    async with cluster(database_url, tmp_path) as c:
        job_id, aid = await c.start("print('hello'); print('world')")
        await c.finished(job_id)
        chunks = await c.read(job_id, assignment_id=aid, has_offset=True, offset=6)
        assert data_of(chunks) == b"world\n" and chunks[0].offset == 6
        with pytest.raises(FailedPrecondition, match=f"job {job_id} has no run with assignment {aid + 100}"):
            await c.read(job_id, assignment_id=aid + 100)


async def test_an_unknown_job_is_not_found(database_url: str, tmp_path: Path) -> None:
    """Logs of a job that does not exist: NOT_FOUND naming it."""
    async with cluster(database_url, tmp_path) as c:
        with pytest.raises(NotFound, match="job_id 999 not found"):
            await c.read(999)


async def test_a_sleep_job_has_no_output(database_url: str, tmp_path: Path) -> None:
    """A sleep job writes nothing: INVALID_ARGUMENT saying so."""
    async with cluster(database_url, tmp_path) as c:
        job_id = await c.submit(None)
        with pytest.raises(InvalidArgument, match="a sleep job writes no output"):
            await c.read(job_id)


async def test_a_job_not_started_yet_says_its_state(database_url: str, tmp_path: Path) -> None:
    """A pending job's logs: FAILED_PRECONDITION saying it is pending."""
    async with cluster(database_url, tmp_path) as c:
        job_id = await c.submit("print(1)")
        with pytest.raises(FailedPrecondition, match=f"job {job_id} has not started yet: it is pending"):
            await c.read(job_id)


async def test_a_worker_that_cannot_be_reached_is_named_with_its_address(
    database_url: str, tmp_path: Path
) -> None:
    """The job's worker now registered at an address where nothing listens: every replica
    answers UNAVAILABLE naming the worker and that address."""
    async with cluster(database_url, tmp_path) as c:
        job_id, _ = await c.start("print('x')")
        await c.finished(job_id)
        with trio.socket.socket() as sock:
            await sock.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{sock.getsockname()[1]}"
        await c.admin.execute("UPDATE workers SET address = $1 WHERE id = 'w-1'", dead)
        with pytest.raises(NoControlPlaneReachable) as raised:
            await c.read(job_id)
    failure = raised.value.failures[0]
    assert isinstance(failure, PeerUnavailable)
    assert f"worker w-1 at {dead} is unreachable" in failure.detail


async def test_a_worker_that_left_is_named(database_url: str, tmp_path: Path) -> None:
    """The job's worker left the cluster: UNAVAILABLE naming it and saying so, at once."""
    async with cluster(database_url, tmp_path) as c:
        job_id, _ = await c.start("print('x')")
        await c.finished(job_id)
        await c.admin.execute("UPDATE workers SET state = 'left', left_at = now() WHERE id = 'w-1'")
        with pytest.raises(NoControlPlaneReachable) as raised:
            await c.read(job_id)
    failure = raised.value.failures[0]
    assert isinstance(failure, PeerUnavailable)
    assert "worker w-1 at 127.0.0.1:" in failure.detail and "left the cluster" in failure.detail


def gauge(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_a_caller_that_goes_away_stops_the_relay_and_the_workers_reader(
    database_url: str, tmp_path: Path
) -> None:
    """A follower of a quiet running job reads its first chunk through cp-2 and leaves: the
    replica stops relaying and the worker stops reading, while the job runs on."""
    async with cluster(database_url, tmp_path) as c:
        job_id, aid = await c.start("import time; print('hi', flush=True); time.sleep(60)")
        readers = {"worker_id": "w-1"}
        before = (gauge("stockade_cp_log_streams"), gauge("stockade_agent_log_readers", readers))
        client = c.client()
        try:
            async with client.stream(
                "read_job_logs", pb.ReadJobLogsRequest(job_id=job_id, follow=True), StreamLimits(TIMEOUT_S)
            ) as chunks:
                await anext(chunks)
                assert gauge("stockade_agent_log_readers", readers) == before[1] + 1
        finally:
            client.close()
        with trio.fail_after(5):
            while (gauge("stockade_cp_log_streams"), gauge("stockade_agent_log_readers", readers)) != before:  # noqa: ASYNC110
                await trio.sleep(0.02)
        done = c.agent.job_done(aid)
        assert done is not None and not done.is_set()


async def test_over_mutual_tls_a_viewer_reads_logs_through_a_control_plane(
    database_url: str, tmp_path: Path
) -> None:
    """With certificates everywhere: the viewer's certificate reads a job's output through
    cp-2, which calls the worker with its own control-plane certificate."""
    async with cluster(database_url, tmp_path, secure=True) as c:
        job_id, _ = await c.start("print('secret sauce')")
        await c.finished(job_id)
        assert data_of(await c.read(job_id, id="viewer")) == b"secret sauce\n"


@pytest.mark.parametrize("id", ["viewer", "operator", "w-2"])
async def test_over_mutual_tls_only_control_planes_may_call_worker_read_logs(
    database_url: str, tmp_path: Path, id: str
) -> None:
    """A viewer's, an operator's or another worker's certificate calling Worker.ReadLogs
    directly is refused (PERMISSION_DENIED naming the role it needs)."""
    async with cluster(database_url, tmp_path, secure=True) as c:
        job_id, aid = await c.start("print('secret sauce')")
        assert c.tls is not None
        channel = GrpcChannel(c.agent.address, tls=ClientTls(c.tls(id)).target(Expected(WORKER, "w-1")))
        try:
            request = pb.ReadLogsRequest(worker_id="w-1", job_id=job_id, assignment_id=aid)
            with pytest.raises(PermissionDenied, match="read_logs needs control-plane"):
                async with channel.stream(
                    WorkerBase, "read_logs", request, StreamLimits(TIMEOUT_S)
                ) as chunks:
                    await anext(chunks)
        finally:
            channel.close()
