"""Accounts over real gRPC with mutual TLS on 127.0.0.1 and a real PostgreSQL: a user sees, reads
and cancels only its own jobs, may not cordon or drain; a viewer scoped to an account sees only
that account's; every change writes one audit row naming the caller, the action and the address,
and a refused call writes nothing (docs/accounts.md)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from serving import mtls_control_plane, serve_ingests

from ops import certs as certs_module
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import GrpcChannel, PgConnection, StreamLimits, asyncio_bridge, asyncio_bridge_open
from runtime.errors import IdempotencyConflict, InvalidArgument, NotFound, PermissionDenied
from runtime.idempotency_keys import with_idempotency_key
from runtime.settings.control_plane import IngestSettings
from runtime.tls import ClientTls, TlsFiles

CALL_TIMEOUT_S = 10.0
AUDIT_ROWS = """
SELECT role, actor_id, account, address, action, target_ids::text, arguments::text FROM audit_log ORDER BY id
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The certificates ``stockade certs init`` issues (cp-1, w-1, operator, viewer...), the users
    alice and bob, and v-alice, a viewer of alice's account."""
    folder = tmp_path_factory.mktemp("accounts") / "certs"
    certs_module.init_cluster(folder)
    certs_module.issue(folder, role="user", id="alice")
    certs_module.issue(folder, role="user", id="bob")
    certs_module.issue(folder, role="viewer", id="v-alice", account="alice")
    return folder


async def call(address: str, certs: Path, id: str, rpc: str, request: Any) -> Any:
    """One ControlPlane call as ``id`` (its certificate in ``certs``), on a channel of its own."""
    channel = GrpcChannel(address, tls=ClientTls(TlsFiles.in_dir(certs, id)).target())
    try:
        return await channel.call(
            getattr(channel.stub(pb.ControlPlaneStub), rpc), request, timeout_s=CALL_TIMEOUT_S
        )
    finally:
        channel.close()


