"""Mutual TLS over real gRPC on 127.0.0.1, with a real PostgreSQL behind the control plane:
every missing, foreign, expired or misused certificate, every peer that does not speak TLS and
every handshake that stalls gets a clear refusal and leaves nothing behind (no row stored, no
job run, no connection held)."""

from __future__ import annotations

import datetime
import os
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import structlog.testing
import trio
from serving import mtls_control_plane
from typer.testing import CliRunner

from actors.dispatcher import GrpcWorkerCalls
from agent.core import Agent
from agent.main import run_agent
from agent.messages import (
    HeartbeatAnswer,
    HeartbeatReport,
    Leave,
    LeaveAnswer,
    Registered,
    Registration,
)
from ops import certs as certs_module
from ops.cli import app
from ops.config import CERTS_DIR_ENV, CONFIG_ENV, IDENTITY_ENV, INSECURE_ENV, STATE_DIR_ENV
from protocol import pb
from protocol.bases import ControlPlaneBase, WorkerBase
from runtime.aio import GrpcChannel, PgConnection, asyncio_bridge, serve_grpc, trio_service
from runtime.aio.grpc_server import MAX_REQUEST_BYTES
from runtime.errors import HandshakeRefused, InvalidArgument, NotFound, PermissionDenied, Unavailable
from runtime.idempotency_keys import with_idempotency_key
from runtime.metrics import AUTH_REFUSALS
from runtime.settings.agent import AgentSettings
from runtime.text import read_jsonl
from runtime.tls import (
    ANY_CONTROL_PLANE,
    WORKER,
    ClientTls,
    Expected,
    TlsFiles,
    TlsTarget,
    expected_server_name,
    server_context,
)

CALL_TIMEOUT_S = 5.0
HANG_GUARD_S = 10.0
"""Bounds a wait that must end by itself, so a broken server fails the test instead of hanging
it; never a measured time."""

COUNT_JOBS = "SELECT count(*) FROM jobs"
WORKER_IDS = "SELECT id FROM workers ORDER BY id"


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """A cluster CA and the certificates ``stockade certs init`` issues (cp-1, w-1, operator,
    viewer...)."""
    folder = tmp_path / "certs"
    certs_module.init_cluster(folder)
    return folder


@pytest.fixture
def other_certs(tmp_path: Path) -> Path:
    """Another cluster's CA and certificates, with the same ids."""
    folder = tmp_path / "other-certs"
    certs_module.init_cluster(folder)
    return folder


def client_tls(certs: Path, id: str, expected: Expected | None = None) -> TlsTarget:
    """How ``id``'s certificate in ``certs`` reaches a server that must be ``expected`` (any
    control plane when None)."""
    tls = ClientTls(TlsFiles.in_dir(certs, id))
    return tls.target() if expected is None else tls.target(expected)


def refusals(rpc: str = "-", reason: str = "tls_handshake") -> float:
    """``stockade_auth_refusals_total{rpc, reason}`` now."""
    value: float = AUTH_REFUSALS.labels(rpc=rpc, reason=reason)._value.get()
    return value


def sleep_job() -> pb.SubmitJobRequest:
    spec = pb.JobSpec(name="j", cpu_millis=500, memory_mb=256, sleep=pb.SleepRuntime(duration_ms=1000))
    return with_idempotency_key(pb.SubmitJobRequest(spec=spec))


def registration(worker_id: str) -> pb.RegisterWorkerRequest:
    return with_idempotency_key(
        pb.RegisterWorkerRequest(worker_id=worker_id, address="127.0.0.1:9", cpu_millis=4000, memory_mb=8192)
    )


async def call_cp(address: str, tls: TlsTarget | None, rpc: str, request: Any) -> Any:
    """One ControlPlane call on a channel of its own, closed after."""
    channel = GrpcChannel(address, tls=tls)
    try:
        return await channel.call(
            getattr(channel.stub(pb.ControlPlaneStub), rpc), request, timeout_s=CALL_TIMEOUT_S
        )
    finally:
        channel.close()


