"""Integers on the wire over real gRPC on a real PostgreSQL: a request whose integer lies outside
its field's type is refused with INVALID_ARGUMENT naming the field and the value as sent, and
nothing is stored. The issue's inputs, as a betterproto2 client sends them, and every integer
field of every ControlPlane request, from the .proto's descriptors, sent as raw varints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpclib.client
import grpclib.const
import grpclib.exceptions
import pytest
import trio
from grpclib.encoding.proto import ProtoCodec
from serving import serve_ingests
from wire_fields import RANGES, as_sent, encode, integer_fields, outside

from protocol import pb
from runtime.aio import PgConnection, run_aio
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument
from runtime.settings.control_plane import IngestSettings

TABLES = ("jobs", "workers", "assignments")


@pytest.fixture
async def ingest(database_url: str) -> AsyncIterator[tuple[str, ControlPlaneClient, PgConnection]]:
    """One ingest actor's address, a client of it, and an admin connection."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1)
    async with serve_ingests(database_url, "cp-1", settings=settings) as (served,):
        cp = ControlPlaneClient([served.address], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        try:
            yield served.address, cp, admin
        finally:
            cp.close()
            await admin.close()


async def stored(admin: PgConnection) -> dict[str, int]:
    return {table: await admin.fetchval(f"SELECT count(*) FROM {table}") for table in TABLES}


NOTHING = dict.fromkeys(TABLES, 0)


def job(**fields: Any) -> pb.JobSpec:
    spec: dict[str, Any] = dict(
        name="j", cpu_millis=500, memory_mb=256, sleep=pb.SleepRuntime(duration_ms=10)
    )
    spec.update(fields)
    return pb.JobSpec(**spec)


def worker(**fields: Any) -> pb.RegisterWorkerRequest:
    request: dict[str, Any] = dict(worker_id="x-1", address="127.0.0.1:9", cpu_millis=1000, memory_mb=1024)
    request.update(fields)
    return pb.RegisterWorkerRequest(**request)


@pytest.mark.parametrize(
    ("rpc", "request_message", "message"),
    [
        (
            "submit_job",
            pb.SubmitJobRequest(spec=job(priority=2**40)),
            "spec.priority must be between -2147483648 and 2147483647 (int32), got 1099511627776",
        ),
        (
            "submit_job",
            pb.SubmitJobRequest(spec=job(cpu_millis=2**32 + 500)),
            "spec.cpu_millis must be between 0 and 4294967295 (uint32), got 4294967796",
        ),
        (
            "submit_job",
            pb.SubmitJobRequest(spec=job(memory_mb=2**32 + 256)),
            "spec.memory_mb must be between 0 and 4294967295 (uint32), got 4294967552",
        ),
        (
            "submit_job",
            pb.SubmitJobRequest(spec=job(cpu_millis=-1)),
            "spec.cpu_millis must be between 0 and 4294967295 (uint32), got 18446744073709551615 "
            "(-1 as a signed 64-bit integer)",
        ),
        (
            "submit_jobs",
            pb.SubmitJobsRequest(specs=[job(), job(cpu_millis=2**32 + 500)]),
            "specs[1].cpu_millis must be between 0 and 4294967295 (uint32), got 4294967796",
        ),
        (
            "register_worker",
            worker(cpu_millis=2**32 + 1000),
            "cpu_millis must be between 0 and 4294967295 (uint32), got 4294968296",
        ),
        (
            "register_worker",
            worker(memory_mb=-1),
            "memory_mb must be between 0 and 4294967295 (uint32), got 18446744073709551615 "
            "(-1 as a signed 64-bit integer)",
        ),
    ],
)
async def test_the_issues_inputs_are_refused_with_the_value_sent_and_nothing_is_stored(
    ingest: tuple[str, ControlPlaneClient, PgConnection], rpc: str, request_message: Any, message: str
) -> None:
    """What a betterproto2 client sends for these values is refused with INVALID_ARGUMENT naming
    the field and the number it was given (never the truncated one); no job or worker is stored."""
    _, cp, admin = ingest
    with pytest.raises(InvalidArgument) as info:
        await cp.call(rpc, request_message)
    assert str(info.value) == message
    assert await stored(admin) == NOTHING


class RawRequests(ProtoCodec):
    """grpclib's codec, and a request given as bytes is sent as they are: varints no client
    library would write."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, bytes):
            return message
        return bytes(super().encode(message, message_type))


async def refusal(address: str, route: str, data: bytes) -> grpclib.exceptions.GRPCError:
    """The error status a replica answers ``data`` sent to ``route`` with (asked again while it
    is busy)."""

    async def call() -> grpclib.exceptions.GRPCError:
        host, port = address.rsplit(":", 1)
        channel = grpclib.client.Channel(host, int(port), codec=RawRequests())
        try:
            async with channel.request(
                route, grpclib.const.Cardinality.UNARY_UNARY, bytes, pb.StatusReply, timeout=5.0
            ) as stream:
                await stream.send_message(data, end=True)
                await stream.recv_message()
        except grpclib.exceptions.GRPCError as exc:
            return exc
        finally:
            channel.close()
        raise AssertionError(f"{route} answered {data!r}")

    while True:
        error: grpclib.exceptions.GRPCError = await run_aio(call)
        # A replica shedding load (its loop late on a busy machine) answers busy before it
        # reads the request: a client's cue to try again, not the answer asked about.
        if error.status != grpclib.const.Status.RESOURCE_EXHAUSTED or not (error.message or "").startswith(
            "busy"
        ):
            return error
        await trio.sleep(0.1)


CONTROL_PLANE_FIELDS = [f for f in integer_fields() if f.service == "stockade.v1.ControlPlane"]


async def test_every_integer_field_of_every_control_plane_request_is_refused_over_grpc(
    ingest: tuple[str, ControlPlaneClient, PgConnection],
) -> None:
    """Each integer field of each ControlPlane request, sent just outside its type's range on
    either side and far outside it: INVALID_ARGUMENT naming its path and the value as sent;
    nothing is stored."""
    address, _, admin = ingest
    assert {f.rpc for f in CONTROL_PLANE_FIELDS} >= {"SubmitJob", "SubmitJobs", "RegisterWorker", "Heartbeat"}
    for field in CONTROL_PLANE_FIELDS:
        low, high = RANGES[field.type]
        for raw in outside(field.type):
            error = await refusal(address, field.route, encode(field, raw))
            assert error.status == grpclib.const.Status.INVALID_ARGUMENT, (field, raw)
            assert (error.message or "").startswith(f"{field.path} must be between {low} and {high}")
            assert f", got {as_sent(field.type, raw)}" in (error.message or "")
    assert await stored(admin) == NOTHING
