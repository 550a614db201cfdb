"""Ingest over real gRPC on a real PostgreSQL, with no leader at all: submissions,
registrations and heartbeats are recorded by any replica; bad input is refused with
INVALID_ARGUMENT or NOT_FOUND naming the field, and nothing is stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY
from serving import serve_ingests

from protocol import pb
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument, NoControlPlaneReachable, NotFound
from runtime.settings.control_plane import IngestSettings


@pytest.fixture
async def client(
    database_url: str,
) -> AsyncIterator[tuple[ControlPlaneClient, PgConnection]]:
    """A client of one ingest actor (no lease keeper, no leader), and an admin connection."""
    settings = IngestSettings(pool_size=2, liveness_reserved_connections=1)
    async with serve_ingests(database_url, "cp-1", settings=settings, presence_interval_s=1.0) as (ingest,):
        cp = ControlPlaneClient([ingest.address], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        try:
            yield cp, admin
        finally:
            cp.close()
            await admin.close()


def sleep_job(**fields: object) -> pb.SubmitJobRequest:
    spec = dict(name="j", cpu_millis=500, memory_mb=256, sleep=pb.SleepRuntime(duration_ms=1000))
    spec.update(fields)
    return pb.SubmitJobRequest(spec=pb.JobSpec(**spec))  # type: ignore[arg-type]


async def test_submissions_registrations_and_heartbeats_need_no_leader(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """With the lease never taken, a job is stored pending, a worker registers with a fresh
    incarnation, and its heartbeat is recorded (the reply carries epoch 0)."""
    cp, _ = client
    submitted = await cp.call("submit_job", sleep_job())
    job = await cp.call("get_job", pb.GetJobRequest(job_id=submitted.job_id))
    assert (job.state, job.spec.cpu_millis, job.spec.sleep.duration_ms) == ("pending", 500, 1000)
    first = await cp.call(
        "register_worker",
        pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=4000, memory_mb=8192),
    )
    second = await cp.call(
        "register_worker",
        pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=4000, memory_mb=8192),
    )
    assert second.incarnation > first.incarnation
    stale = await cp.call("heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=first.incarnation))
    assert stale.reregister  # the previous life is over
    beat = await cp.call(
        "heartbeat",
        pb.HeartbeatRequest(worker_id="w-1", incarnation=second.incarnation, running_assignment_ids=[42]),
    )
    assert (beat.reregister, beat.epoch, list(beat.stop_assignment_ids)) == (False, 0, [42])
    status = await cp.call("status", pb.StatusRequest())
    assert status.leader == "" and [w.id for w in status.workers] == ["w-1"]


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"cpu_millis": 0}, "cpu_millis must be between 1 and 1000000, got 0"),
        ({"memory_mb": 10**9}, "memory_mb must be between 1 and 16777216, got 1000000000"),
        ({"name": ""}, "name must not be empty"),
        ({"name": "n" * 500}, "name must be at most 128 bytes in UTF-8"),
        ({"name": "a\x00b"}, "name must not contain NUL bytes"),
        ({"sleep": None}, "runtime must be exactly one of sleep, command or container"),
        (
            {"sleep": None, "command": pb.CommandRuntime(argv=["env"]), "env": {"A B": "x"}},
            "env name must be a letter or _ then letters, digits or _ ([A-Za-z_][A-Za-z0-9_]*), got 'A B'",
        ),
    ],
)
async def test_bad_submissions_are_refused_and_nothing_is_stored(
    client: tuple[ControlPlaneClient, PgConnection], request_fields: dict[str, object], message: str
) -> None:
    """INVALID_ARGUMENT names the field, the value and the limit; the jobs table stays empty."""
    cp, admin = client
    with pytest.raises(InvalidArgument) as info:
        await cp.call("submit_job", sleep_job(**request_fields))
    assert message in str(info.value)
    assert await admin.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_container_job_is_stored_with_its_image_and_read_back_as_submitted(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """A container job (single or in a batch) is stored with runtime 'container', its image and
    its argv (empty: the image's own command), and reads back as it was sent."""
    cp, admin = client
    container = pb.ContainerRuntime(image="registry.example:5000/app:1.2", argv=["python3", "-c", "1"])
    one = await cp.call(
        "submit_job",
        pb.SubmitJobRequest(spec=pb.JobSpec(name="c", cpu_millis=500, memory_mb=64, container=container)),
    )
    job = await cp.call("get_job", pb.GetJobRequest(job_id=one.job_id))
    assert job.spec.container == container and job.spec.command is None and job.spec.sleep is None
    bare = pb.JobSpec(name="b", cpu_millis=10, memory_mb=6, container=pb.ContainerRuntime(image="app"))
    many = await cp.call("submit_jobs", pb.SubmitJobsRequest(specs=[bare, bare]))
    rows = await admin.fetch("SELECT runtime, image, argv FROM jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [
        ("container", "registry.example:5000/app:1.2", ["python3", "-c", "1"]),
        ("container", "app", []),
        ("container", "app", []),
    ]
    again = await cp.call("get_job", pb.GetJobRequest(job_id=many.job_ids[0]))
    assert again.spec.container == pb.ContainerRuntime(image="app")


async def test_a_bad_image_is_refused_and_nothing_is_stored(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """An image that is a path or shell syntax is refused naming container.image."""
    cp, admin = client
    for image in ("/etc/passwd", "app;id"):
        spec = pb.JobSpec(name="c", cpu_millis=1, memory_mb=1, container=pb.ContainerRuntime(image=image))
        with pytest.raises(InvalidArgument, match=r"^container\.image "):
            await cp.call("submit_job", pb.SubmitJobRequest(spec=spec))
    assert await admin.fetchval("SELECT count(*) FROM jobs") == 0


async def test_unknown_job_ids_are_not_found(client: tuple[ControlPlaneClient, PgConnection]) -> None:
    """GetJob and CancelJob of an id that does not exist answer NOT_FOUND naming the id."""
    cp, _ = client
    with pytest.raises(NotFound, match="job_id 77 not found"):
        await cp.call("get_job", pb.GetJobRequest(job_id=77))
    with pytest.raises(NotFound, match="job_id 77 not found"):
        await cp.call("cancel_job", pb.CancelJobRequest(job_id=77))


async def test_bad_registrations_are_refused(client: tuple[ControlPlaneClient, PgConnection]) -> None:
    """A registration with a bad id or no port stores no worker."""
    cp, admin = client
    with pytest.raises(InvalidArgument, match="worker_id"):
        await cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(worker_id="../etc", address="127.0.0.1:9", cpu_millis=1, memory_mb=1),
        )
    with pytest.raises(InvalidArgument, match="address must be host:port"):
        await cp.call(
            "register_worker",
            pb.RegisterWorkerRequest(worker_id="w-1", address="nowhere", cpu_millis=1, memory_mb=1),
        )
    assert await admin.fetchval("SELECT count(*) FROM workers") == 0


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        *(
            ({"address": address}, "address", address)
            for address in ("a b:80", "http://h:80", "a:b:80", "h\n:80", " :80", "-:1", "host:0080")
        ),
        ({"worker_id": "x 1"}, "worker_id", "x 1"),
        ({"labels": {"zone\n": "a"}}, "labels key", "zone\n"),
        ({"labels": {"zone": "a b"}}, "labels[zone]", "a b"),
        ({"agent_run_id": "r\x1b[2J", "registration_seq": 1}, "agent_run_id", "r\x1b[2J"),
    ],
)
async def test_a_registration_with_a_malformed_identity_stores_no_worker(
    client: tuple[ControlPlaneClient, PgConnection], changes: dict[str, object], field: str, value: object
) -> None:
    """The issue's addresses (and a bad id, label key, label value or run id) in an otherwise good
    registration: INVALID_ARGUMENT naming the field and the value, and no worker is stored."""
    cp, admin = client
    request: dict[str, Any] = dict(worker_id="x-1", address="127.0.0.1:80", cpu_millis=1000, memory_mb=1024)
    request.update(changes)
    with pytest.raises(InvalidArgument) as info:
        await cp.call("register_worker", pb.RegisterWorkerRequest(**request))
    assert str(info.value).startswith(f"{field} must ")
    assert str(info.value).endswith(f"got {value!r}")
    assert await admin.fetchval("SELECT count(*) FROM workers") == 0