async def fetch(database_url: str, query: str) -> list[Any]:
    """The first column of every row ``query`` returns."""
    conn = await PgConnection.connect(database_url)
    try:
        return [row[0] for row in await conn.fetch(query)]
    finally:
        await conn.close()


class StatusOnly:
    """A ControlPlane service that answers ``status`` only, for tests about the handshake."""

    async def status(self, request: pb.StatusRequest) -> pb.StatusReply:
        return pb.StatusReply(leader="cp-1")

    async def list_jobs(self, request: pb.ListJobsRequest) -> pb.ListJobsReply:
        return pb.ListJobsReply()


@asynccontextmanager
async def status_server(
    tls: ssl.SSLContext | None,
    *,
    handshake_timeout_s: float = 5.0,
    access: dict[str, tuple[str, ...]] | None = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> AsyncIterator[int]:
    """:class:`StatusOnly` served on 127.0.0.1 with ``tls`` (None: plaintext); yields the port."""
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        service = trio_service(
            ControlPlaneBase, StatusOnly(), access=access, max_request_bytes=max_request_bytes
        )
        serve = partial(
            serve_grpc,
            [service],
            "127.0.0.1",
            0,
            tls=tls,
            handshake_timeout_s=handshake_timeout_s,
        )
        yield await nursery.start(serve)
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------- the client's certificate


def handshake_refusals_logged(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [e["reason"] for e in logs if e["event"] == "refused a TLS handshake"]


async def test_a_client_without_a_certificate_is_refused_and_nothing_is_stored(
    database_url: str, certs: Path
) -> None:
    """A client that trusts the CA but presents no certificate cannot submit: the server
    refuses the handshake (logged and counted as tls_handshake), and no job is stored."""
    no_cert = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    no_cert.check_hostname = False
    no_cert.load_verify_locations(cafile=str(certs / "ca.crt"))
    no_cert.set_alpn_protocols(["h2"])
    async with mtls_control_plane(database_url, certs) as address:
        before = refusals()
        with structlog.testing.capture_logs() as logs, pytest.raises(Unavailable) as raised:
            await call_cp(
                address,
                TlsTarget(no_cert, expected_server_name(ANY_CONTROL_PLANE)),
                "submit_job",
                sleep_job(),
            )
        assert await fetch(database_url, COUNT_JOBS) == [0]
    assert "refused this client's certificate" in str(raised.value)
    assert refusals() == before + 1
    assert handshake_refusals_logged(logs) == ["peer did not return a certificate"]


async def test_a_certificate_from_another_ca_is_refused_and_nothing_is_stored(
    database_url: str, certs: Path, other_certs: Path
) -> None:
    """A client that trusts the right CA but presents another CA's operator certificate cannot
    submit: the server refuses the handshake as an unknown CA, and no job is stored."""
    foreign = ClientTls(
        TlsFiles(
            ca_path=certs / "ca.crt",
            cert_path=other_certs / "operator.crt",
            key_path=other_certs / "operator.key",
        )
    ).target()
    async with mtls_control_plane(database_url, certs) as address:
        before = refusals()
        with structlog.testing.capture_logs() as logs, pytest.raises(Unavailable):
            await call_cp(address, foreign, "submit_job", sleep_job())
        assert await fetch(database_url, COUNT_JOBS) == [0]
    assert refusals() == before + 1
    [reason] = handshake_refusals_logged(logs)
    assert "unable to get local issuer certificate" in reason


async def test_an_expired_certificate_is_refused_and_nothing_is_stored(
    database_url: str, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator certificate from the right CA whose validity ended cannot submit: the
    server refuses the handshake saying it expired, and no job is stored."""
    long_ago = certs_module._now() - datetime.timedelta(days=400)
    monkeypatch.setattr(certs_module, "_now", lambda: long_ago)
    expired = certs_module.issue(certs, role="operator", id="old-operator")
    assert expired.not_valid_after < datetime.datetime.now(datetime.UTC)
    async with mtls_control_plane(database_url, certs) as address:
        before = refusals()
        with structlog.testing.capture_logs() as logs, pytest.raises(Unavailable):
            await call_cp(address, client_tls(certs, "old-operator"), "submit_job", sleep_job())
        assert await fetch(database_url, COUNT_JOBS) == [0]
    assert refusals() == before + 1
    assert handshake_refusals_logged(logs) == ["certificate has expired"]


async def test_a_client_refuses_a_server_whose_certificate_is_from_another_ca(
    certs: Path, other_certs: Path
) -> None:
    """A client refuses a control plane whose certificate another CA signed, and says why."""
    async with status_server(server_context(TlsFiles.in_dir(other_certs, "cp-1"))) as port:
        with pytest.raises(HandshakeRefused) as raised:
            await call_cp(f"127.0.0.1:{port}", client_tls(certs, "operator"), "status", pb.StatusRequest())
    assert str(raised.value) == (
        f"127.0.0.1:{port}: the server's certificate was refused: "
        "self-signed certificate in certificate chain"
    )


# ---------------------------------------------------------------------------- roles and ids


async def test_a_worker_may_register_and_heartbeat_only_as_itself(database_url: str, certs: Path) -> None:
    """w-1's certificate registering, then heartbeating, as w-2 is refused naming both ids
    (counted with reason "id", logged with the peer), and no row for w-2 exists; registering
    as w-1 works."""
    w1 = client_tls(certs, "w-1")
    async with mtls_control_plane(database_url, certs) as address:
        before = refusals("register_worker", "id"), refusals("heartbeat", "id")
        with structlog.testing.capture_logs() as logs:
            with pytest.raises(PermissionDenied) as registering:
                await call_cp(address, w1, "register_worker", registration("w-2"))
            with pytest.raises(PermissionDenied) as beating:
                await call_cp(address, w1, "heartbeat", pb.HeartbeatRequest(worker_id="w-2", incarnation=1))
        assert (refusals("register_worker", "id"), refusals("heartbeat", "id")) == (
            before[0] + 1,
            before[1] + 1,
        )
        assert await fetch(database_url, WORKER_IDS) == []
        registered = await call_cp(address, w1, "register_worker", registration("w-1"))
        assert registered.incarnation >= 1
        assert await fetch(database_url, WORKER_IDS) == ["w-1"]
    assert str(registering.value) == (
        f"{address}: permission denied: worker/w-1 may register_worker only as worker_id 'w-1', not as 'w-2'"
    )
    assert "worker/w-1 may heartbeat only as worker_id 'w-1', not as 'w-2'" in str(beating.value)
    refused = [e for e in logs if e["event"] == "refused a call"]
    assert [(e["rpc"], e["reason"], e["peer"]) for e in refused] == [
        ("register_worker", "id", "worker/w-1"),
        ("heartbeat", "id", "worker/w-1"),
    ]
    assert all(e["address"].startswith("127.0.0.1:") for e in refused)


async def test_a_fleet_certificate_speaks_for_the_workers_it_names_only(
    database_url: str, certs: Path
) -> None:
    """fleet-1's certificate, naming w-1 and w-2, registers and heartbeats as each of them over
    one connection; as w-3 (or as fleet-1 itself) it is refused naming the id (counted with
    reason "id", logged with the peer), and no row for w-3 exists."""
    certs_module.issue(certs, role="worker", id="fleet-1", workers=["w-1", "w-2"])
    fleet = client_tls(certs, "fleet-1")
    async with mtls_control_plane(database_url, certs) as address:
        channel = GrpcChannel(address, tls=fleet)
        stub = channel.stub(pb.ControlPlaneStub)
        try:
            incarnations = {}
            for worker_id in ("w-1", "w-2"):
                registered = await channel.call(
                    stub.register_worker, registration(worker_id), timeout_s=CALL_TIMEOUT_S
                )
                incarnations[worker_id] = registered.incarnation
                await channel.call(
                    stub.heartbeat,
                    pb.HeartbeatRequest(worker_id=worker_id, incarnation=registered.incarnation),
                    timeout_s=CALL_TIMEOUT_S,
                )
            before = refusals("register_worker", "id"), refusals("heartbeat", "id")
            with structlog.testing.capture_logs() as logs:
                refused = []
                for worker_id in ("w-3", "fleet-1"):
                    with pytest.raises(PermissionDenied) as registering:
                        await channel.call(
                            stub.register_worker, registration(worker_id), timeout_s=CALL_TIMEOUT_S
                        )
                    refused.append(str(registering.value))
                with pytest.raises(PermissionDenied) as beating:
                    await channel.call(
                        stub.heartbeat,
                        pb.HeartbeatRequest(worker_id="w-3", incarnation=1),
                        timeout_s=CALL_TIMEOUT_S,
                    )
        finally:
            channel.close()
        assert (refusals("register_worker", "id"), refusals("heartbeat", "id")) == (
            before[0] + 2,
            before[1] + 1,
        )
        assert await fetch(database_url, WORKER_IDS) == ["w-1", "w-2"]
    assert all(i >= 1 for i in incarnations.values())
    fleet_name = "worker/fleet-1 (a fleet certificate for 2 workers)"
    assert refused == [
        f"{address}: permission denied: {fleet_name} may register_worker only as one of the workers "
        f"it names, not as {worker_id!r}"
        for worker_id in ("w-3", "fleet-1")
    ]
    assert f"{fleet_name} may heartbeat only as one of the workers it names, not as 'w-3'" in str(
        beating.value
    )
    assert [(e["rpc"], e["reason"], e["peer"]) for e in logs if e["event"] == "refused a call"] == [
        ("register_worker", "id", fleet_name),
        ("register_worker", "id", fleet_name),
        ("heartbeat", "id", fleet_name),
    ]


async def test_a_fleet_certificate_does_not_pass_for_a_workers_server(tmp_path: Path, certs: Path) -> None:
    """A Worker endpoint presenting a fleet certificate that names w-1 is refused by the
    dispatcher as w-1's server: a fleet certificate is for client auth only (and no expectation
    admits a fleet identity either, test_tls)."""
    certs_module.issue(certs, role="worker", id="fleet-1", workers=["w-1", "w-2"])
    calls = GrpcWorkerCalls(tls=ClientTls(TlsFiles.in_dir(certs, "cp-1")))
    try:
        async with asyncio_bridge(), trio.open_nursery() as nursery:
            service = trio_service(WorkerBase, object())
            port = await nursery.start(
                partial(
                    serve_grpc,
                    [service],
                    "127.0.0.1",
                    0,
                    tls=server_context(TlsFiles.in_dir(certs, "fleet-1")),
                )
            )
            with pytest.raises(HandshakeRefused) as raised:
                await calls.assign(f"127.0.0.1:{port}", assign_request("w-1"), CALL_TIMEOUT_S)
            nursery.cancel_scope.cancel()
    finally:
        calls.close()
    assert str(raised.value).endswith("the server's certificate was refused: unsuitable certificate purpose")


async def test_a_viewer_may_read_but_not_submit(database_url: str, certs: Path) -> None:
    """A viewer's submission is refused (PermissionDenied naming the role it needs, counted
    with reason "role") and no job is stored; the same viewer may read status and the job list."""
    viewer = client_tls(certs, "viewer")
    async with mtls_control_plane(database_url, certs) as address:
        before = refusals("submit_job", "role")
        with pytest.raises(PermissionDenied) as raised:
            await call_cp(address, viewer, "submit_job", sleep_job())
        assert refusals("submit_job", "role") == before + 1
        status = await call_cp(address, viewer, "status", pb.StatusRequest())
        listed = await call_cp(address, viewer, "list_jobs", pb.ListJobsRequest())
        with pytest.raises(NotFound, match="job_id 5 not found"):
            await call_cp(address, viewer, "get_job_events", pb.GetJobEventsRequest(job_id=5))
        assert await fetch(database_url, COUNT_JOBS) == [0]
    assert "submit_job needs operator or user; the caller is viewer/viewer at 127.0.0.1:" in str(raised.value)
    assert [cp.id for cp in status.control_planes] == ["cp-1"]
    assert list(listed.jobs) == []


SECRET = "s3cret-t0ken-value"


def env_of(info: pb.JobInfo) -> dict[str, str]:
    return dict(info.spec.env)


async def test_a_viewer_reads_a_jobs_environment_names_and_an_operator_its_values(
    database_url: str, certs: Path
) -> None:
    """A job submitted with environment values: GetJob, ListJobs and Status's unschedulable jobs
    give a viewer each name with the value "<hidden>", and an operator the values; the secret
    value is in no log line of the control plane."""
    operator, viewer = client_tls(certs, "operator"), client_tls(certs, "viewer")
    spec = pb.JobSpec(
        name="j",
        cpu_millis=500,
        memory_mb=256,
        sleep=pb.SleepRuntime(duration_ms=1000),
        env={"TOKEN": SECRET, "MODE": "fast"},
    )
    with structlog.testing.capture_logs() as logs:
        async with mtls_control_plane(database_url, certs) as address:
            submitted = await call_cp(
                address, operator, "submit_job", with_idempotency_key(pb.SubmitJobRequest(spec=spec))
            )
            conn = await PgConnection.connect(database_url)
            try:  # as the placer marks a job no worker can take
                await conn.execute(
                    "UPDATE jobs SET reason = 'unschedulable: no worker' WHERE id = $1", submitted.job_id
                )
            finally:
                await conn.close()
            seen = {}
            for who, tls in (("viewer", viewer), ("operator", operator)):
                job = await call_cp(address, tls, "get_job", pb.GetJobRequest(job_id=submitted.job_id))
                listed = await call_cp(address, tls, "list_jobs", pb.ListJobsRequest())
                status = await call_cp(address, tls, "status", pb.StatusRequest())
                seen[who] = [env_of(job), *map(env_of, listed.jobs), *map(env_of, status.unschedulable)]
    assert seen == {
        "viewer": [{"MODE": "<hidden>", "TOKEN": "<hidden>"}] * 3,
        "operator": [{"MODE": "fast", "TOKEN": SECRET}] * 3,
    }
    assert logs and not [line for line in logs if SECRET in repr(line)]


# ---------------------------------------------------------------------------- the agent's Worker service


class AnsweringControlPlane:
    """The agent's control plane, in process: every registration is incarnation 1 at epoch 1,
    every heartbeat is acknowledged."""

    async def register(self, request: Registration, *, deadline_s: float) -> Registered:
        return Registered(incarnation=1, epoch=1)

    async def heartbeat(self, request: HeartbeatReport, *, deadline_s: float) -> HeartbeatAnswer:
        return HeartbeatAnswer(epoch=1)

    async def leave(self, request: Leave, *, deadline_s: float) -> LeaveAnswer:
        return LeaveAnswer(left=True, epoch=1)


@asynccontextmanager
async def agent_w1(tmp_path: Path, certs: Path) -> AsyncIterator[Agent]:
    """The agent of w-1 serving its Worker service over mutual TLS with w-1's certificate,
    registered (incarnation 1, epoch 1); stopped on leaving."""
    settings = AgentSettings(
        worker_id="w-1",
        control_planes=("127.0.0.1:1",),  # unused: the control plane is in process
        cpu_millis=2000,
        memory_mb=2048,
        work_dir=str(tmp_path / "w-1"),
        heartbeat_interval_s=0.05,
        heartbeat_timeout_s=1.0,
        self_fence_after_s=3.0,
        stop_grace_s=1.0,
        tls=TlsFiles.in_dir(certs, "w-1"),
    )
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        agent: Agent = await nursery.start(
            partial(run_agent, settings, control_plane=AnsweringControlPlane())
        )
        with trio.fail_after(HANG_GUARD_S):
            await agent.wait_registered()
        yield agent
        nursery.cancel_scope.cancel()


def assign_request(worker_id: str = "w-1") -> pb.AssignRequest:
    sleep = pb.Assignment(
        assignment_id=1,
        job_id=10,
        committed_epoch=1,
        spec=pb.JobSpec(name="s", cpu_millis=500, memory_mb=100, sleep=pb.SleepRuntime(duration_ms=60_000)),
    )
    return pb.AssignRequest(epoch=1, worker_id=worker_id, incarnation=1, assignments=[sleep])


async def assign(address: str, tls: TlsTarget) -> pb.AssignReply:
    channel = GrpcChannel(address, tls=tls)
    try:
        reply: pb.AssignReply = await channel.call(
            channel.stub(pb.WorkerStub).assign, assign_request(), timeout_s=CALL_TIMEOUT_S
        )
        return reply
    finally:
        channel.close()


def started_jobs(agent: Agent) -> list[dict[str, Any]]:
    path = agent.work_dir / "agent.jsonl"
    return [r for r in read_jsonl(path) if r["event"] == "start"] if path.exists() else []


@pytest.mark.parametrize("caller", ["w-2", "operator"])
async def test_only_a_control_plane_certificate_may_assign_work(
    tmp_path: Path, certs: Path, caller: str
) -> None:
    """Another worker's or an operator's certificate calling Assign on w-1's agent is refused
    (PermissionDenied naming the role it needs, counted with reason "role"), and the agent runs
    nothing."""
    async with agent_w1(tmp_path, certs) as agent:
        before = refusals("assign", "role")
        with pytest.raises(PermissionDenied) as raised:
            await assign(agent.address, client_tls(certs, caller, Expected(WORKER, "w-1")))
        assert refusals("assign", "role") == before + 1
        assert agent.running_assignment_ids == ()
    role = "worker" if caller.startswith("w-") else "operator"
    assert f"assign needs control-plane; the caller is {role}/{caller} at 127.0.0.1:" in str(raised.value)
    assert started_jobs(agent) == []


async def test_a_control_plane_certificate_may_assign_work(tmp_path: Path, certs: Path) -> None:
    """cp-1's certificate calling Assign on w-1's agent is accepted (what the refusals above
    refuse is the certificate, not the request)."""
    async with agent_w1(tmp_path, certs) as agent:
        reply = await assign(agent.address, client_tls(certs, "cp-1", Expected(WORKER, "w-1")))
        assert list(reply.accepted_ids) == [1]
        assert agent.running_assignment_ids == (1,)


async def test_the_dispatcher_refuses_a_worker_whose_certificate_names_another_id(
    tmp_path: Path, certs: Path
) -> None:
    """An assignment for w-2 sent to an address where w-1's certificate answers never leaves
    the dispatcher: HandshakeRefused naming both identities, and the agent runs nothing."""
    calls = GrpcWorkerCalls(tls=ClientTls(TlsFiles.in_dir(certs, "cp-1")))
    try:
        async with agent_w1(tmp_path, certs) as agent:
            with pytest.raises(HandshakeRefused) as raised:
                await calls.assign(agent.address, assign_request("w-2"), CALL_TIMEOUT_S)
            assert agent.running_assignment_ids == ()
    finally:
        calls.close()
    assert str(raised.value) == (
        f"{agent.address}: the server's certificate is for worker/w-1, not for worker/w-2"
    )
    assert started_jobs(agent) == []


# ---------------------------------------------------------------------------- TLS on one side only


async def test_a_plaintext_client_is_told_the_server_may_need_certificates(certs: Path) -> None:
    """A client without TLS calling a TLS port fails as unavailable, with a hint about
    certificates; the server counts a refused handshake."""
    async with status_server(server_context(TlsFiles.in_dir(certs, "cp-1"))) as port:
        before = refusals()
        with structlog.testing.capture_logs() as logs, pytest.raises(Unavailable) as raised:
            await call_cp(f"127.0.0.1:{port}", None, "status", pb.StatusRequest())
        assert refusals() == before + 1
    assert not isinstance(raised.value, HandshakeRefused)
    assert str(raised.value).endswith(
        "(if the server uses TLS, this client needs its certificates instead of --insecure)"
    )
    assert handshake_refusals_logged(logs) == ["wrong version number"]


async def test_a_tls_client_is_told_the_server_does_not_speak_tls(certs: Path) -> None:
    """A client with TLS calling a plaintext server fails with HandshakeRefused saying so."""
    async with status_server(None) as port:
        with pytest.raises(HandshakeRefused) as raised:
            await call_cp(f"127.0.0.1:{port}", client_tls(certs, "operator"), "status", pb.StatusRequest())
    assert str(raised.value) == (
        f"127.0.0.1:{port}: the server does not speak TLS (is it running with --insecure?)"
    )


# ---------------------------------------------------------------------------- stalled handshakes


def client_hello(certs: Path) -> bytes:
    """The first flight of a real client handshake (its ClientHello record)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    target = client_tls(certs, "operator")
    obj = target.context.wrap_bio(incoming, outgoing, server_side=False, server_hostname=target.server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def server_sockets_to(port: int, peer: tuple[str, int]) -> list[Any]:
    """This process's TCP sockets on ``port`` connected to ``peer`` (the server's end)."""
    return [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.raddr and (c.raddr.ip, c.raddr.port) == peer
    ]


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Return once ``predicate()`` holds, checking every few milliseconds (what it checks,
    the kernel's socket table, sets no event to wait for)."""
    with trio.fail_after(HANG_GUARD_S):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


@pytest.mark.parametrize("sent", ["nothing", "half a ClientHello"])
async def test_a_stalled_handshake_is_dropped_and_the_server_serves_on(certs: Path, sent: str) -> None:
    """A connection that sends nothing, or half a ClientHello, and then waits is closed by the
    server once its handshake timeout passes (its socket gone), and the server then serves a
    good client."""
    hello = client_hello(certs)
    async with status_server(server_context(TlsFiles.in_dir(certs, "cp-1")), handshake_timeout_s=0.5) as port:
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", port))
            if sent != "nothing":
                await sock.send(hello[: len(hello) // 2])
            peer = sock.getsockname()
            await wait_until(lambda: len(server_sockets_to(port, peer)) == 1)  # accepted
            with trio.fail_after(HANG_GUARD_S):
                try:
                    assert await sock.recv(1) == b""
                except ConnectionResetError:
                    pass
            assert server_sockets_to(port, peer) == []
        reply = await call_cp(
            f"127.0.0.1:{port}", client_tls(certs, "operator"), "status", pb.StatusRequest()
        )
    assert reply.leader == "cp-1"


# ---------------------------------------------------------------------------- exposed key files


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No setting of the developer's environment reaches the CLI."""
    for name in (INSECURE_ENV, CERTS_DIR_ENV, IDENTITY_ENV, CONFIG_ENV, "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    yield


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def expose(key: Path) -> str:
    key.chmod(0o644)
    return (
        f"error: private key {key} has mode 0644: it must not be readable or writable by group or "
        f"others (chmod 600 {key}, and replace the key if others could read it)"
    )


@pytest.mark.usefixtures("cli_env")
def test_a_control_plane_with_an_exposed_key_does_not_start(certs: Path) -> None:
    """``stockade cp`` whose key others may read exits 1 with one line naming the file."""
    message = expose(certs / "cp-1.key")
    result = CliRunner().invoke(
        app,
        ["cp", "--id", "cp-1", "--certs-dir", str(certs), "--database-url", "postgresql://127.0.0.1:1/x"],
    )
    assert (result.exit_code, lines(result.output)) == (1, [message])


@pytest.mark.usefixtures("cli_env")
def test_an_agent_with_an_exposed_key_does_not_start(certs: Path, tmp_path: Path) -> None:
    """``stockade agent`` whose key others may read exits 1 with one line naming the file, and
    creates no work folder."""
    message = expose(certs / "w-1.key")
    work_dir = tmp_path / "work"
    result = CliRunner().invoke(
        app,
        [
            "agent",
            "--id",
            "w-1",
            "--cpu-millis",
            "1000",
            "--memory-mb",
            "512",
            "--control-planes",
            "127.0.0.1:1",
            "--work-dir",
            str(work_dir),
            "--certs-dir",
            str(certs),
        ],
    )
    assert (result.exit_code, lines(result.output)) == (1, [message])
    assert not work_dir.exists()


@pytest.mark.usefixtures("cli_env")
def test_a_client_command_with_an_exposed_key_fails_naming_it(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client command whose operator.key others may read exits 1 with one line naming the
    file, before it calls anything."""
    monkeypatch.setenv(CERTS_DIR_ENV, str(certs))
    message = expose(certs / "operator.key")
    result = CliRunner().invoke(app, ["status", "--control-planes", "127.0.0.1:1"])
    assert (result.exit_code, lines(result.output)) == (1, [message])
    assert os.stat(certs / "operator.key").st_mode & 0o777 == 0o644  # reported, not changed


@pytest.mark.usefixtures("cli_env")
def test_an_agent_given_another_workers_certificate_does_not_start(certs: Path, tmp_path: Path) -> None:
    """``stockade agent --id w-10`` with w-9's certificate copied under w-10's name exits 1 with
    one line saying whose certificate it is, and creates no work folder."""
    issue_dir = tmp_path / "copied"
    issue_dir.mkdir(mode=0o700)
    for name in ("ca.crt",):
        (issue_dir / name).write_bytes((certs / name).read_bytes())
    (issue_dir / "w-10.crt").write_bytes((certs / "w-1.crt").read_bytes())
    key = issue_dir / "w-10.key"
    key.write_bytes((certs / "w-1.key").read_bytes())
    key.chmod(0o600)
    work_dir = tmp_path / "work"
    result = CliRunner().invoke(
        app,
        [
            *("agent", "--id", "w-10", "--cpu-millis", "1000", "--memory-mb", "512"),
            *("--control-planes", "127.0.0.1:1", "--work-dir", str(work_dir), "--certs-dir", str(issue_dir)),
        ],
    )
    assert (result.exit_code, lines(result.output)) == (
        1,
        [
            f"error: {issue_dir / 'w-10.crt'} is the certificate of worker w-1, not of worker w-10: a "
            "certificate is bound to one id (issue one with `stockade certs issue --role worker --id w-10`)"
        ],
    )
    assert not work_dir.exists()


# ---------------------------------------------------------------------------- large requests


async def test_a_request_longer_than_the_limit_is_refused_before_its_body_is_read(certs: Path) -> None:
    """A request longer than the service's limit is refused as INVALID_ARGUMENT naming its size
    and the limit; the server answers the next call as before."""
    tls = server_context(TlsFiles.in_dir(certs, "cp-1"))
    async with status_server(tls, max_request_bytes=1000) as port:
        address = f"127.0.0.1:{port}"
        operator = client_tls(certs, "operator")
        with pytest.raises(InvalidArgument) as raised:
            await call_cp(address, operator, "list_jobs", pb.ListJobsRequest(state="x" * 5000))
        assert "must be at most 1000 bytes; send less per call" in str(raised.value)
        assert "5003 bytes" in str(raised.value)
        reply = await call_cp(address, operator, "status", pb.StatusRequest())
        assert reply.leader == "cp-1"


async def test_a_caller_without_the_role_is_refused_before_its_request_is_read(certs: Path) -> None:
    """A viewer sending 24 MiB to an RPC it may not call is refused by its role, not after the
    server took in the whole request: the server keeps answering others meanwhile and after."""
    tls = server_context(TlsFiles.in_dir(certs, "cp-1"))
    access = {"status": ("operator", "viewer"), "list_jobs": ("operator",)}
    huge = pb.ListJobsRequest(state="x" * (24 * 1024 * 1024))
    async with status_server(tls, access=access) as port:
        address = f"127.0.0.1:{port}"
        before = refusals("list_jobs", "role")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refused_huge, address, client_tls(certs, "viewer"), huge)
            reply = await call_cp(address, client_tls(certs, "viewer"), "status", pb.StatusRequest())
        assert refusals("list_jobs", "role") == before + 1
        assert reply.leader == "cp-1"
        reply = await call_cp(address, client_tls(certs, "operator"), "status", pb.StatusRequest())
        assert reply.leader == "cp-1"


async def refused_huge(address: str, tls: TlsTarget, request: pb.ListJobsRequest) -> None:
    with pytest.raises((PermissionDenied, Unavailable)):
        await call_cp(address, tls, "list_jobs", request)
