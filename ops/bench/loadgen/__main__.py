"""``python -m ops.bench.loadgen --workers N --control-planes host:port,...``: the load generator
as a process. It prints JSON lines on stdout (``serving``, ``registered``, ``stats``,
``killed``) and reads commands, one JSON object per line, on stdin:

- ``{"cmd": "stats", "reset": true}``: print the counts since the last reset (and reset).
- ``{"cmd": "kill", "ids": ["sim-1"]}``: those workers die abruptly: no more heartbeats, and
  their Worker service answers UNAVAILABLE (as a refused connection would).
- ``{"cmd": "held"}``: print which workers hold running assignments.
- ``{"cmd": "stop"}`` (or end of input): exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpclib.server

from ops.bench.loadgen.generator import LoadGenerator, LoadStats
from ops.bench.loadgen.service import SimulatedWorkerService
from ops.launcher.ports import free_port
from runtime import gcpause


def _say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def _commands(gen: LoadGenerator) -> None:
    """Read commands from stdin (a thread feeds them in) until ``stop`` or end of input."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(queue.put_nowait, line)
        loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()
    while (line := await queue.get()) is not None:
        try:
            command = json.loads(line)
        except json.JSONDecodeError:
            _say("error", message=f"not JSON: {line.strip()!r}")
            continue
        match command.get("cmd"):
            case "stats":
                # The load generator's own collections (a pause here delays the acks it times).
                pauses_s = [pause_s for _, pause_s in gen.gc_pauses.drain(time.monotonic())]
                gen.stats.gc_pauses_s.extend(pauses_s)
                _say("stats", **gen.stats.summary())
                if command.get("reset"):
                    gen.stats = LoadStats()
            case "kill":
                _say("killed", ids=gen.kill(command.get("ids", [])))
            case "held":
                _say("held", workers=gen.held())
            case "stop":
                return
            case other:
                _say("error", message=f"unknown command {other!r}")


async def run(gen: LoadGenerator, listen_port: int) -> None:
    """Serve the Worker endpoint, register every worker, heartbeat until told to stop."""
    gen.setup()
    gen.gc_pauses.install()
    server = grpclib.server.Server([SimulatedWorkerService(gen)])
    port = listen_port or free_port()
    await server.start("127.0.0.1", port, ssl=gen.server_ssl())
    gen.advertise = f"127.0.0.1:{port}"
    _say("serving", address=gen.advertise, workers=gen.count)
    timer = asyncio.get_running_loop().create_task(gen.timer_loop())
    try:
        registering = asyncio.get_running_loop().create_task(_register_all(gen))
        await _commands(gen)
        registering.cancel()
    finally:
        timer.cancel()
        for task in list(gen._tasks):
            task.cancel()
        server.close()
        gen.close()
        gen.gc_pauses.uninstall()


async def _register_all(gen: LoadGenerator) -> None:
    await asyncio.gather(*(gen.register(w) for w in gen.workers.values()))
    _say("registered", workers=len(gen.workers))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.loadgen",
        description="A heartbeat load generator: thousands of simulated workers in one process.",
    )
    parser.add_argument("--control-planes", required=True, help="host:port,... of the control planes")
    parser.add_argument("--workers", type=int, required=True, help="simulated workers (sim-1..sim-N)")
    parser.add_argument("--cpu-millis", type=int, default=1000)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--interval-s", type=float, default=1.0, help="heartbeat interval, seconds")
    parser.add_argument("--timeout-s", type=float, default=1.5, help="heartbeat deadline, seconds")
    parser.add_argument("--self-fence-s", type=float, default=3.5, help="self-fence after, seconds")
    parser.add_argument("--cert-dir", type=Path, help="the cluster's certificates (sim-N.crt/.key)")
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC")
    parser.add_argument("--listen-port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if (args.cert_dir is None) != args.insecure:
        parser.error("give exactly one of --cert-dir and --insecure")
    gen = LoadGenerator(
        control_planes=args.control_planes.split(","),
        count=args.workers,
        cpu_millis=args.cpu_millis,
        memory_mb=args.memory_mb,
        interval_s=args.interval_s,
        timeout_s=args.timeout_s,
        self_fence_s=args.self_fence_s,
        cert_dir=args.cert_dir,
        gc_pauses=gcpause.GcPauses(warn_after_s=math.inf, freeze_survivors=True),
    )
    gcpause.collect_less_often()  # as a control plane: 2,000 workers' state is a large heap
    asyncio.run(run(gen, args.listen_port))


if __name__ == "__main__":
    main()
