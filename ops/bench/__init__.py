"""The benchmarks (``stockade bench``: failover, pack, overload, unschedulable, scale), the load
generator they drive (:mod:`ops.bench.loadgen`) and the measure scripts
(``python -m ops.bench.measure_*``); each prints measured numbers, never asserted in tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ops.launcher.state import ClusterConfig
    from runtime.client import ControlPlaneClient


@asynccontextmanager
async def operator_client(
    config: ClusterConfig, *, timeout_s: float = 10.0
) -> AsyncIterator[ControlPlaneClient]:
    """A client of ``config``'s control planes with the operator's certificate (none on a cluster
    without TLS), each call given ``timeout_s`` seconds; closed at the end of the block. Open it
    inside the asyncio bridge."""
    from runtime.client import ControlPlaneClient

    client = ControlPlaneClient(config.control_plane_addresses, timeout_s=timeout_s, tls=config.client_tls)
    try:
        yield client
    finally:
        client.close()


def heartbeat_flags(interval_s: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The control planes' and the agents' flags that fix the heartbeat interval at
    ``interval_s`` seconds: dead_after 5 times it, the heartbeat deadline 1.5 times, the
    self-fence 3.5 times."""
    i = interval_s
    cp = f"--dead-after-s {5 * i:g} --heartbeat-interval-min-s {i:g} --heartbeat-interval-max-s {i:g}"
    agent = f"--heartbeat-interval-s {i:g} --heartbeat-timeout-s {1.5 * i:g} --self-fence-after-s {3.5 * i:g}"
    return tuple(cp.split()), tuple(agent.split())
