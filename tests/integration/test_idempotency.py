"""Idempotency keys over real gRPC on a real PostgreSQL: a mutating call retried, at the same
replica or at another, is carried out once and answered with its first answer; the same key
with another request is refused naming what the first one did; nothing of a refused call is
stored."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import pytest
import structlog.testing
import trio
from click.testing import Result
from serving import serve_ingests
from typer.testing import CliRunner

from actors.ingest import Ingest
from ops.cli import EXIT_INVALID, app
from ops.config import INSECURE_ENV
from protocol import pb
from runtime import faults
from runtime.aio import GrpcChannel, PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import ClusterBusy, DatabaseUnavailable, IdempotencyConflict, InvalidArgument, NotFound
from runtime.settings.control_plane import IngestSettings


@attrs.frozen
class Cluster:
    """Two ingest replicas (no leader), a client of both (cp-1 asked first), an admin connection."""

    client: ControlPlaneClient
    admin: PgConnection
    replicas: list[Ingest]
    opened: list[ControlPlaneClient] = attrs.field(factory=list)

    def client_of(self, index: int, **kwargs: float) -> ControlPlaneClient:
        """A client of replica ``index`` alone (closed with the cluster)."""
        client = ControlPlaneClient([self.replicas[index].address], timeout_s=5.0, **kwargs)
        self.opened.append(client)
        return client


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    settings = IngestSettings(pool_size=3, liveness_reserved_connections=1)
    async with serve_ingests(database_url, "cp-1", "cp-2", settings=settings) as replicas:
        client = ControlPlaneClient([r.address for r in replicas], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        cluster = Cluster(client=client, admin=admin, replicas=replicas)
        try:
            yield cluster
        finally:
            for opened in [client, *cluster.opened]:
                opened.close()
            await admin.close()


def spec(name: str = "j", cpu_millis: int = 500) -> pb.JobSpec:
    return pb.JobSpec(
        name=name, cpu_millis=cpu_millis, memory_mb=256, sleep=pb.SleepRuntime(duration_ms=1000)
    )


def lose_first_answer(before: Callable[[], Awaitable[None]] | None = None) -> Callable[[], Awaitable[None]]:
    """A hook for ``ingest.after_commit``: the first replica to reach it, with its call's
    effect committed, fails to answer (UNAVAILABLE, as when the connection broke after the
    commit); ``before`` runs first (what happens meanwhile elsewhere)."""
    hits: list[None] = []

    async def hook() -> None:
        hits.append(None)
        if len(hits) == 1:
            if before is not None:
                await before()
            raise DatabaseUnavailable("the answer was lost after the commit")

    return hook


async def job_rows(admin: PgConnection) -> list[tuple[int, str]]:
    return [(r["id"], r["name"]) for r in await admin.fetch("SELECT id, name FROM jobs ORDER BY id")]


async def test_a_submit_that_committed_without_an_answer_is_stored_once(cluster: Cluster) -> None:
    """cp-1 stores the job and fails to answer; the client's retry at cp-2 gets the job cp-1
    stored, and there is one job."""
    async with faults.installed("ingest.after_commit", lose_first_answer()):
        reply = await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec()))
    assert await job_rows(cluster.admin) == [(reply.job_id, "j")]
    assert cluster.client.last_answered == cluster.replicas[1].address


async def test_a_batch_that_committed_without_an_answer_is_stored_once(cluster: Cluster) -> None:
    """The same for a batch: the retry's answer lists the three jobs the first copy stored."""
    specs = [spec("a"), spec("b"), spec("c")]
    async with faults.installed("ingest.after_commit", lose_first_answer()):
        reply = await cluster.client.call("submit_jobs", pb.SubmitJobsRequest(specs=specs))
    rows = await job_rows(cluster.admin)
    assert [name for _, name in rows] == ["a", "b", "c"]
    assert list(reply.job_ids) == [job_id for job_id, _ in rows]
    assert cluster.client.last_answered == cluster.replicas[1].address


