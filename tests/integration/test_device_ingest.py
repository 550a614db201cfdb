"""Devices at the control plane's door (docs/devices.md), over real gRPC on a real PostgreSQL:
a registration offering a unit twice, or a bad resource name, is refused naming the field, the
value and the limit, and stores no worker; a good one stores its units; a submission asking a
bad count or name stores no job; a good one stores its ask and reads it back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from serving import serve_ingests

from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument
from runtime.settings.control_plane import IngestSettings


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[tuple[ControlPlaneClient, PgConnection]]:
    """A client of one ingest actor (no leader), and an admin connection."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1)
    async with serve_ingests(database_url, "cp-1", settings=settings, presence_interval_s=1.0) as (ingest,):
        cp = ControlPlaneClient([ingest.address], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        try:
            yield cp, admin
        finally:
            cp.close()
            await admin.close()


def registration(*offered: tuple[str, list[str]]) -> pb.RegisterWorkerRequest:
    return pb.RegisterWorkerRequest(
        worker_id="w-1",
        address="127.0.0.1:9",
        cpu_millis=4000,
        memory_mb=8192,
        resources=[pb.ResourceUnits(name=name, units=units) for name, units in offered],
    )


@pytest.mark.parametrize(
    ("offered", "message"),
    [
        ((("gpu", ["0", "1", "0"]),), "resources[gpu] must list each unit id once (listed twice), got '0'"),
        ((("GPU", ["0"]),), "resources must be 1 to 32 characters of [a-z][a-z0-9_-]*, got 'GPU'"),
        ((("gpu", ["0"]), ("gpu", ["1"])), "resources must name each resource once"),
        ((("gpu", ["a b"]),), "resources[gpu] must be 1 to 64 characters"),
    ],
)
async def test_a_bad_offer_is_refused_and_no_worker_is_stored(
    client: tuple[ControlPlaneClient, PgConnection], offered: tuple[tuple[str, list[str]], ...], message: str
) -> None:
    """INVALID_ARGUMENT names the field, the value and the limit; the workers table stays empty."""
    cp, admin = client
    with pytest.raises(InvalidArgument) as info:
        await cp.call("register_worker", registration(*offered))
    assert message in str(info.value)
    assert await admin.fetchval("SELECT count(*) FROM workers") == 0


async def test_a_registration_stores_its_units(client: tuple[ControlPlaneClient, PgConnection]) -> None:
    """The units a worker offers are stored on its row, in the order offered."""
    cp, admin = client
    await cp.call("register_worker", registration(("gpu", ["0", "1", "10", "2"])))
    stored = await admin.fetchval("SELECT resources::text FROM workers WHERE id = 'w-1'")
    assert json.loads(stored) == {"gpu": ["0", "1", "10", "2"]}


def job(*asked: tuple[str, int]) -> pb.SubmitJobRequest:
    return pb.SubmitJobRequest(
        spec=pb.JobSpec(
            name="j",
            cpu_millis=500,
            memory_mb=256,
            sleep=pb.SleepRuntime(duration_ms=1000),
            resources=[pb.ResourceCount(name=name, count=count) for name, count in asked],
        )
    )


@pytest.mark.parametrize(
    ("asked", "message"),
    [
        ((("gpu", 257),), "resources[gpu] must be a count between 0 and 256, got 257"),
        ((("Gpu", 1),), "resources must be 1 to 32 characters of [a-z][a-z0-9_-]*, got 'Gpu'"),
        ((("gpu", 1), ("gpu", 2)), "resources must name each resource once"),
    ],
)
async def test_a_bad_ask_is_refused_and_no_job_is_stored(
    client: tuple[ControlPlaneClient, PgConnection], asked: tuple[tuple[str, int], ...], message: str
) -> None:
    """INVALID_ARGUMENT names the field, the value and the limit; the jobs table stays empty."""
    cp, admin = client
    with pytest.raises(InvalidArgument) as info:
        await cp.call("submit_job", job(*asked))
    assert message in str(info.value)
    assert await admin.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_submission_stores_its_ask_and_reads_it_back(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """A job asking 2 gpu is stored so, one asking none stores none, and GetJob returns the ask;
    a batch stores each job's own."""
    cp, admin = client
    job_id = (await cp.call("submit_job", job(("gpu", 2)))).job_id
    plain = (await cp.call("submit_job", job())).job_id
    assert json.loads(await admin.fetchval("SELECT resources::text FROM jobs WHERE id = $1", job_id)) == {
        "gpu": 2
    }
    assert await admin.fetchval("SELECT resources::text FROM jobs WHERE id = $1", plain) == "{}"
    info = await cp.call("get_job", pb.GetJobRequest(job_id=job_id))
    assert [(r.name, r.count) for r in info.spec.resources] == [("gpu", 2)]
    batch = await cp.call("submit_jobs", pb.SubmitJobsRequest(specs=[job(("fpga", 1)).spec, job().spec]))
    stored = await admin.fetch(
        "SELECT resources::text AS r FROM jobs WHERE id = ANY($1::bigint[]) ORDER BY id", list(batch.job_ids)
    )
    assert [json.loads(r["r"]) for r in stored] == [{"fpga": 1}, {}]
