"""A fleet's workers share one connection per control plane: over real gRPC and mutual TLS
with a fleet certificate, several workers register, heartbeat and leave through one client, each
worker's calls going first to its own home replica."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio

from actors.ingest import CONTROL_PLANE_ACCESS
from agent.fleet import FleetWorker, fleet_settings, run_fleet, shared_client
from ops import certs as certs_module
from protocol import pb
from protocol.bases import ControlPlaneBase
from runtime.aio import asyncio_bridge, require_worker, rpc_caller, serve_grpc, trio_service
from runtime.routes import home_index
from runtime.tls import Identity, TlsFiles, server_context

WORKERS = ("w-1", "w-2", "w-3", "w-4", "w-5")
REPLICAS = ("cp-1", "cp-2", "cp-3")
HANG_GUARD_S = 30.0
"""Bounds a wait that must end by itself; never a measured time."""


@attrs.frozen
class Call:
    """One call a scripted control plane took: which replica, RPC and worker, and from which
    connection (the caller's host:port) with which identity."""

    replica: int
    rpc: str
    worker_id: str
    peer: str
    identity: Identity | None


class Recorder:
    """Every call the scripted replicas took, in arrival order; set ``beaten`` once every
    worker has had two heartbeats answered."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.beaten = trio.Event()

    def take(self, replica: int, rpc: str, worker_id: str) -> None:
        require_worker(rpc, worker_id)  # the real rule: the certificate must name the worker
        caller = rpc_caller()
        self.calls.append(Call(replica, rpc, worker_id, caller.address, caller.identity))
        beats = Counter(c.worker_id for c in self.calls if c.rpc == "heartbeat")
        if all(beats[w] >= 2 for w in WORKERS):
            self.beaten.set()


class ScriptedReplica:
    """A ControlPlane service that answers registrations, heartbeats and leaves, recording them."""

    def __init__(self, replica: int, recorder: Recorder) -> None:
        self.replica = replica
        self.recorder = recorder

    async def register_worker(self, request: pb.RegisterWorkerRequest) -> pb.RegisterWorkerReply:
        self.recorder.take(self.replica, "register_worker", request.worker_id)
        return pb.RegisterWorkerReply(incarnation=1, epoch=1)

    async def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatReply:
        self.recorder.take(self.replica, "heartbeat", request.worker_id)
        return pb.HeartbeatReply(epoch=1)

    async def leave_worker(self, request: pb.LeaveWorkerRequest) -> pb.LeaveWorkerReply:
        self.recorder.take(self.replica, "leave_worker", request.worker_id)
        return pb.LeaveWorkerReply(left=True, epoch=1)


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """A cluster CA, cp-1..cp-3's and w-1..w-5's certificates, and fleet-1's naming w-1..w-5."""
    folder = tmp_path / "certs"
    certs_module.init_cluster(folder)
    certs_module.issue(folder, role="worker", id="fleet-1", workers=list(WORKERS))
    return folder


async def test_a_fleets_workers_use_one_connection_per_control_plane(tmp_path: Path, certs: Path) -> None:
    """Five workers, one listing the replicas in another order (as stockade up rotates them),
    register, heartbeat and leave through the fleet's one client: each replica sees every call
    of the fleet on one connection, presenting the fleet certificate, and each worker's first
    call reaches first the home replica its own list gives it."""
    recorder = Recorder()
    async with asyncio_bridge(), trio.open_nursery() as servers:
        addresses = []
        for index, cp_id in enumerate(REPLICAS):
            service = trio_service(
                ControlPlaneBase, ScriptedReplica(index, recorder), access=CONTROL_PLANE_ACCESS
            )
            tls = server_context(TlsFiles.in_dir(certs, cp_id))
            port = await servers.start(partial(serve_grpc, [service], "127.0.0.1", 0, tls=tls))
            addresses.append(f"127.0.0.1:{port}")
        # w-1 lists the replicas rotated by one, so its home (replica 0) is not the one its id
        # gives in the fleet's order (replica 2); the others list them in the fleet's order.
        lists = {w: tuple(addresses) for w in WORKERS} | {"w-1": (*addresses[1:], addresses[0])}
        workers = [
            FleetWorker(
                worker_id=w,
                port=0,
                cpu_millis=1000,
                memory_mb=1000,
                work_dir=str(tmp_path / w),
                control_planes=lists[w],
            )
            for w in WORKERS
        ]
        settings = fleet_settings(
            workers,
            control_planes=addresses,
            cert_dir=certs,
            heartbeat_interval_s=0.1,
            heartbeat_timeout_s=2.0,  # no hedge on a loaded machine: each call stays where it went first
            self_fence_after_s=10.0,
            db_outage_grace_s=20.0,
        )
        client = shared_client(settings, control_planes=addresses, tls=TlsFiles.in_dir(certs, "fleet-1"))
        try:
            async with trio.open_nursery() as fleet:
                await fleet.start(partial(run_fleet, settings, spread_s=0, client=client))
                with trio.fail_after(HANG_GUARD_S):
                    await recorder.beaten.wait()
                fleet.cancel_scope.cancel()
        finally:
            client.close()
        servers.cancel_scope.cancel()

    calls = recorder.calls
    assert {c.identity for c in calls} == {Identity(role="worker", id="fleet-1", workers=frozenset(WORKERS))}
    peers_by_replica = {r: {c.peer for c in calls if c.replica == r} for r in range(len(REPLICAS))}
    assert all(len(peers) <= 1 for peers in peers_by_replica.values()), peers_by_replica
    assert sorted({c.worker_id for c in calls if c.rpc == "leave_worker"}) == list(WORKERS)
    homes = {w: addresses.index(lists[w][home_index(w, len(REPLICAS))]) for w in WORKERS}
    first_replica = {w: next(c.replica for c in calls if c.worker_id == w) for w in WORKERS}
    assert first_replica == homes
    assert homes["w-1"] == 0 != home_index("w-1", len(REPLICAS))
    assert sorted(set(homes.values())) == [0, 1, 2]  # the five workers' homes spread