async def test_a_cancel_that_committed_without_an_answer_keeps_its_first_answer(cluster: Cluster) -> None:
    """cp-1 records the cancel of a running job ("cancelling") and fails to answer; the job then
    succeeds on its worker; the retry at cp-2 answers "cancelling" and leaves the job alone
    (carried out again, it would answer "succeeded" and clear the cancel request)."""
    submitted = await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec()))
    await cluster.admin.execute("UPDATE jobs SET state = 'running' WHERE id = $1", submitted.job_id)

    async def job_succeeds() -> None:
        await cluster.admin.execute("UPDATE jobs SET state = 'succeeded' WHERE id = $1", submitted.job_id)

    async with faults.installed("ingest.after_commit", lose_first_answer(job_succeeds)):
        reply = await cluster.client.call("cancel_job", pb.CancelJobRequest(job_id=submitted.job_id))
    assert reply.state == "cancelling"
    row = await cluster.admin.fetchrow(
        "SELECT state, cancel_requested FROM jobs WHERE id = $1", submitted.job_id
    )
    assert row is not None and (row["state"], row["cancel_requested"]) == ("succeeded", True)
    assert cluster.client.last_answered == cluster.replicas[1].address


async def row_version(admin: PgConnection, job_id: int) -> str:
    """The job row's xmin: changes whenever anything writes the row."""
    return str(await admin.fetchval("SELECT xmin::text FROM jobs WHERE id = $1", job_id))


async def test_a_retried_submit_returns_the_first_answer_and_stores_nothing(cluster: Cluster) -> None:
    """The same SubmitJob, key included, sent to cp-1 and then twice to cp-2: one job, one key,
    the same job id every time, and the job's row is not written again."""
    request = pb.SubmitJobRequest(spec=spec(), idempotency_key="submit-1")
    first = await cluster.client_of(0).call("submit_job", request)
    version = await row_version(cluster.admin, first.job_id)
    again = [await cluster.client_of(1).call("submit_job", request) for _ in range(2)]
    assert [r.job_id for r in again] == [first.job_id] * 2
    assert await job_rows(cluster.admin) == [(first.job_id, "j")]
    assert await row_version(cluster.admin, first.job_id) == version
    assert await cluster.admin.fetchval("SELECT count(*) FROM idempotency_keys") == 1


async def test_a_retried_batch_returns_the_first_answer_and_stores_nothing(cluster: Cluster) -> None:
    """The same SubmitJobs sent again: the same ids, no more jobs."""
    request = pb.SubmitJobsRequest(specs=[spec("a"), spec("b")], idempotency_key="batch-1")
    first = await cluster.client_of(0).call("submit_jobs", request)
    again = await cluster.client_of(1).call("submit_jobs", request)
    assert list(again.job_ids) == list(first.job_ids)
    assert [job_id for job_id, _ in await job_rows(cluster.admin)] == list(first.job_ids)


async def test_a_retried_cancel_returns_the_first_answer_and_writes_nothing(cluster: Cluster) -> None:
    """The same CancelJob sent again answers "cancelled" as the first did and writes nothing."""
    submitted = await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec()))
    request = pb.CancelJobRequest(job_id=submitted.job_id, idempotency_key="cancel-1")
    first = await cluster.client_of(0).call("cancel_job", request)
    version = await row_version(cluster.admin, submitted.job_id)
    again = await cluster.client_of(1).call("cancel_job", request)
    assert (first.state, again.state) == ("cancelled", "cancelled")
    assert await row_version(cluster.admin, submitted.job_id) == version


async def test_the_same_key_with_another_request_is_refused_naming_the_first(cluster: Cluster) -> None:
    """A key reused for another job, another batch, another call or another job to cancel is
    refused with ALREADY_EXISTS naming the job the first request created or cancelled, and
    nothing is stored."""
    first = await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec(), idempotency_key="k-1"))
    batch = await cluster.client.call(
        "submit_jobs", pb.SubmitJobsRequest(specs=[spec("a"), spec("b")], idempotency_key="k-2")
    )
    cancel = await cluster.client.call(
        "cancel_job", pb.CancelJobRequest(job_id=first.job_id, idempotency_key="k-3")
    )
    assert cancel.state == "cancelled"
    before = (await job_rows(cluster.admin), await row_version(cluster.admin, first.job_id))
    a, b = batch.job_ids
    refused = [
        (
            "submit_job",
            pb.SubmitJobRequest(spec=spec(cpu_millis=600), idempotency_key="k-1"),
            f"job {first.job_id}",
        ),
        ("submit_jobs", pb.SubmitJobsRequest(specs=[spec("a")], idempotency_key="k-2"), f"jobs {a}, {b}"),
        ("submit_job", pb.SubmitJobRequest(spec=spec("a"), idempotency_key="k-2"), f"jobs {a}, {b}"),
        ("cancel_job", pb.CancelJobRequest(job_id=a, idempotency_key="k-3"), f"cancelled job {first.job_id}"),
    ]
    for rpc, request, names in refused:
        with pytest.raises(IdempotencyConflict) as info:
            await cluster.client.call(rpc, request)
        message = str(info.value)
        assert f"idempotency_key {request.idempotency_key!r} was first used for" in message
        assert names in message and "nothing was stored" in message
    assert (await job_rows(cluster.admin), await row_version(cluster.admin, first.job_id)) == before
    assert await cluster.admin.fetchval("SELECT count(*) FROM idempotency_keys") == 3


