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
from pathlib import Path

import trio
from prometheus_client import REGISTRY
from serving import serve_ingests

from protocol import pb
from runtime.aio import GrpcChannel
from runtime.client import with_idempotency_key

ROOT = Path(__file__).parents[2]
JOBS = 1200
LISTING_CLIENTS = 40
FLOOD_S = 6.0
HEARTBEAT_INTERVAL_S = 0.25
HEARTBEAT_BOUND_S = 1.0
"""Longest a heartbeat's round trip may take during the flood: with room below the 1.5 s a
worker goes without an acknowledged heartbeat before it fences itself (timing on a shared
machine varies; the typical round trip is bounded separately by HEARTBEAT_MEDIAN_BOUND_S).
Measured: 0.12 to 0.29 s at most per run on the 2-core VM, 0.55 s once while other benchmarks
ran beside it; before this work, 0.7 to 2.4 s."""
HEARTBEAT_MEDIAN_BOUND_S = 0.25
"""The median heartbeat round trip during the flood: within one heartbeat interval."""

FLOOD = """
import collections, json, sys, time, trio
from protocol import pb
from runtime.aio import GrpcChannel, asyncio_bridge
from runtime.errors import Busy, StockadeError
address, clients, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
counts = collections.Counter()
async def client():
    channel = GrpcChannel(address)
    stub = channel.stub(pb.ControlPlaneStub)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
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


async def test_heartbeats_are_answered_promptly_while_large_listings_flood_the_ingest(
    database_url: str,
) -> None:
    """With 1,200 jobs stored, 40 clients in another process call ListJobs(limit=1000) in a
    loop for 6 s while a worker heartbeats every 0.25 s: every heartbeat is answered within
    0.5 s, listings are answered, and those beyond the ingest's turns get RESOURCE_EXHAUSTED
    naming the replica."""
    async with serve_ingests(database_url, "cp-1") as (ingest,):
        channel = GrpcChannel(ingest.address)
        try:
            stub = channel.stub(pb.ControlPlaneStub)
            spec = pb.JobSpec(name="j", cpu_millis=100, memory_mb=10, sleep=pb.SleepRuntime(duration_ms=10))
            batch = with_idempotency_key(pb.SubmitJobsRequest(specs=[spec] * JOBS))
            stored = await channel.call(stub.submit_jobs, batch, timeout_s=30.0)
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
            shed_before = shed_count("list_jobs")
            flood: list[str] = []

            async def run_flood() -> None:
                done = await trio.run_process(
                    [sys.executable, "-c", FLOOD, ingest.address, str(LISTING_CLIENTS), str(FLOOD_S)],
                    cwd=ROOT,
                    capture_stdout=True,
                )
                flood.append(done.stdout.decode())

            round_trips_s: list[float] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_flood)
                with trio.fail_after(10.0):  # the flood process starts up and gets going
                    while shed_count("list_jobs") == shed_before:  # noqa: ASYNC110 (a metric, no event)
                        await trio.sleep(0.05)
                due = trio.current_time()
                while not flood and len(round_trips_s) < 60:
                    await trio.sleep_until(due)
                    sent = trio.current_time()
                    beat = await channel.call(
                        stub.heartbeat,
                        pb.HeartbeatRequest(worker_id="w-1", incarnation=reg.incarnation),
                        timeout_s=5.0,
                    )
                    assert not beat.reregister
                    round_trips_s.append(trio.current_time() - sent)
                    due = sent + HEARTBEAT_INTERVAL_S
            counts = json.loads(flood[0])
        finally:
            channel.close()
    print(f"heartbeat round trips (s): {sorted(round_trips_s)[-5:]} of {len(round_trips_s)}; flood: {counts}")
    assert len(round_trips_s) >= 10
    assert max(round_trips_s) < HEARTBEAT_BOUND_S, sorted(round_trips_s)[-5:]
    assert statistics.median(round_trips_s) < HEARTBEAT_MEDIAN_BOUND_S, sorted(round_trips_s)
    assert counts.get("answered", 0) > 0 and counts["rows"] == 1000 * counts["answered"]
    assert counts.get("busy", 0) > 0 and counts["busy_named"] == counts["busy"]
    assert shed_count("list_jobs") - shed_before >= counts["busy"]
