"""The Python client against real control planes (ingest actors serving gRPC on 127.0.0.1 over
a real PostgreSQL): what it submits is stored as given and read back typed, a call sent again
with its key is answered and not done twice, a batch is stored all or none, a replica that is
down is passed over, mutual TLS is required, and the asyncio face reaches the same service."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import trio
from serving import serve_ingests

from ops import certs as certs_module
from ops.client import (
    AsyncioClient,
    Client,
    ClientSettings,
    IdempotencyConflict,
    InvalidArgument,
    JobNotFound,
    NoControlPlaneReachable,
    PermissionDenied,
    WorkerNotFound,
    job_spec,
)
from runtime.aio import PgConnection
from runtime.tls import TlsFiles, server_context

SPEC = job_spec(
    name="hello",
    cpu_millis=250,
    memory_mb=64,
    command=["sh", "-c", "echo hello"],
    max_attempts=2,
    retry_backoff_s=0.5,
    timeout_s=60,
    constraints=["zone in (a,b)"],
    env={"MODE": "fast"},
    workdir="/tmp",
)
COUNT_JOBS = "SELECT count(*) FROM jobs"


def plaintext(*addresses: str) -> ClientSettings:
    return ClientSettings(control_planes=addresses, tls=None, timeout_s=5.0)


async def test_a_submitted_job_is_stored_as_given_and_read_back_typed(database_url: str) -> None:
    """submit returns the new id; get and list give it back as a Job whose spec is the one sent,
    pending, with its submission time."""
    async with (
        serve_ingests(database_url, "cp-1") as (ingest,),
        Client.open(plaintext(ingest.address)) as client,
    ):
        job_id = await client.submit(SPEC)
        job = await client.get(job_id)
        listed = await client.list(state="pending")
    assert (job.job_id, job.spec, job.state, job.worker_id, job.exit_code) == (
        job_id,
        SPEC,
        "pending",
        None,
        None,
    )
    assert job.submitted_unix_s is not None and job.submitted_unix_s > 1_700_000_000
    assert [j.job_id for j in listed] == [job_id]


async def test_a_call_sent_again_with_its_key_is_answered_not_done_twice(database_url: str) -> None:
    """The same submission under the same key gets the first id and stores nothing more; another
    submission under that key is refused as an IdempotencyConflict, and stores nothing."""
    async with (
        serve_ingests(database_url, "cp-1") as (ingest,),
        Client.open(plaintext(ingest.address)) as client,
    ):
        first = await client.submit(SPEC, idempotency_key="nightly-2026-12-01")
        again = await client.submit(SPEC, idempotency_key="nightly-2026-12-01")
        with pytest.raises(IdempotencyConflict, match="nightly-2026-12-01"):
            await client.submit(
                job_spec(cpu_millis=1, memory_mb=1, sleep_s=1), idempotency_key="nightly-2026-12-01"
            )
        others = await client.submit_many([SPEC, SPEC])
        admin = await PgConnection.connect(database_url)
        try:
            stored = await admin.fetchval(COUNT_JOBS)
        finally:
            await admin.close()
    assert again == first
    assert len(set(others)) == 2 and first not in others
    assert stored == 3


async def test_a_batch_is_stored_all_or_none(database_url: str) -> None:
    """A batch whose second job waits for a job that does not exist is refused by the control
    plane, naming it, and none of the batch is stored."""
    missing = job_spec(cpu_millis=1, memory_mb=1, sleep_s=1, after=[999_999])
    async with (
        serve_ingests(database_url, "cp-1") as (ingest,),
        Client.open(plaintext(ingest.address)) as client,
    ):
        with pytest.raises(InvalidArgument, match=r"specs\[1\]\.after"):
            await client.submit_many([SPEC, missing])
        assert await client.list() == ()


async def test_a_pending_job_cancelled_has_ended_and_wait_returns_it(database_url: str) -> None:
    """A cancel of a pending job says cancelled; wait returns the cancelled job at once."""
    async with (
        serve_ingests(database_url, "cp-1") as (ingest,),
        Client.open(plaintext(ingest.address)) as client,
    ):
        job_id = await client.submit(SPEC)
        outcome = await client.cancel(job_id)
        with trio.fail_after(10):
            job = await client.wait(job_id, timeout_s=5)
    assert (outcome.job_id, outcome.state, outcome.tasks) == (job_id, "cancelled", 0)
    assert (job.state, job.ended) == ("cancelled", True)


async def test_unknown_ids_are_typed_not_found_errors(database_url: str) -> None:
    """An unknown job is JobNotFound (get, cancel), an unknown worker WorkerNotFound."""
    async with (
        serve_ingests(database_url, "cp-1") as (ingest,),
        Client.open(plaintext(ingest.address)) as client,
    ):
        with pytest.raises(JobNotFound, match="job_id 424242 not found"):
            await client.get(424242)
        with pytest.raises(JobNotFound):
            await client.cancel(424242)
        with pytest.raises(WorkerNotFound, match="w-9"):
            await client.cordon("w-9")


async def test_a_replica_that_is_down_is_passed_over(database_url: str) -> None:
    """With a dead address first, the call is answered by the live replica, which is asked first
    next time; with every replica down, one error names them all."""
    async with serve_ingests(database_url, "cp-1") as (ingest,):
        async with Client.open(plaintext("127.0.0.1:1", ingest.address)) as client:
            job_id = await client.submit(SPEC)
            assert client.last_answered == ingest.address
            assert (await client.get(job_id)).job_id == job_id
        async with Client.open(plaintext("127.0.0.1:1", "127.0.0.1:2")) as client:
            with pytest.raises(NoControlPlaneReachable) as raised:
                await client.submit(SPEC)
    assert raised.value.addresses == ("127.0.0.1:1", "127.0.0.1:2")


async def test_mutual_tls_is_required_and_the_role_checked(database_url: str, tmp_path: Path) -> None:
    """Over mutual TLS the operator's certificate submits; a viewer's reads (the environment's
    values hidden) but may not submit (PermissionDenied); a plaintext client is refused, nothing
    stored."""
    certs = tmp_path / "certs"
    certs_module.init_cluster(certs)
    tls = server_context(TlsFiles.in_dir(certs, "cp-1"))
    async with serve_ingests(database_url, "cp-1", tls=tls) as (ingest,):
        operator = ClientSettings(control_planes=[ingest.address], tls=TlsFiles.in_dir(certs, "operator"))
        viewer = ClientSettings(control_planes=[ingest.address], tls=TlsFiles.in_dir(certs, "viewer"))
        async with Client.open(operator) as client:
            job_id = await client.submit(SPEC)
        async with Client.open(viewer) as client:
            assert (await client.get(job_id)).spec == SPEC.env_values_hidden() != SPEC
            with pytest.raises(PermissionDenied, match="operator"):
                await client.submit(SPEC)
        async with Client.open(plaintext(ingest.address)) as client:
            with pytest.raises(NoControlPlaneReachable):
                await client.submit(SPEC)
            with pytest.raises(NoControlPlaneReachable):
                await client.list()


async def test_the_asyncio_face_reaches_the_same_service(database_url: str) -> None:
    """An asyncio program (its own loop, in a thread of its own here) submits and reads back the
    same job as the trio face."""

    async def program(address: str) -> tuple[int, str]:
        async with AsyncioClient.open(plaintext(address)) as client:
            job_id = await client.submit(SPEC)
            return job_id, (await client.get(job_id)).state

    def run(address: str) -> tuple[int, str]:
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            return runner.run(program(address))

    async with serve_ingests(database_url, "cp-1") as (ingest,):
        with trio.fail_after(30):
            job_id, state = await trio.to_thread.run_sync(run, ingest.address)
        async with Client.open(plaintext(ingest.address)) as client:
            assert (await client.get(job_id)).spec == SPEC
    assert state == "pending"