async def test_a_mutating_call_without_a_key_is_refused(cluster: Cluster) -> None:
    """A client that sends no key (not this project's client, which always does) is refused
    with INVALID_ARGUMENT naming the field, and nothing is stored."""
    channel = GrpcChannel(cluster.replicas[0].address)
    try:
        stub = channel.stub(pb.ControlPlaneStub)
        for method, request in [
            (stub.submit_job, pb.SubmitJobRequest(spec=spec())),
            (stub.submit_jobs, pb.SubmitJobsRequest(specs=[spec()])),
            (stub.cancel_job, pb.CancelJobRequest(job_id=1)),
        ]:
            with pytest.raises(InvalidArgument, match="idempotency_key must not be empty"):
                await channel.call(method, request, timeout_s=5.0)
    finally:
        channel.close()
    assert await job_rows(cluster.admin) == []


async def test_a_cancel_of_an_unknown_job_stores_no_key(cluster: Cluster) -> None:
    """NOT_FOUND changed nothing, so it keeps no key: the same key serves once the job exists."""
    request = pb.CancelJobRequest(job_id=1, idempotency_key="cancel-early")
    with pytest.raises(NotFound, match="job_id 1 not found"):
        await cluster.client.call("cancel_job", request)
    assert await cluster.admin.fetchval("SELECT count(*) FROM idempotency_keys") == 0
    submitted = await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec()))
    assert submitted.job_id == 1
    assert (await cluster.client.call("cancel_job", request)).state == "cancelled"


async def test_a_copy_in_progress_elsewhere_makes_the_call_busy_and_stores_nothing(cluster: Cluster) -> None:
    """While another copy holds the key in an open transaction, the call waits for it at most
    the session's lock_timeout and is answered busy, storing nothing; once that copy rolled
    back, the call is carried out once."""
    holder = await PgConnection.connect(cluster.replicas[0].database_url)
    try:
        await holder.execute("BEGIN")
        await holder.execute(
            "INSERT INTO idempotency_keys (key, rpc, request_sha256, answer)"
            " VALUES ('k-1', 'submit_job', '', '[]')"
        )
        with pytest.raises(ClusterBusy, match="another copy of this call may still be in progress"):
            await cluster.client_of(0, busy_retry_s=0.0).call(
                "submit_job", pb.SubmitJobRequest(spec=spec(), idempotency_key="k-1")
            )
        await holder.execute("ROLLBACK")
    finally:
        await holder.close()
    assert await job_rows(cluster.admin) == []
    reply = await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec(), idempotency_key="k-1"))
    assert await job_rows(cluster.admin) == [(reply.job_id, "j")]


async def test_copies_sent_at_once_to_both_replicas_store_one_job(cluster: Cluster) -> None:
    """Ten copies of one submission, five at each replica at once: one job, and every copy is
    answered with its id."""
    request = pb.SubmitJobRequest(spec=spec(), idempotency_key="at-once")
    answers: list[int] = []

    async def send(index: int) -> None:
        answers.append((await cluster.client_of(index % 2).call("submit_job", request)).job_id)

    async with trio.open_nursery() as nursery:
        for index in range(10):
            nursery.start_soon(send, index)
    rows = await job_rows(cluster.admin)
    assert len(rows) == 1 and answers == [rows[0][0]] * 10