async def fetch(database_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Every row ``query`` returns (after the control plane stopped: on a loop of its own)."""
    async with contextlib.AsyncExitStack() as stack:
        if not asyncio_bridge_open():
            await stack.enter_async_context(asyncio_bridge())
        conn = await PgConnection.connect(database_url)
        try:
            return [tuple(row) for row in await conn.fetch(query, *args)]
        finally:
            await conn.close()
    raise AssertionError("unreachable")


def sleep_job(name: str = "nap", array: pb.JobArray | None = None) -> pb.SubmitJobRequest:
    spec = pb.JobSpec(name=name, cpu_millis=500, memory_mb=256, sleep=pb.SleepRuntime(duration_ms=1000))
    if array is not None:
        spec.array = array
    return with_idempotency_key(pb.SubmitJobRequest(spec=spec))


async def submit(address: str, certs: Path, id: str, request: pb.SubmitJobRequest | None = None) -> int:
    reply = await call(address, certs, id, "submit_job", request or sleep_job())
    return int(reply.job_id)


async def register_w1(address: str, certs: Path) -> None:
    request = pb.RegisterWorkerRequest(
        worker_id="w-1", address="127.0.0.1:9", cpu_millis=4000, memory_mb=8192
    )
    await call(address, certs, "w-1", "register_worker", with_idempotency_key(request))


def cancel(job_id: int) -> pb.CancelJobRequest:
    return with_idempotency_key(pb.CancelJobRequest(job_id=job_id))


async def test_a_user_cannot_see_read_the_logs_of_or_cancel_another_accounts_job(
    database_url: str, certs: Path
) -> None:
    """bob's job is NotFound to alice for get, events, logs and cancel, absent from her list, and
    still pending after her cancel, which wrote no audit row; bob sees it, owned by bob."""
    async with mtls_control_plane(database_url, certs) as address:
        bobs = await submit(address, certs, "bob")
        alices = await submit(address, certs, "alice")
        for rpc, request in [
            ("get_job", pb.GetJobRequest(job_id=bobs)),
            ("get_job_events", pb.GetJobEventsRequest(job_id=bobs)),
            ("cancel_job", cancel(bobs)),
        ]:
            with pytest.raises(NotFound, match=f"job_id {bobs} not found"):
                await call(address, certs, "alice", rpc, request)
        channel = GrpcChannel(address, tls=ClientTls(TlsFiles.in_dir(certs, "alice")).target())
        try:
            logs = pb.ReadJobLogsRequest(job_id=bobs, stream="stdout")
            limits = StreamLimits(first_message_s=CALL_TIMEOUT_S, timeout_s=CALL_TIMEOUT_S)
            with pytest.raises(NotFound, match=f"job_id {bobs} not found"):
                async with channel.stream(ControlPlaneBase, "read_job_logs", logs, limits) as chunks:
                    async for _ in chunks:
                        pass
        finally:
            channel.close()
        listed = await call(address, certs, "alice", "list_jobs", pb.ListJobsRequest())
        assert [(j.job_id, j.owner) for j in listed.jobs] == [(alices, "alice")]
        info = await call(address, certs, "bob", "get_job", pb.GetJobRequest(job_id=bobs))
        assert (info.owner, info.state) == ("bob", "pending")
    assert await fetch(database_url, "SELECT state FROM jobs WHERE id = $1", bobs) == [("pending",)]
    assert [row[4] for row in await fetch(database_url, AUDIT_ROWS)] == ["submit", "submit"]


async def test_a_user_cannot_name_another_accounts_job_as_a_dependency(
    database_url: str, certs: Path
) -> None:
    """alice naming bob's job in after (one job, or in a batch) is refused as naming a job that
    does not exist, in the same words, so a dependency tells her nothing of it; nothing is stored.
    Her own job she may name; an operator may name anyone's."""
    async with mtls_control_plane(database_url, certs) as address:
        bobs = await submit(address, certs, "bob")
        alices = await submit(address, certs, "alice")
        unknown = bobs + 1000
        refusals = []
        for after in (bobs, unknown):
            request = sleep_job()
            request.spec.after = [after]
            with pytest.raises(InvalidArgument) as refused:
                await submit(address, certs, "alice", request)
            refusals.append(str(refused.value).replace(str(after), "N"))
            batch = with_idempotency_key(pb.SubmitJobsRequest(specs=[request.spec]))
            with pytest.raises(InvalidArgument):
                await call(address, certs, "alice", "submit_jobs", batch)
        assert refusals[0] == refusals[1]
        own = sleep_job()
        own.spec.after = [alices]
        await submit(address, certs, "alice", own)
        anyones = sleep_job()
        anyones.spec.after = [bobs]
        await submit(address, certs, "operator", anyones)
    owners = await fetch(database_url, "SELECT owner FROM jobs ORDER BY id")
    assert [row[0] for row in owners] == ["bob", "alice", "alice", "operator"]


async def test_another_accounts_idempotency_key_is_a_conflict_not_a_replay(
    database_url: str, certs: Path
) -> None:
    """bob sending alice's submission again, key and all, is refused as a conflict that does not
    name her job; nothing is stored for bob and alice's copy is still replayed."""
    async with mtls_control_plane(database_url, certs) as address:
        request = sleep_job()
        alices = await submit(address, certs, "alice", request)
        with pytest.raises(IdempotencyConflict) as refused:
            await submit(address, certs, "bob", request)
        assert str(alices) not in str(refused.value).split("was first used", 1)[1]
        assert await submit(address, certs, "alice", request) == alices
    assert await fetch(database_url, "SELECT id, owner FROM jobs") == [(alices, "alice")]
    assert [r[1] for r in await fetch(database_url, AUDIT_ROWS)] == ["alice"]


async def test_a_user_reads_its_own_jobs_environment_values_and_a_viewer_does_not(
    database_url: str, certs: Path
) -> None:
    """alice, who set them, reads her job's environment values; v-alice reads only the names."""
    spec = pb.JobSpec(name="env", cpu_millis=100, memory_mb=16, command=pb.CommandRuntime(argv=["true"]))
    spec.env = {"TOKEN": "s3cret"}
    async with mtls_control_plane(database_url, certs) as address:
        job_id = await submit(address, certs, "alice", with_idempotency_key(pb.SubmitJobRequest(spec=spec)))
        own = await call(address, certs, "alice", "get_job", pb.GetJobRequest(job_id=job_id))
        viewed = await call(address, certs, "v-alice", "get_job", pb.GetJobRequest(job_id=job_id))
    assert dict(own.spec.env) == {"TOKEN": "s3cret"}
    assert dict(viewed.spec.env) == {"TOKEN": "<hidden>"}


async def test_a_user_cancels_its_own_array(database_url: str, certs: Path) -> None:
    """alice's cancel of her own array cancels every task of it, and its audit row names the array."""
    async with mtls_control_plane(database_url, certs) as address:
        array_id = await submit(
            address, certs, "alice", sleep_job("tasks", pb.JobArray(first_index=0, last_index=2))
        )
        reply = await call(address, certs, "alice", "cancel_job", cancel(array_id))
        assert (reply.state, reply.tasks) == ("cancelled", 3)
    assert await fetch(database_url, "SELECT DISTINCT owner, state FROM jobs") == [("alice", "cancelled")]
    rows = await fetch(database_url, AUDIT_ROWS)
    assert [(r[4], json.loads(r[5])) for r in rows] == [("submit", [array_id]), ("cancel", [array_id])]


@pytest.mark.parametrize("id", ["alice", "viewer"])
async def test_users_and_viewers_may_not_cordon_drain_or_uncordon(
    database_url: str, certs: Path, id: str
) -> None:
    """Each is PermissionDenied naming the caller's role and the RPC; the worker stays as it was
    and no audit row is written."""
    role = "user" if id == "alice" else "viewer"
    async with mtls_control_plane(database_url, certs) as address:
        await register_w1(address, certs)
        for rpc, request in [
            ("cordon_worker", pb.CordonWorkerRequest(worker_id="w-1")),
            ("drain_worker", pb.DrainWorkerRequest(worker_id="w-1")),
            ("uncordon_worker", pb.UncordonWorkerRequest(worker_id="w-1")),
        ]:
            with pytest.raises(PermissionDenied) as refused:
                await call(address, certs, id, rpc, with_idempotency_key(request))
            assert f"{rpc} needs operator; the caller is {role}/{id} at 127.0.0.1:" in str(refused.value)
    rows = await fetch(database_url, "SELECT cordoned_at, drain_requested_at FROM workers WHERE id = 'w-1'")
    assert rows == [(None, None)]
    assert await fetch(database_url, AUDIT_ROWS) == []


async def test_an_operator_cordons_and_the_audit_names_it(database_url: str, certs: Path) -> None:
    """An operator's cordon and drain take effect; their rows name operator/operator, the action,
    the worker, the drain's deadline and the address gRPC saw."""
    async with mtls_control_plane(database_url, certs) as address:
        await register_w1(address, certs)
        await call(
            address,
            certs,
            "operator",
            "cordon_worker",
            with_idempotency_key(pb.CordonWorkerRequest(worker_id="w-1")),
        )
        drain = pb.DrainWorkerRequest(worker_id="w-1", has_deadline=True, deadline_ms=60_000)
        reply = await call(address, certs, "operator", "drain_worker", with_idempotency_key(drain))
        assert reply.cordoned
    rows = await fetch(database_url, AUDIT_ROWS)
    assert [(r[0], r[1], r[2], r[4], json.loads(r[5]), json.loads(r[6])) for r in rows] == [
        ("operator", "operator", "operator", "cordon", ["w-1"], {}),
        ("operator", "operator", "operator", "drain", ["w-1"], {"deadline_s": 60.0}),
    ]
    assert all(r[3].startswith("127.0.0.1:") for r in rows)


async def test_the_audit_rows_of_a_submit_and_a_cancel_name_the_caller_and_the_address(
    database_url: str, certs: Path
) -> None:
    """alice's submit and cancel write one row each, in the database's time, naming user/alice,
    her account, the job and the address; a replayed copy of the cancel writes none; ListAudit
    shows them newest first."""
    async with mtls_control_plane(database_url, certs) as address:
        job_id = await submit(address, certs, "alice")
        request = cancel(job_id)
        await call(address, certs, "alice", "cancel_job", request)
        await call(address, certs, "alice", "cancel_job", request)  # a retry: replayed, no new row
        reply = await call(address, certs, "operator", "list_audit", pb.ListAuditRequest())
    rows = await fetch(database_url, AUDIT_ROWS)
    assert [(r[0], r[1], r[2], r[4], json.loads(r[5]), json.loads(r[6])) for r in rows] == [
        ("user", "alice", "alice", "submit", [job_id], {"name": "nap"}),
        ("user", "alice", "alice", "cancel", [job_id], {"only_this_task": False}),
    ]
    assert all(r[3].startswith("127.0.0.1:") for r in rows)
    assert [(e.action, e.actor_id, e.target_ids_json) for e in reply.entries] == [
        ("cancel", "alice", f"[{job_id}]"),
        ("submit", "alice", f"[{job_id}]"),
    ]
    assert all(e.at_unix_s > 0 for e in reply.entries)
    assert await fetch(database_url, "SELECT owner FROM jobs") == [("alice",)]


async def test_a_refused_call_stores_nothing_and_writes_no_audit_row(database_url: str, certs: Path) -> None:
    """A viewer's submit and a user's cancel of another account's job change nothing and leave
    the audit trail empty."""
    async with mtls_control_plane(database_url, certs) as address:
        with pytest.raises(
            PermissionDenied, match="submit_job needs operator or user; the caller is viewer/viewer"
        ):
            await call(address, certs, "viewer", "submit_job", sleep_job())
        assert await fetch(database_url, "SELECT count(*) FROM jobs") == [(0,)]
        bobs = await submit(address, certs, "bob")
        with pytest.raises(NotFound):
            await call(address, certs, "alice", "cancel_job", cancel(bobs))
    assert await fetch(database_url, "SELECT state, cancel_requested FROM jobs") == [("pending", False)]
    assert [(r[1], r[4]) for r in await fetch(database_url, AUDIT_ROWS)] == [("bob", "submit")]


async def test_a_scoped_viewer_sees_only_its_account(database_url: str, certs: Path) -> None:
    """v-alice lists, gets and audits alice's jobs only; bob's job is NotFound to it, and asking
    for bob's account is PermissionDenied; the unscoped viewer may ask for any account."""
    async with mtls_control_plane(database_url, certs) as address:
        alices = await submit(address, certs, "alice")
        bobs = await submit(address, certs, "bob")
        listed = await call(address, certs, "v-alice", "list_jobs", pb.ListJobsRequest())
        assert [j.job_id for j in listed.jobs] == [alices]
        with pytest.raises(NotFound):
            await call(address, certs, "v-alice", "get_job", pb.GetJobRequest(job_id=bobs))
        with pytest.raises(PermissionDenied, match="may read only account 'alice', not 'bob'"):
            await call(address, certs, "v-alice", "list_jobs", pb.ListJobsRequest(account="bob"))
        audit = await call(address, certs, "v-alice", "list_audit", pb.ListAuditRequest())
        assert [(e.account, e.action) for e in audit.entries] == [("alice", "submit")]
        everyone = await call(address, certs, "viewer", "list_jobs", pb.ListJobsRequest())
        assert sorted(j.job_id for j in everyone.jobs) == [alices, bobs]
        only_bob = await call(address, certs, "viewer", "list_jobs", pb.ListJobsRequest(account="bob"))
        assert [(j.job_id, j.owner) for j in only_bob.jobs] == [(bobs, "bob")]


async def test_a_user_reads_only_its_own_audit_rows(database_url: str, certs: Path) -> None:
    """alice's ListAudit shows her rows only, and asking for bob's is PermissionDenied; an
    operator reads both, filtered by account and action on request."""
    async with mtls_control_plane(database_url, certs) as address:
        await submit(address, certs, "alice")
        bobs = await submit(address, certs, "bob")
        await call(address, certs, "bob", "cancel_job", cancel(bobs))
        mine = await call(address, certs, "alice", "list_audit", pb.ListAuditRequest())
        assert [(e.actor_id, e.action) for e in mine.entries] == [("alice", "submit")]
        with pytest.raises(PermissionDenied, match="list_audit"):
            await call(address, certs, "alice", "list_audit", pb.ListAuditRequest(account="bob"))
        everything = await call(address, certs, "operator", "list_audit", pb.ListAuditRequest())
        assert [e.actor_id for e in everything.entries] == ["bob", "bob", "alice"]
        cancels = await call(
            address, certs, "operator", "list_audit", pb.ListAuditRequest(account="bob", action="cancel")
        )
        assert [e.target_ids_json for e in cancels.entries] == [f"[{bobs}]"]


async def test_without_tls_jobs_belong_to_anonymous(database_url: str) -> None:
    """On a server run with --insecure every job is owned by anonymous and audited as
    plaintext/anonymous."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1)
    async with serve_ingests(database_url, "cp-1", settings=settings) as (ingest,):
        channel = GrpcChannel(ingest.address)
        try:
            stub = channel.stub(pb.ControlPlaneStub)
            reply = await channel.call(stub.submit_job, sleep_job(), timeout_s=CALL_TIMEOUT_S)
        finally:
            channel.close()
    assert await fetch(database_url, "SELECT id, owner FROM jobs") == [(reply.job_id, "anonymous")]
    assert [(*r[:3], r[4]) for r in await fetch(database_url, AUDIT_ROWS)] == [
        ("plaintext", "anonymous", "anonymous", "submit")
    ]


async def test_a_call_that_changed_nothing_is_answered_but_writes_no_audit_row(
    database_url: str, certs: Path
) -> None:
    """A second cancel of a cancelled job or of one being cancelled on its worker (a new call,
    not a retry), a cordon of a cordoned worker and an uncordon of an uncordoned one are answered
    as the first were, and the trail holds one row for each change that happened, none for the
    calls that changed nothing."""
    async with mtls_control_plane(database_url, certs) as address:
        await register_w1(address, certs)
        job_id = await submit(address, certs, "alice")
        answers = [await call(address, certs, "alice", "cancel_job", cancel(job_id)) for _ in range(2)]
        assert [(a.state, a.tasks) for a in answers] == [("cancelled", 0)] * 2
        running = await submit(address, certs, "alice")
        await fetch(database_url, "UPDATE jobs SET state = 'running' WHERE id = $1", running)
        answers = [await call(address, certs, "alice", "cancel_job", cancel(running)) for _ in range(2)]
        assert [a.state for a in answers] == ["cancelling"] * 2
        for rpc, request in [
            ("cordon_worker", pb.CordonWorkerRequest(worker_id="w-1")),
            ("cordon_worker", pb.CordonWorkerRequest(worker_id="w-1")),
            ("uncordon_worker", pb.UncordonWorkerRequest(worker_id="w-1")),
            ("uncordon_worker", pb.UncordonWorkerRequest(worker_id="w-1")),
        ]:
            reply = await call(address, certs, "operator", rpc, with_idempotency_key(request))
            assert reply.cordoned == (rpc == "cordon_worker")
    rows = await fetch(database_url, AUDIT_ROWS)
    assert [(r[1], r[4], json.loads(r[5])) for r in rows] == [
        ("alice", "submit", [job_id]),
        ("alice", "cancel", [job_id]),
        ("alice", "submit", [running]),
        ("alice", "cancel", [running]),
        ("operator", "cordon", ["w-1"]),
        ("operator", "uncordon", ["w-1"]),
    ]