async def test_cancelling_a_pending_job_cancels_it_at_once(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """A pending job is cancelled by ingest itself; there is nothing to stop."""
    cp, _ = client
    submitted = await cp.call("submit_job", sleep_job())
    reply = await cp.call("cancel_job", pb.CancelJobRequest(job_id=submitted.job_id))
    assert reply.state == "cancelled"
    job = await cp.call("get_job", pb.GetJobRequest(job_id=submitted.job_id))
    assert job.state == "cancelled"


async def test_a_batch_is_stored_in_order_or_not_at_all(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """SubmitJobs returns ids in the order of the specs (commands included); one bad spec
    refuses the whole batch, naming its index, and stores nothing."""
    cp, admin = client
    specs = [
        pb.JobSpec(name=f"b{i}", cpu_millis=100 + i, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=i))
        for i in range(5)
    ]
    specs.append(
        pb.JobSpec(name="cmd", cpu_millis=1, memory_mb=1, command=pb.CommandRuntime(argv=["echo", "a b"]))
    )
    reply = await cp.call("submit_jobs", pb.SubmitJobsRequest(specs=specs))
    assert len(reply.job_ids) == 6 and list(reply.job_ids) == sorted(reply.job_ids)
    rows = await admin.fetch("SELECT name, cpu_millis, argv FROM jobs ORDER BY id")
    assert [r["name"] for r in rows] == ["b0", "b1", "b2", "b3", "b4", "cmd"]
    assert rows[5]["argv"] == ["echo", "a b"]
    bad = [*specs[:2], pb.JobSpec(name="x", cpu_millis=0, memory_mb=1, sleep=pb.SleepRuntime(duration_ms=1))]
    with pytest.raises(InvalidArgument, match=r"specs\[2\]\.cpu_millis must be between 1 and 1000000, got 0"):
        await cp.call("submit_jobs", pb.SubmitJobsRequest(specs=bad))
    assert await admin.fetchval("SELECT count(*) FROM jobs") == 6


async def test_a_replica_frozen_mid_heartbeat_does_not_block_that_worker_for_long(
    client: tuple[ControlPlaneClient, PgConnection], database_url: str
) -> None:
    """A session with ingest's settings that stops inside a heartbeat transaction (its
    replica frozen) is ended by the server (idle in transaction), which frees its row lock, so
    the worker's heartbeats through another replica get through again without waiting for the
    frozen replica."""
    from actors import queries
    from actors.ingest_gate import SESSION_SETTINGS

    cp, admin = client
    reg = await cp.call(
        "register_worker",
        pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=1000, memory_mb=1000),
    )
    frozen = await PgConnection.connect(database_url, server_settings=dict(SESSION_SETTINGS))
    try:
        frozen_pid = await frozen.fetchval("SELECT pg_backend_pid()")
        still_there = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"
        await frozen.execute("BEGIN")
        await frozen.fetchrow(
            queries.HEARTBEAT, "w-1", reg.incarnation, *[[]] * 9, 0, 0, 250, 2500
        )  # holds the row
        with trio.fail_after(30.0):
            while True:
                try:
                    beat = await cp.call(
                        "heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation)
                    )
                    break
                except NoControlPlaneReachable:
                    await trio.sleep(0.05)  # lock_timeout: the worker would try another replica
        assert not beat.reregister
        # The frozen session never committed nor rolled back: the server ended it (its process
        # leaves pg_stat_activity as it exits, just after it let the lock go).
        with trio.fail_after(30.0):
            while await admin.fetchval(still_there, frozen_pid):  # noqa: ASYNC110 (the server's state)
                await trio.sleep(0.05)
    finally:
        frozen.terminate()


