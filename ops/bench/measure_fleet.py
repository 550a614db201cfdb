"""What a fleet process costs per heartbeat: its CPU time over a window divided by the heartbeats
the control planes recorded in it, as one JSON line, from a running local cluster whose workers
all live in fleets (docs/benchmarks.md, "A fleet's CPU per heartbeat").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import psutil

from ops.bench import metrics
from ops.config import default_state_dir
from ops.launcher.state import StateDir
from ops.pidfile import read_pid

HEARTBEATS_RECORDED = "stockade_heartbeats_recorded_total"


def heartbeats_recorded(metrics_addresses: list[str]) -> float:
    """The sum of :data:`HEARTBEATS_RECORDED` over the control planes at ``metrics_addresses``
    (``host:port`` each).

    Raises:
        OSError: a control plane's /metrics did not answer.
    """
    return sum(
        metrics.total(metrics.samples(metrics.fetch_text(a)), HEARTBEATS_RECORDED) for a in metrics_addresses
    )


def cpu_s(processes: list[psutil.Process]) -> float:
    """User plus system CPU seconds ``processes`` have used so far (their children excluded)."""
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def connections_to(processes: list[psutil.Process], addresses: list[str]) -> int:
    """How many established TCP connections ``processes`` hold to the ``host:port`` of
    ``addresses`` (the control planes' gRPC addresses)."""
    wanted = {(host, int(port)) for host, _, port in (a.rpartition(":") for a in addresses)}
    return sum(
        1
        for process in processes
        for connection in process.net_connections(kind="tcp")
        if connection.status == psutil.CONN_ESTABLISHED
        and connection.raddr
        and (connection.raddr.ip, connection.raddr.port) in wanted
    )


def measure(state_dir: Path, window_s: float) -> dict[str, float]:
    """Measure the fleets of the cluster recorded in ``state_dir`` over ``window_s`` seconds
    (wall clock: this reads other processes' counters, so it is not trio's).

    Raises:
        SystemExit: no cluster, no fleet, a fleet without a pid file, or no control plane
            serving metrics.
    """
    state = StateDir(state_dir)
    config = state.load()
    if config is None:
        raise SystemExit(f"no cluster recorded in {state_dir} (stockade up first)")
    fleets = config.fleets
    if not fleets:
        raise SystemExit(f"the cluster in {state_dir} has no fleet (stockade up --fleet-size K)")
    processes = []
    for fleet in fleets:
        pid = read_pid(state.pid_path(fleet.id))
        if pid is None:
            raise SystemExit(f"{fleet.id} has no pid file in {state_dir}/pids")
        processes.append(psutil.Process(pid))
    addresses = [p.metrics_address for p in config.control_planes if p.metrics_address]
    if not addresses:
        raise SystemExit("no control plane serves metrics (stockade up without --no-metrics)")
    cpu_before, beats_before, began = cpu_s(processes), heartbeats_recorded(addresses), time.monotonic()
    time.sleep(window_s)
    cpu_after, beats_after, ended = cpu_s(processes), heartbeats_recorded(addresses), time.monotonic()
    connections = connections_to(processes, [p.address for p in config.control_planes])
    elapsed_s = ended - began
    used_s = cpu_after - cpu_before
    beats = beats_after - beats_before
    return {
        "fleets": len(fleets),
        "workers": sum(len(config.workers_in(f.id)) for f in fleets),
        "window_s": round(elapsed_s, 2),
        "cpu_s": round(used_s, 3),
        "heartbeats": beats,
        "heartbeats_per_s": round(beats / elapsed_s, 1),
        "cpu_ms_per_heartbeat": round(1000 * used_s / beats, 4) if beats else float("nan"),
        "cpu_share": round(used_s / elapsed_s, 4),
        "connections_to_control_planes": connections,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.measure_fleet", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the cluster's state folder (default: $STOCKADE_STATE_DIR or .stockade)",
    )
    parser.add_argument("--window-s", type=float, default=60.0, help="seconds to measure over (default 60)")
    parser.add_argument("--settle-s", type=float, default=0.0, help="seconds to wait before measuring")
    args = parser.parse_args()
    if args.settle_s > 0:
        time.sleep(args.settle_s)
    print(json.dumps(measure(args.state_dir or default_state_dir(), args.window_s)))


if __name__ == "__main__":
    main()
