"""A flood of large listings against one real ingest (real gRPC, real PostgreSQL), with its
default settings: a worker's heartbeats are still answered promptly, and the listings it has
no turn for are answered busy.

The listings come from another process, as a reviewer's flood did (``python flood.py list 30
40``), so their clients' own decoding does not share the ingest's loop; the heartbeats come
from the test's loop, which the ingest runs on too.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import trio
from prometheus_client import REGISTRY
from serving import serve_ingests

from protocol import pb
from runtime.aio import GrpcChannel
from runtime.errors import Busy
from runtime.idempotency_keys import with_idempotency_key
from runtime.lag import LoopLag

ROOT = Path(__file__).parents[2]
JOBS = 1200
LISTING_CLIENTS = 40
HEARTBEATS = 24
"""Heartbeats sent during the flood (some 6 s of it); the flood goes on until they are all answered."""
HEARTBEAT_INTERVAL_S = 0.25
HEARTBEAT_BOUND_S = 1.0
"""Longest a heartbeat's round trip may take during the flood on a machine with CPU to spare:
with room below the 1.5 s a worker goes without an acknowledged heartbeat before it fences
itself (the typical round trip is bounded separately by HEARTBEAT_MEDIAN_BOUND_S). Measured on
an idle 2-core VM: 0.12 to 0.29 s at most per run, 0.55 s once while other benchmarks ran beside
it; before this work, 0.7 to 2.4 s. On a machine whose CPU other work takes, each bound grows by
what the machine did: the heartbeat's own database stage (its statement, on a server whose CPU
is shared; ``stockade_ingest_stage_seconds{stage="database"}``) and LAG_WAKES times the ingest
loop's worst lag of the last second, as its lag monitor measured it when the heartbeat was
answered. What the rule forbids, a heartbeat waiting for its turn behind listings or for the
loop while their replies are encoded, is in neither."""
HEARTBEAT_MEDIAN_BOUND_S = 0.25
"""The median heartbeat round trip during the flood, plus LAG_WAKES times the median lag:
within one heartbeat interval on an idle machine."""
LAG_WAKES = 3
"""Wakes of the ingest's loop (which is the test's too) in one heartbeat's round trip, each late
by up to the loop's lag: the request read, the database's answer, the reply written."""

FLOOD = """
import collections, json, os, sys, time, trio
from protocol import pb
from runtime.aio import GrpcChannel, asyncio_bridge
from runtime.errors import Busy, StockadeError
address, clients, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counts = collections.Counter()
async def client():
    channel = GrpcChannel(address)
    stub = channel.stub(pb.ControlPlaneStub)
    end = time.monotonic() + 120.0  # a test that failed to stop it
    while time.monotonic() < end and not os.path.exists(stop):
        try:
            reply = await channel.call(stub.list_jobs, pb.ListJobsRequest(limit=1000), timeout_s=5.0)
            counts["answered"] += 1
            counts["rows"] += len(reply.jobs)
        except Busy as exc:
            counts["busy"] += 1
            counts["busy_named"] += "busy: cp-1" in str(exc)
        except StockadeError as exc:
            counts["failed"] += 1
            counts[type(exc).__name__] += 1
    channel.close()
async def main():
    async with asyncio_bridge(), trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    print(json.dumps(dict(counts)))
trio.run(main)
"""


def shed_count(rpc: str) -> float:
    return REGISTRY.get_sample_value("stockade_ingest_shed_requests_total", {"rpc": rpc}) or 0.0


def heartbeats_database_s() -> float:
    """The heartbeats' database stage so far, in seconds (the histogram's sum)."""
    labels = {"rpc": "heartbeat", "stage": "database"}
    return REGISTRY.get_sample_value("stockade_ingest_stage_seconds_sum", labels) or 0.0


async def submit_despite_busy(channel: GrpcChannel, request: pb.SubmitJobsRequest) -> pb.SubmitJobsReply:
    """Submit, again while the ingest answers busy (it sheds work while its loop lags, as it may
    on a machine busy with other work; the same idempotency key each time)."""
    stub = channel.stub(pb.ControlPlaneStub)
    with trio.fail_after(60.0):
        while True:
            try:
                return await channel.call(stub.submit_jobs, request, timeout_s=30.0)
            except Busy:
                await trio.sleep(0.2)


async def heartbeat_round_trips_s(
    channel: GrpcChannel,
    incarnation: int,
    count: int,
    *,
    lags_s: list[float],
    database_s: list[float],
    lag: LoopLag,
    while_: Callable[[], bool] = lambda: True,
) -> list[float]:
    """Round trips of up to ``count`` heartbeats of w-1, one due every HEARTBEAT_INTERVAL_S; the
    loop's worst lag of the last second as each was answered is appended to ``lags_s``, and
    each one's database stage to ``database_s``."""
    stub = channel.stub(pb.ControlPlaneStub)
    round_trips_s: list[float] = []
    due = trio.current_time()
    while while_() and len(round_trips_s) < count:
        await trio.sleep_until(due)
        sent = trio.current_time()
        database_before_s = heartbeats_database_s()
        beat = await channel.call(
            stub.heartbeat, pb.HeartbeatRequest(worker_id="w-1", incarnation=incarnation), timeout_s=5.0
        )
        assert not beat.reregister
        round_trips_s.append(trio.current_time() - sent)
        lags_s.append(lag.recent_max_s)
        database_s.append(heartbeats_database_s() - database_before_s)
        due = sent + HEARTBEAT_INTERVAL_S
    return round_trips_s