async def test_one_heartbeat_statement_confirms_records_outcomes_and_names_what_to_stop(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """The first heartbeat listing an assignment confirms it (its job runs); an id not active
    on the worker is to be stopped; a finished outcome ends its assignment and job, and is
    recorded even when it comes from an incarnation that has to register again."""
    cp, admin = client
    reg = await cp.call(
        "register_worker",
        pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=4000, memory_mb=4000),
    )
    first = (await cp.call("submit_job", sleep_job())).job_id
    second = (await cp.call("submit_job", sleep_job())).job_id
    a1, a2 = [
        await admin.fetchval(
            "INSERT INTO assignments (job_id, worker_id, worker_incarnation, cpu_millis, memory_mb, epoch)"
            " VALUES ($1, 'w-1', $2, 500, 256, 0) RETURNING id",
            job_id,
            reg.incarnation,
        )
        for job_id in (first, second)
    ]
    await admin.execute("UPDATE jobs SET state = 'assigned'")
    beat = await cp.call(
        "heartbeat",
        pb.HeartbeatRequest(
            worker_id="w-1", incarnation=reg.incarnation, running_assignment_ids=[a1, a2, 999]
        ),
    )
    assert (beat.reregister, list(beat.stop_assignment_ids)) == (False, [999])
    assert await admin.fetchval("SELECT count(*) FROM assignments WHERE confirmed_at IS NOT NULL") == 2
    assert [r["state"] for r in await admin.fetch("SELECT state FROM jobs ORDER BY id")] == [
        "running",
        "running",
    ]
    done = pb.JobOutcome(assignment_id=a1, job_id=first, state="succeeded", has_exit_code=True, exit_code=0)
    beat = await cp.call(
        "heartbeat",
        pb.HeartbeatRequest(
            worker_id="w-1", incarnation=reg.incarnation, running_assignment_ids=[a2], finished=[done]
        ),
    )
    assert (beat.reregister, list(beat.stop_assignment_ids)) == (False, [])
    assert await admin.fetchval("SELECT state FROM assignments WHERE id = $1", a1) == "finished"
    assert (
        await admin.fetchval("SELECT state || ' ' || exit_code FROM jobs WHERE id = $1", first)
        == "succeeded 0"
    )
    await cp.call(
        "register_worker",
        pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=4000, memory_mb=4000),
    )
    failed = pb.JobOutcome(assignment_id=a2, job_id=second, state="failed", has_exit_code=True, exit_code=3)
    beat = await cp.call(
        "heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation, finished=[failed])
    )
    assert beat.reregister
    assert (
        await admin.fetchval("SELECT state || ' ' || exit_code FROM jobs WHERE id = $1", second) == "failed 3"
    )