async def test_keys_are_kept_for_their_retention_and_then_swept(cluster: Cluster) -> None:
    """The sweep deletes keys stored longer ago than the retention and keeps the others; a
    copy arriving after its key was swept is a new call (the documented lifetime)."""
    old = await cluster.client.call(
        "submit_job", pb.SubmitJobRequest(spec=spec("old"), idempotency_key="old")
    )
    await cluster.client.call("submit_job", pb.SubmitJobRequest(spec=spec("new"), idempotency_key="new"))
    await cluster.admin.execute(
        "UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'old'"
    )
    service = cluster.replicas[1].service
    assert service is not None
    assert await service.sweep_idempotency_keys() == 1
    assert [r["key"] for r in await cluster.admin.fetch("SELECT key FROM idempotency_keys")] == ["new"]
    late = await cluster.client.call(
        "submit_job", pb.SubmitJobRequest(spec=spec("old"), idempotency_key="old")
    )
    assert late.job_id != old.job_id


def registration(**fields: object) -> pb.RegisterWorkerRequest:
    values: dict[str, object] = dict(
        worker_id="w-1",
        address="127.0.0.1:9",
        cpu_millis=4000,
        memory_mb=8192,
        agent_run_id="run-1",
        registration_seq=1,
    )
    values.update(fields)
    return pb.RegisterWorkerRequest(**values)  # type: ignore[arg-type]


async def test_a_registration_copy_asking_for_something_else_is_refused(cluster: Cluster) -> None:
    """(worker, agent run, number) is a registration's idempotency key: a copy gets the first
    incarnation; a copy with another address, capacity or labels is refused with ALREADY_EXISTS
    naming that incarnation, and changes nothing."""
    first = await cluster.client_of(0).call("register_worker", registration())
    assert (
        await cluster.client_of(1).call("register_worker", registration())
    ).incarnation == first.incarnation
    for changed in ({"address": "127.0.0.1:10"}, {"cpu_millis": 8000}, {"labels": {"zone": "b"}}):
        with pytest.raises(IdempotencyConflict) as info:
            await cluster.client.call("register_worker", registration(**changed))
        assert f"it created incarnation {first.incarnation}" in str(info.value)
    row = await cluster.admin.fetchrow(
        "SELECT address, cpu_millis, incarnation FROM workers WHERE id = 'w-1'"
    )
    assert row is not None and tuple(row) == ("127.0.0.1:9", 4000, first.incarnation)


async def test_a_registration_without_a_run_id_is_refused(cluster: Cluster) -> None:
    """Without agent_run_id a retried registration could not be told from a new one: refused,
    naming the field, and no worker is stored."""
    channel = GrpcChannel(cluster.replicas[0].address)
    try:
        with pytest.raises(InvalidArgument, match="agent_run_id must not be empty"):
            await channel.call(
                channel.stub(pb.ControlPlaneStub).register_worker,
                registration(agent_run_id="", registration_seq=0),
                timeout_s=5.0,
            )
    finally:
        channel.close()
    assert await cluster.admin.fetchval("SELECT count(*) FROM workers") == 0


async def test_the_cli_run_again_with_its_key_answers_as_the_first_run(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade submit --idempotency-key K` run twice prints one job id and stores one job;
    with another request under K it exits 2 naming that job; `stockade cancel` likewise."""
    monkeypatch.setenv(INSECURE_ENV, "1")  # the replicas here serve plaintext
    addresses = ",".join(r.address for r in cluster.replicas)

    async def stockade(*args: str) -> Result:
        # The replicas run in this process, and structlog's default prints to the stdout that
        # CliRunner captures: their log lines are kept out of the command's output.
        with structlog.testing.capture_logs():
            return await trio.to_thread.run_sync(
                lambda: CliRunner().invoke(app, [*args, "--control-planes", addresses])
            )

    job = ["submit", "--cpu-millis", "500", "--memory-mb", "256"]
    submit = [*job, "--sleep-s", "1", "--idempotency-key", "cli-1"]
    first, again = await stockade(*submit), await stockade(*submit)
    assert (first.exit_code, again.exit_code) == (0, 0)
    assert first.output == again.output == "1\n"
    assert await job_rows(cluster.admin) == [(1, "sleep")]
    other = await stockade(*job, "--sleep-s", "2", "--idempotency-key", "cli-1")
    assert other.exit_code == EXIT_INVALID
    refusal = "idempotency_key 'cli-1' was first used for submit_job with another request (it created job 1)"
    assert refusal in other.output
    cancels = [await stockade("cancel", "1", "--idempotency-key", "cli-2") for _ in range(2)]
    assert [c.output for c in cancels] == ["job 1: cancelled\n"] * 2
    assert await job_rows(cluster.admin) == [(1, "sleep")]