async def test_heartbeats_are_answered_promptly_while_large_listings_flood_the_ingest(
    database_url: str, tmp_path: Path
) -> None:
    """With 1,200 jobs stored, 40 clients in another process call ListJobs(limit=1000) in a
    loop while a worker sends 24 heartbeats, one every 0.25 s: every heartbeat is answered
    within 1 s (the median within 0.25 s), plus what the ingest loop's own lag and the
    heartbeat's own statement add on a machine busy with other work; listings answered are
    answered in full, some are refused with RESOURCE_EXHAUSTED, each naming the replica."""
    async with serve_ingests(database_url, "cp-1") as (ingest,):
        channel = GrpcChannel(ingest.address)
        try:
            stub = channel.stub(pb.ControlPlaneStub)
            spec = pb.JobSpec(name="j", cpu_millis=100, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=10))
            batch = with_idempotency_key(pb.SubmitJobsRequest(specs=[spec] * JOBS))
            stored = await submit_despite_busy(channel, batch)
            assert len(stored.job_ids) == JOBS
            reg = await channel.call(
                stub.register_worker,
                with_idempotency_key(
                    pb.RegisterWorkerRequest(
                        worker_id="w-1", address="127.0.0.1:9", cpu_millis=1000, memory_mb=1000
                    )
                ),
                timeout_s=5.0,
            )
            lags_s: list[float] = []
            database_s: list[float] = []
            shed_before = shed_count("list_jobs")
            flood: list[str] = []
            stop = tmp_path / "stop-the-flood"

            async def run_flood() -> None:
                done = await trio.run_process(
                    [sys.executable, "-c", FLOOD, ingest.address, str(LISTING_CLIENTS), str(stop)],
                    cwd=ROOT,
                    capture_stdout=True,
                )
                flood.append(done.stdout.decode())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_flood)
                with trio.fail_after(30.0):  # the flood process starts up and gets going
                    while shed_count("list_jobs") == shed_before:  # noqa: ASYNC110 (a metric, no event)
                        await trio.sleep(0.05)
                round_trips_s = await heartbeat_round_trips_s(
                    channel,
                    reg.incarnation,
                    HEARTBEATS,
                    lags_s=lags_s,
                    database_s=database_s,
                    lag=ingest.lag,
                    while_=lambda: not flood,
                )
                stop.touch()
            counts = json.loads(flood[0])
        finally:
            channel.close()
    print(f"heartbeat round trips (s): {sorted(round_trips_s)[-5:]} of {len(round_trips_s)}; flood: {counts}")
    print(f"the ingest loop's lags (s): {sorted(lags_s)[-5:]}; database (s): {sorted(database_s)[-5:]}")
    assert len(round_trips_s) == HEARTBEATS, "the flood ended before the heartbeats"
    late = [
        (round(trip_s, 3), round(lag_s, 3), round(db_s, 3))
        for trip_s, lag_s, db_s in zip(round_trips_s, lags_s, database_s, strict=True)
        if trip_s >= HEARTBEAT_BOUND_S + LAG_WAKES * lag_s + db_s
    ]
    assert not late, f"heartbeats (round trip s, loop lag s, database s) slower than the bound: {late}"
    median_bound_s = (
        HEARTBEAT_MEDIAN_BOUND_S + LAG_WAKES * statistics.median(lags_s) + statistics.median(database_s)
    )
    assert statistics.median(round_trips_s) < median_bound_s, (sorted(round_trips_s), sorted(lags_s))
    assert counts.get("rows", 0) == 1000 * counts.get("answered", 0)
    assert counts.get("busy", 0) > 0 and counts["busy_named"] == counts["busy"]
    assert shed_count("list_jobs") - shed_before >= counts["busy"]