async def test_heartbeats_are_counted_as_recorded_or_answered_reregister(
    client: tuple[ControlPlaneClient, PgConnection],
) -> None:
    """Two heartbeats of the alive incarnation count as recorded; one of an incarnation a
    registration replaced counts as answered reregister, not as recorded."""
    cp, _ = client

    def counts() -> tuple[float, float]:
        return (
            REGISTRY.get_sample_value("stockade_heartbeats_recorded_total") or 0.0,
            REGISTRY.get_sample_value("stockade_heartbeats_reregister_total") or 0.0,
        )

    register = pb.RegisterWorkerRequest(
        worker_id="w-1", address="127.0.0.1:9", cpu_millis=4000, memory_mb=4000
    )
    first = await cp.call("register_worker", register)
    recorded, reregister = counts()
    for _ in range(2):
        await cp.call("heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=first.incarnation))
    assert counts() == (recorded + 2, reregister)
    await cp.call("register_worker", register)
    beat = await cp.call("heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=first.incarnation))
    assert beat.reregister
    assert counts() == (recorded + 2, reregister + 1)


def outcome(**fields: object) -> pb.JobOutcome:
    values: dict[str, object] = dict(
        assignment_id=1, job_id=1, state="succeeded", run_ms=1000, detail="exit 0"
    )
    values.update(fields)
    return pb.JobOutcome(**values)  # type: ignore[arg-type]


BAD_OUTCOMES = [
    (outcome(detail="a\x00b"), r"finished\[0\]\.detail must not contain NUL bytes"),
    (outcome(stdout_path="/tmp/o\x00"), r"finished\[0\]\.stdout_path must not contain NUL bytes"),
    (outcome(stderr_path="/tmp/e\x00"), r"finished\[0\]\.stderr_path must not contain NUL bytes"),
    (outcome(detail="x" * 4097), r"finished\[0\]\.detail must be at most 4096 bytes in UTF-8 \(has 4097\)"),
    (
        outcome(assignment_id=0),
        r"finished\[0\]\.assignment_id must be between 1 and 9223372036854775807, got 0",
    ),
    (
        # Past a bigint: refused as it is decoded (a uint64 holds 0..2**63-1), with the value sent.
        outcome(assignment_id=2**64 - 1),
        r"finished\[0\]\.assignment_id must be between 0 and 9223372036854775807 \(uint64\), "
        r"got 18446744073709551615",
    ),
    (outcome(state="exploded"), r"finished\[0\]\.state must be one of succeeded, failed, cancelled"),
    (
        outcome(run_ms=3_153_600_000_001),
        r"finished\[0\]\.run_ms must be between 0 and 3153600000000, got 3153600000001",
    ),
    (
        outcome(ended_ago_ms=2**63 - 1),
        r"finished\[0\]\.ended_ago_ms must be between 0 and 3153600000000, got 9223372036854775807",
    ),
]


@pytest.mark.parametrize(("bad", "message"), BAD_OUTCOMES)
async def test_a_heartbeat_with_a_bad_outcome_is_refused_naming_the_field_and_records_nothing(
    client: tuple[ControlPlaneClient, PgConnection], bad: pb.JobOutcome, message: str
) -> None:
    """INVALID_ARGUMENT naming the outcome's field, value and limit; the worker's heartbeat
    time is not touched."""
    cp, admin = client
    reg = await cp.call(
        "register_worker",
        pb.RegisterWorkerRequest(worker_id="w-1", address="127.0.0.1:9", cpu_millis=1000, memory_mb=1000),
    )
    before = await admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'")
    with pytest.raises(InvalidArgument, match=message):
        await cp.call(
            "heartbeat",
            pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation, finished=[bad]),
        )
    assert await admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'") == before


@pytest.mark.parametrize(("bad", "message"), BAD_OUTCOMES[:1] + BAD_OUTCOMES[4:5] + BAD_OUTCOMES[6:8])
async def test_a_registration_with_a_bad_outcome_is_refused_naming_the_field_and_records_nothing(
    client: tuple[ControlPlaneClient, PgConnection], bad: pb.JobOutcome, message: str
) -> None:
    """INVALID_ARGUMENT naming the outcome's field; the worker is not registered again."""
    cp, admin = client
    request = pb.RegisterWorkerRequest(
        worker_id="w-1", address="127.0.0.1:9", cpu_millis=1000, memory_mb=1000
    )
    reg = await cp.call("register_worker", request)
    request.finished = [bad]
    with pytest.raises(InvalidArgument, match=message):
        await cp.call("register_worker", request)
    assert await admin.fetchval("SELECT incarnation FROM workers WHERE id = 'w-1'") == reg.incarnation
