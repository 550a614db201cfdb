"""The ingest under overload, over real gRPC on a real PostgreSQL: a client that gives up does
not cost the replica its connection, liveness work is answered while new work is refused as
busy (nothing stored), and the client moves on, backs off and gets through."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
from prometheus_client import REGISTRY
from serving import serve_ingests

from actors.ingest import ControlPlaneService, Ingest
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import (
    GrpcChannel,
    PgConnection,
    asyncio_bridge,
    grpc_server,
    rpc_deadline,
    serve_grpc,
    trio_service,
)
from runtime.aio.grpc_access import Caller
from runtime.backoff import FullJitterBackoff
from runtime.client import ControlPlaneClient
from runtime.errors import Busy, ClusterBusy, DeadlineExceeded, Unavailable
from runtime.idempotency_keys import with_idempotency_key
from runtime.settings.control_plane import IngestSettings

# 3 connections: 2 for any work, 1 only for liveness; nothing may wait for one.
SETTINGS = IngestSettings(
    pool_size=3, liveness_reserved_connections=1, max_waiting_requests=0, shed_lag_s=60.0
)
"""Not shed for loop lag (a machine busy with other work lags at any time): only the rules a test
sets up refuse; the test of lag shedding sets ``shed_lag_s`` back and feeds the lag itself."""

INGEST_BACKENDS = "SELECT array_agg(pid ORDER BY pid) FROM pg_stat_activity WHERE application_name = $1"


def service(ingest: Ingest) -> ControlPlaneService:
    assert ingest.service is not None
    return ingest.service


@attrs.frozen
class Held:
    """Connections a test holds; :meth:`release` gives them back and returns once they are."""

    done: trio.Event
    returned: trio.Event

    async def release(self) -> None:
        self.done.set()
        await self.returned.wait()


async def hold_other_connections(nursery: trio.Nursery, ingest: Ingest) -> Held:
    """Borrow every connection other work may use, as slow listings would."""
    count = SETTINGS.pool_size - SETTINGS.liveness_reserved_connections
    held = Held(done=trio.Event(), returned=trio.Event())
    left = [count]

    async def hold(*, task_status: trio.TaskStatus[None]) -> None:
        async with service(ingest).database("list_jobs"):
            task_status.started()
            await held.done.wait()
        left[0] -= 1
        if not left[0]:
            held.returned.set()

    for _ in range(count):
        await nursery.start(hold)
    return held


def shed_count(rpc: str) -> float:
    return REGISTRY.get_sample_value("stockade_ingest_shed_requests_total", {"rpc": rpc}) or 0.0


def one_job() -> pb.SubmitJobsRequest:
    """A new submission, with its key (as the client sends it; some tests bypass the client)."""
    return with_idempotency_key(
        pb.SubmitJobsRequest(
            specs=[pb.JobSpec(name="j", cpu_millis=100, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=10))]
        )
    )


def registration(worker_id: str = "w-1") -> pb.RegisterWorkerRequest:
    """A new registration, with its key (agent run id and number)."""
    return with_idempotency_key(
        pb.RegisterWorkerRequest(worker_id=worker_id, address="127.0.0.1:9", cpu_millis=1000, memory_mb=1000)
    )


async def wait_until(predicate: Callable[[], Any], timeout_s: float = 30.0) -> None:
    with trio.fail_after(timeout_s):
        while True:
            if await predicate():
                return
            await trio.sleep(0.02)


async def test_a_heartbeat_whose_client_gives_up_keeps_its_connection_and_is_recorded(
    database_url: str,
) -> None:
    """The client's deadline passes while the heartbeat's statement waits for a row lock: the
    statement is not cancelled, so the pool keeps the same server processes, and the
    heartbeat is recorded once the lock is free."""
    # Room for a slow machine between the client giving up and the lock being released.
    settings = attrs.evolve(SETTINGS, lock_timeout_s=3.0)
    async with serve_ingests(database_url, "cp-1", settings=settings) as (ingest,):
        client = ControlPlaneClient([ingest.address], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        try:
            reg = await client.call("register_worker", registration())
            backends = await admin.fetchval(INGEST_BACKENDS, "stockade cp-1 ingest")
            assert len(backends) == SETTINGS.pool_size
            before = await admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'")
            await admin.execute("BEGIN")
            await admin.execute("SELECT 1 FROM workers WHERE id = 'w-1' FOR UPDATE")
            with pytest.raises(Unavailable):
                await client.call(
                    "heartbeat",
                    pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation),
                    timeout_s=0.3,
                )
            waiting = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'stockade cp-1 ingest'"
                " AND wait_event_type = 'Lock'"
            )
            await admin.execute("ROLLBACK")
            assert waiting == 1  # the heartbeat's statement was still running when its client gave up

            async def recorded() -> bool:
                now = await admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'")
                return bool(now > before)

            await wait_until(recorded)
            await client.call("heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation))
            assert await admin.fetchval(INGEST_BACKENDS, "stockade cp-1 ingest") == backends
        finally:
            client.close()
            await admin.close()


async def test_a_heartbeat_that_gets_no_connection_before_its_deadline_does_no_database_work(
    database_url: str,
) -> None:
    """With every connection taken, a heartbeat waits; when its deadline passes it is dropped
    without touching the database, even after connections free up."""
    async with (
        serve_ingests(database_url, "cp-1", settings=SETTINGS) as (ingest,),
        trio.open_nursery() as nursery,
    ):
        client = ControlPlaneClient([ingest.address], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        try:
            reg = await client.call("register_worker", registration())
            before = await admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'")
            held = await hold_other_connections(nursery, ingest)
            await service(ingest).gate.acquire(liveness=True)  # and the reserved one
            with pytest.raises(Unavailable):
                await client.call(
                    "heartbeat",
                    pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation),
                    timeout_s=0.2,
                )
            service(ingest).gate.release(liveness=True)
            await held.release()
            await trio.sleep(0.2)
            assert await admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = 'w-1'") == before
            assert service(ingest).gate.held == 0
        finally:
            client.close()
            await admin.close()


async def test_new_work_is_refused_as_busy_while_liveness_work_is_answered(database_url: str) -> None:
    """With the connections for other work all taken and no waiting allowed, SubmitJobs gets
    RESOURCE_EXHAUSTED naming the replica and stores nothing; heartbeats and registrations
    are answered from the reserved connection; the refusal is counted by rpc."""
    async with (
        serve_ingests(database_url, "cp-1", settings=SETTINGS) as (ingest,),
        trio.open_nursery() as nursery,
    ):
        channel = GrpcChannel(ingest.address)
        admin = await PgConnection.connect(database_url)
        try:
            stub = channel.stub(pb.ControlPlaneStub)
            reg = await channel.call(stub.register_worker, registration(), timeout_s=5.0)
            held = await hold_other_connections(nursery, ingest)
            shed_before = shed_count("submit_jobs")
            with pytest.raises(Busy) as info:
                await channel.call(stub.submit_jobs, one_job(), timeout_s=5.0)
            assert "busy: cp-1 is overloaded" in str(info.value)
            assert "2 requests in progress, limit 2; 0 waiting, limit 0), try another replica" in str(
                info.value
            )
            assert shed_count("submit_jobs") == shed_before + 1
            with pytest.raises(Busy):
                await channel.call(stub.status, pb.StatusRequest(), timeout_s=5.0)
            beat = await channel.call(
                stub.heartbeat,
                pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation),
                timeout_s=5.0,
            )
            again = await channel.call(stub.register_worker, registration("w-2"), timeout_s=5.0)
            assert not beat.reregister and again.incarnation > reg.incarnation
            assert await admin.fetchval("SELECT count(*) FROM jobs") == 0
            await held.release()
            await channel.call(stub.submit_jobs, one_job(), timeout_s=5.0)
            assert await admin.fetchval("SELECT count(*) FROM jobs") == 1
        finally:
            channel.close()
            await admin.close()


async def test_new_work_is_refused_while_the_ingest_loop_lags(database_url: str) -> None:
    """A recent event-loop lag above shed_lag_s refuses Status, naming the lag, while a
    heartbeat is still answered."""
    settings = attrs.evolve(SETTINGS, shed_lag_s=0.25)
    async with serve_ingests(database_url, "cp-1", settings=settings) as (ingest,):
        client = ControlPlaneClient([ingest.address], timeout_s=5.0, busy_retry_s=0.0)
        try:
            reg = await client.call("register_worker", registration())
            now = trio.current_time()
            ingest.lag.observe(due=now - 0.5, woke=now)  # a wake 0.5 s late, as a stalled loop gives
            with pytest.raises(ClusterBusy) as refused:
                await client.call("status", pb.StatusRequest())
            # The worst lag of the last second: the one fed, or a worse one of a busy machine.
            named = re.search(
                r"busy: cp-1 is overloaded \(event loop lag (\d+\.\d\d) s, limit 0\.25 s", str(refused.value)
            )
            assert named is not None and float(named[1]) >= 0.5, str(refused.value)
            beat = await client.call(
                "heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation)
            )
            assert not beat.reregister
        finally:
            client.close()


async def test_the_client_takes_a_busy_replicas_work_to_the_next_one(database_url: str) -> None:
    """cp-1 is busy, cp-2 is not: the submission is stored once, by cp-2, without waiting."""
    async with (
        serve_ingests(database_url, "cp-1", "cp-2", settings=SETTINGS) as (busy, free),
        trio.open_nursery() as nursery,
    ):
        held = await hold_other_connections(nursery, busy)
        client = ControlPlaneClient([busy.address, free.address], timeout_s=5.0)
        admin = await PgConnection.connect(database_url)
        try:
            started = trio.current_time()
            await client.call("submit_jobs", one_job())
            assert trio.current_time() - started < 1.0
            assert client.last_answered == free.address
            assert await admin.fetchval("SELECT count(*) FROM jobs") == 1
        finally:
            await held.release()
            client.close()
            await admin.close()


def stage_count(rpc: str, stage: str) -> float:
    return (
        REGISTRY.get_sample_value("stockade_ingest_stage_seconds_count", {"rpc": rpc, "stage": stage}) or 0.0
    )


async def test_a_heartbeats_turn_wait_and_database_time_are_observed(database_url: str) -> None:
    """Each heartbeat adds one observation of its turn's wait and one of its database time,
    so an operator can tell a heartbeat that waited for a turn from one that waited for the
    database."""
    async with serve_ingests(database_url, "cp-1", settings=SETTINGS) as (ingest,):
        client = ControlPlaneClient([ingest.address], timeout_s=5.0)
        try:
            reg = await client.call("register_worker", registration())
            before = (stage_count("heartbeat", "turn"), stage_count("heartbeat", "database"))
            for _ in range(3):
                await client.call(
                    "heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation)
                )
            after = (stage_count("heartbeat", "turn"), stage_count("heartbeat", "database"))
            assert (after[0] - before[0], after[1] - before[1]) == (3.0, 3.0)
        finally:
            client.close()


async def test_submissions_are_refused_while_the_queue_is_full_and_taken_again_once_it_drains(
    database_url: str,
) -> None:
    """max_pending_jobs=3: a batch of 3 is taken whole; the next submission (one job, or a
    batch) is refused busy, naming the queue and the limit, and nothing of it is stored, while
    heartbeats and listings are answered; once the queue drains (jobs cancelled) and the count
    is older than pending_count_max_age_s, a submission is taken again."""
    settings = attrs.evolve(SETTINGS, max_pending_jobs=3, pending_count_max_age_s=0.2)
    three = pb.SubmitJobsRequest(specs=one_job().specs * 3)
    async with serve_ingests(database_url, "cp-1", settings=settings) as (ingest,):
        client = ControlPlaneClient([ingest.address], timeout_s=5.0, busy_retry_s=0)
        admin = await PgConnection.connect(database_url)
        try:
            assert len((await client.call("submit_jobs", three)).job_ids) == 3
            shed_before = shed_count("submit_jobs")
            with pytest.raises(ClusterBusy, match=r"3 jobs pending .* limit 3 \(max_pending_jobs\)"):
                await client.call("submit_jobs", three)
            with pytest.raises(ClusterBusy, match=r"limit 3 \(max_pending_jobs\)"):
                await client.call("submit_job", pb.SubmitJobRequest(spec=one_job().specs[0]))
            assert shed_count("submit_jobs") == shed_before + 1
            assert await admin.fetchval("SELECT count(*) FROM jobs") == 3
            reg = await client.call("register_worker", registration())
            await client.call("heartbeat", pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation))
            assert len((await client.call("list_jobs", pb.ListJobsRequest())).jobs) == 3
            await admin.execute("UPDATE jobs SET state = 'cancelled', finished_at = now()")
            await trio.sleep(0.3)
            assert len((await client.call("submit_jobs", three)).job_ids) == 3
        finally:
            client.close()
            await admin.close()


async def test_the_client_backs_off_while_every_replica_is_busy_then_gets_through(database_url: str) -> None:
    """Both replicas are busy; the client keeps asking, with pauses, and its submission is
    stored exactly once as soon as cp-2 has room again."""
    async with (
        serve_ingests(database_url, "cp-1", "cp-2", settings=SETTINGS) as (first, second),
        trio.open_nursery() as nursery,
    ):
        held_first = await hold_other_connections(nursery, first)
        held_second = await hold_other_connections(nursery, second)
        client = ControlPlaneClient(
            [first.address, second.address],
            timeout_s=5.0,
            busy_retry_s=20.0,
            busy_backoff=FullJitterBackoff(base_s=0.05, cap_s=0.2),
        )
        admin = await PgConnection.connect(database_url)
        try:
            shed_before = shed_count("submit_jobs")
            answered = trio.Event()

            async def submit() -> None:
                await client.call("submit_jobs", one_job())
                answered.set()

            nursery.start_soon(submit)

            async def asked_both_more_than_once() -> bool:
                return shed_count("submit_jobs") - shed_before >= 4

            await wait_until(asked_both_more_than_once)
            assert not answered.is_set()
            await held_second.release()
            with trio.fail_after(15.0):  # within the client's busy_retry_s
                await answered.wait()
            assert client.last_answered == second.address
            assert await admin.fetchval("SELECT count(*) FROM jobs") == 1
        finally:
            held_first.done.set()
            held_second.done.set()
            client.close()
            await admin.close()


def expired_count(rpc: str) -> float:
    return REGISTRY.get_sample_value("stockade_ingest_expired_requests_total", {"rpc": rpc}) or 0.0


async def test_a_request_whose_deadline_has_passed_is_not_started(database_url: str) -> None:
    """A request that reaches its handler after its client's deadline does no database work,
    holds no connection, answers DEADLINE_EXCEEDED and is counted by rpc."""
    async with serve_ingests(database_url, "cp-1", settings=SETTINGS) as (ingest,):
        admin = await PgConnection.connect(database_url)
        try:
            before = expired_count("submit_jobs")
            with pytest.raises(DeadlineExceeded, match="submit_jobs: the client's deadline passed"):
                # What trio_service runs for a request handed over 10 ms after its deadline.
                late = time.monotonic() - 0.01
                await grpc_server._served_in_trio(
                    functools.partial(service(ingest).submit_jobs, one_job()), late, Caller(address="-")
                )
            assert expired_count("submit_jobs") == before + 1
            assert service(ingest).gate.held == 0
            assert await admin.fetchval("SELECT count(*) FROM jobs") == 0
        finally:
            await admin.close()


@attrs.define
class ScriptedControlPlane:
    """A ControlPlane service whose handlers record their deadline or refuse as scripted."""

    time_left_s: list[float] = attrs.field(factory=list)
    called_at: list[float] = attrs.field(factory=list)
    """When each status handler ran (``trio.current_time()``: the test's loop, which serves too)."""

    async def status(self, request: pb.StatusRequest) -> pb.StatusReply:
        self.called_at.append(trio.current_time())
        self.time_left_s.append(rpc_deadline() - self.called_at[-1])
        return pb.StatusReply(answered_by="scripted")

    async def submit_job(self, request: pb.SubmitJobRequest) -> pb.SubmitJobReply:
        raise Busy("busy: cp-9 is overloaded (scripted), try another replica")

    async def get_job(self, request: pb.GetJobRequest) -> pb.JobInfo:
        raise DeadlineExceeded("get_job: the client's deadline passed before the request could start")


async def test_handlers_learn_the_deadline_and_their_refusals_reach_the_client() -> None:
    """Over real gRPC: a handler sees its client's deadline (a 2 s call leaves it at most 2 s,
    less the time the request took to reach it),
    Busy arrives as Busy (RESOURCE_EXHAUSTED) with its message, DeadlineExceeded as a
    retryable DEADLINE_EXCEEDED."""
    impl = ScriptedControlPlane()
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, [trio_service(ControlPlaneBase, impl)], "127.0.0.1", 0)
        channel = GrpcChannel(f"127.0.0.1:{port}")
        try:
            stub = channel.stub(pb.ControlPlaneStub)
            sent_at = trio.current_time()
            await channel.call(stub.status, pb.StatusRequest(), timeout_s=2.0)
            (time_left_s,) = impl.time_left_s
            # At most the 2 s, less what passed between the call and its handler (a busy machine
            # may take long over that) and a little for the rounding of grpc-timeout.
            on_the_way_s = impl.called_at[0] - sent_at
            assert 2.0 - on_the_way_s - 0.05 < time_left_s <= 2.0, (time_left_s, on_the_way_s)
            with pytest.raises(Busy, match=r"127\.0\.0\.1:\d+: busy: cp-9 is overloaded \(scripted\)"):
                await channel.call(stub.submit_job, pb.SubmitJobRequest(), timeout_s=2.0)
            with pytest.raises(Unavailable, match="DEADLINE_EXCEEDED: get_job: the client's deadline passed"):
                await channel.call(stub.get_job, pb.GetJobRequest(job_id=1), timeout_s=2.0)
        finally:
            channel.close()
            nursery.cancel_scope.cancel()
