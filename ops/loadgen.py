"""A heartbeat load generator: thousands of simulated workers in one process.

Each simulated worker speaks the public ControlPlane protocol as a worker does (RegisterWorker,
Heartbeat with its running assignments and finished outcomes) and is served by one shared
Worker gRPC endpoint that accepts Assign of sleep jobs and Cancel, checking epoch, incarnation
and assignment ids as invariant 5 asks (docs/design.md). A sleep job "runs" until its duration
has passed and is then reported succeeded by the next heartbeat. Nothing here imports the
control plane: the generator keeps working whatever the control plane does inside.

Shape of the load: ONE timer loop (a heap of due times) sends each worker's heartbeat at its
interval (the reply's ``heartbeat_interval_ms`` when a control plane sends one, else
``--interval-s``), phases spread evenly over the interval, the start of a job placed before
pulling the next one forward as an agent's does (:func:`agent.fence.early_heartbeat_allowed`);
a worker's heartbeats go to the control plane picked by :func:`home_control_plane` (a stable
hash of its id), and to the next ones while that one fails. Connections: with ``--insecure``
one per control plane, shared by every worker; with mutual TLS one per worker (its certificate
names it, and a control plane lets a worker speak only for itself), to its home control plane.
The Worker endpoint presents each worker's own certificate, chosen by the TLS server name a
control plane asks for.

Run as ``python -m ops.loadgen --workers N --control-planes host:port,...``; it prints JSON
lines on stdout (``serving``, ``registered``, ``stats``, ``killed``) and reads commands, one
JSON object per line, on stdin:

- ``{"cmd": "stats", "reset": true}``: print the counts since the last reset (and reset).
- ``{"cmd": "kill", "ids": ["sim-1"]}``: those workers die abruptly: no more heartbeats, and
  their Worker service answers UNAVAILABLE (as a refused connection would).
- ``{"cmd": "held"}``: print which workers hold running assignments.
- ``{"cmd": "stop"}`` (or end of input): exit.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import json
import math
import random
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import grpclib.client
import grpclib.config
import grpclib.const
import grpclib.exceptions
import grpclib.server

from agent.fence import EARLY_HEARTBEAT_GATHER_S, early_heartbeat_allowed, patient_deadline_s
from ops.launcher.ports import free_port
from protocol import pb
from runtime import gcpause
from runtime.settings import AgentSettings
from runtime.tls import ClientTls, Expected, TlsFiles, expected_server_name, server_context

__all__ = ["LoadStats", "home_control_plane", "main", "percentile", "worker_ids"]

WORKER_PREFIX = "sim-"
"""Simulated workers are ``sim-1`` .. ``sim-N``."""
REGISTER_CONCURRENCY = 32
"""Registrations in flight at once (at start and after reregister answers)."""
RPC_ERRORS = (
    grpclib.exceptions.GRPCError,
    grpclib.exceptions.StreamTerminatedError,
    grpclib.exceptions.ProtocolError,
    OSError,
    TimeoutError,
    ssl.SSLError,
)
"""What a call to a control plane may fail with: counted as a failure, never raised."""
REGISTER_RETRY_S = 1.0
"""Base delay before a failed registration is tried again, seconds (jittered up to 2x)."""
CALL_DEADLINE_MARGIN_S = 0.1
"""A heartbeat waits for its answer until this long before the worker's self-fence deadline
(the agent's ``call_deadline_margin_s``)."""
PAUSED_CALL_CAP_S = cast(float, attrs.fields(AgentSettings).register_timeout_s.default)
"""The longest a heartbeat past the self-fence deadline waits for its answer, seconds (the
agent's default ``register_timeout_s``: :func:`agent.fence.patient_deadline_s`)."""


def worker_ids(count: int, prefix: str = WORKER_PREFIX) -> list[str]:
    """``[prefix1, ..., prefixN]``: the ids of ``count`` simulated workers."""
    return [f"{prefix}{i}" for i in range(1, count + 1)]


def home_control_plane(worker_id: str, control_planes: int) -> int:
    """The index (0-based) of the control plane a worker heartbeats to: the first 8 bytes of
    the SHA-256 of its id, modulo ``control_planes``; stable across runs and processes.

    Raises:
        ValueError: ``control_planes`` is not >= 1.
    """
    if control_planes < 1:
        raise ValueError(f"control_planes must be >= 1, got {control_planes}")
    return int.from_bytes(hashlib.sha256(worker_id.encode()).digest()[:8], "big") % control_planes


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method; None when empty.

    Raises:
        ValueError: ``q`` is outside 0..1.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in 0..1, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@attrs.define
class LoadStats:
    """Counts of one measuring window."""

    acks: int = 0
    """Heartbeats answered without reregister (each one was recorded)."""
    failures: int = 0
    """Heartbeats that got an error or no answer in time."""
    reregisters: int = 0
    """Heartbeats answered with reregister."""
    self_fences: int = 0
    """Workers that stopped their jobs because no heartbeat was acknowledged in time."""
    registrations: int = 0
    latencies_s: list[float] = attrs.field(factory=list)
    """Acknowledgement latency of every acknowledged heartbeat, seconds."""
    started: float = attrs.field(factory=time.monotonic)
    gc_pauses_s: list[float] = attrs.field(factory=list)
    """How long each of the process's garbage collections held it, seconds."""

    def summary(self) -> dict[str, Any]:
        """The window as JSON: counts, ``window_s`` and ack latency p50 / p99 / max in ms."""

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 3)

        return {
            "window_s": round(time.monotonic() - self.started, 3),
            "acks": self.acks,
            "failures": self.failures,
            "reregisters": self.reregisters,
            "self_fences": self.self_fences,
            "registrations": self.registrations,
            "ack_p50_ms": ms(percentile(self.latencies_s, 0.5)),
            "ack_p99_ms": ms(percentile(self.latencies_s, 0.99)),
            "ack_max_ms": ms(max(self.latencies_s, default=None)),
            "gc_pause_max_ms": ms(max(self.gc_pauses_s, default=0.0)),
            "gc_pauses_over_100_ms": sum(1 for pause_s in self.gc_pauses_s if pause_s > 0.1),
        }


@attrs.define
class _Run:
    job_id: int
    started: float
    ends: float


@attrs.define
class _Worker:
    id: str
    home: int
    interval_s: float
    run_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    seq: int = 0
    incarnation: int = 0
    epoch_seen: int = 0
    running: dict[int, _Run] = attrs.field(factory=dict)
    finished: dict[int, _Run] = attrs.field(factory=dict)
    """Ended on their own, not yet acknowledged by a heartbeat reply."""
    accepted: set[int] = attrs.field(factory=set)
    cancelled: set[int] = attrs.field(factory=set)
    last_ack: float = 0.0
    """Send time (``time.monotonic()``) of the newest acknowledged heartbeat or registration."""
    dead_after_ms: int = 0
    """The dead_after the newest reply told (0: none): its self-fence is derived from it."""
    failures_in_row: int = 0
    waited_s: float = 0.0
    """The last heartbeat's round trip, when it was sent before the self-fence deadline and
    answered, else 0: the next one says it (waited_ms), as an agent's."""
    in_flight: bool = False
    registering: bool = False
    schedule: int = 0
    """Bumped at each registration, and when a job's start pulls a heartbeat forward: heap
    entries of an older schedule are dropped."""
    early_at: float = -math.inf
    """When a job's start last pulled a heartbeat forward (``time.monotonic()``)."""
    killed: bool = False
    client: Any = None
    """Its own channel per control plane (mutual TLS) or None (shared channels)."""

    def outcomes(self, now: float) -> list[pb.JobOutcome]:
        return [
            pb.JobOutcome(
                assignment_id=aid,
                job_id=run.job_id,
                state="succeeded",
                has_exit_code=True,
                exit_code=0,
                run_ms=int((run.ends - run.started) * 1000),
                ended_ago_ms=max(0, int((now - run.ends) * 1000)),
            )
            for aid, run in self.finished.items()
        ]

    def settle(self, now: float) -> None:
        """Move sleep jobs whose time is up from running to finished."""
        for aid, run in list(self.running.items()):
            if now >= run.ends:
                del self.running[aid]
                self.finished[aid] = run


@attrs.define
class LoadGenerator:
    """The simulated workers, their timer loop and their Worker endpoint."""

    control_planes: list[str]
    count: int
    cpu_millis: int
    memory_mb: int
    interval_s: float
    timeout_s: float
    self_fence_s: float
    cert_dir: Path | None
    prefix: str = WORKER_PREFIX
    advertise: str = ""
    workers: dict[str, _Worker] = attrs.field(factory=dict)
    stats: LoadStats = attrs.field(factory=LoadStats)
    gc_pauses: gcpause.GcPauses = attrs.field(factory=lambda: gcpause.GcPauses(warn_after_s=math.inf))
    """Times the process's collections while :func:`run` runs (logs none: stdout is the
    bench's protocol); :func:`main` gives one that also freezes full collections' survivors."""
    _heap: list[tuple[float, str, int]] = attrs.field(factory=list)
    _shared: list[grpclib.client.Channel] = attrs.field(factory=list)
    _server_contexts: dict[str, ssl.SSLContext] = attrs.field(factory=dict)
    _register_slots: asyncio.Semaphore = attrs.field(factory=lambda: asyncio.Semaphore(REGISTER_CONCURRENCY))
    _tasks: set[asyncio.Task[None]] = attrs.field(factory=set)
    _wake: asyncio.Event = attrs.field(factory=asyncio.Event)

    # -- connections -----------------------------------------------------------------

    def _channel(self, host_port: str, tls: ClientTls | None) -> grpclib.client.Channel:
        host, _, port = host_port.rpartition(":")
        if tls is None:
            return grpclib.client.Channel(host, int(port))
        target = tls.target()
        return grpclib.client.Channel(
            host,
            int(port),
            ssl=target.context,
            config=grpclib.config.Configuration(ssl_target_name_override=target.server_name),
        )

    def _stub(self, worker: _Worker, index: int) -> pb.ControlPlaneStub:
        if self.cert_dir is None:
            return pb.ControlPlaneStub(self._shared[index])
        channels: dict[int, grpclib.client.Channel] = worker.client
        if index not in channels:
            tls = ClientTls(TlsFiles.in_dir(self.cert_dir, worker.id))
            channels[index] = self._channel(self.control_planes[index], tls)
        return pb.ControlPlaneStub(channels[index])

    def _target(self, worker: _Worker) -> int:
        """Its home control plane, or the next ones after failures in a row."""
        return (worker.home + worker.failures_in_row) % len(self.control_planes)

    # -- lifecycle -------------------------------------------------------------------

    def setup(self) -> None:
        """Make the workers (and, with TLS, each one's server context)."""
        ids = worker_ids(self.count, self.prefix)
        for worker_id in ids:
            worker = _Worker(
                id=worker_id,
                home=home_control_plane(worker_id, len(self.control_planes)),
                interval_s=self.interval_s,
            )
            worker.client = {}
            self.workers[worker_id] = worker
            if self.cert_dir is not None:
                context = server_context(TlsFiles.in_dir(self.cert_dir, worker_id))
                name = expected_server_name(Expected("worker", worker_id))
                self._server_contexts[name] = context
        if self.cert_dir is None:
            self._shared = [self._channel(address, None) for address in self.control_planes]

    def server_ssl(self) -> ssl.SSLContext | None:
        """The Worker endpoint's context: it presents the certificate of the worker whose
        server name the caller sends (SNI)."""
        if self.cert_dir is None:
            return None
        first = next(iter(self._server_contexts.values()))
        contexts = self._server_contexts

        def choose(sslobj: ssl.SSLObject, server_name: str | None, _context: ssl.SSLContext) -> None:
            chosen = contexts.get(server_name or "")
            if chosen is not None:
                sslobj.context = chosen

        first.sni_callback = choose  # type: ignore[assignment]
        return first

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        for channel in self._shared:
            channel.close()
        for worker in self.workers.values():
            for channel in worker.client.values():
                channel.close()

    # -- registration ----------------------------------------------------------------

    async def register(self, worker: _Worker) -> None:
        """Register ``worker`` (a new incarnation), retrying with jitter until it is done or
        the worker is killed; then schedule its first heartbeat at a random phase."""
        worker.registering = True
        worker.seq += 1
        try:
            while not worker.killed:
                now = time.monotonic()
                request = pb.RegisterWorkerRequest(
                    worker_id=worker.id,
                    address=self.advertise,
                    cpu_millis=self.cpu_millis,
                    memory_mb=self.memory_mb,
                    labels={"simulated": "true"},
                    finished=worker.outcomes(now),
                    agent_run_id=worker.run_id,
                    registration_seq=worker.seq,
                )
                sent = set(worker.finished)
                try:
                    async with self._register_slots:
                        reply = await self._stub(worker, self._target(worker)).register_worker(
                            request, timeout=max(self.timeout_s, 5.0)
                        )
                except RPC_ERRORS:
                    worker.failures_in_row += 1
                    await asyncio.sleep(REGISTER_RETRY_S * (1 + random.random()))
                    continue
                worker.failures_in_row = 0
                worker.incarnation = reply.incarnation
                worker.epoch_seen = max(worker.epoch_seen, reply.epoch)
                for aid in sent:
                    worker.finished.pop(aid, None)
                worker.interval_s = _interval_of(reply, self.interval_s)
                worker.dead_after_ms = reply.dead_after_ms or worker.dead_after_ms
                worker.last_ack = now
                self.stats.registrations += 1
                worker.schedule += 1
                first = time.monotonic() + random.random() * worker.interval_s
                heapq.heappush(self._heap, (first, worker.id, worker.schedule))
                self._wake.set()
                return
        finally:
            worker.registering = False

    # -- heartbeats ------------------------------------------------------------------

    async def heartbeat(self, worker: _Worker) -> None:
        now = time.monotonic()
        worker.settle(now)
        sent = set(worker.finished)
        request = pb.HeartbeatRequest(
            worker_id=worker.id,
            incarnation=worker.incarnation,
            running_assignment_ids=list(worker.running),
            finished=worker.outcomes(now),
            epoch_seen=worker.epoch_seen,
            sent_monotonic_us=int(now * 1e6),
            dead_after_in_use_ms=worker.dead_after_ms,
            waited_ms=round(worker.waited_s * 1000),
        )
        worker.in_flight = True
        # As an agent's (agent.fence.FenceClock.call_deadline_s): until shortly before the
        # self-fence deadline, so a slow answer still counts; past it (paused), the span, longer
        # after each call in a row that failed; never less than timeout_s.
        fence_s = self.fence_s(worker)
        live_at_send = now < worker.last_ack + fence_s
        left_s = worker.last_ack + fence_s - now - CALL_DEADLINE_MARGIN_S
        if left_s <= 0:
            left_s = patient_deadline_s(
                fence_s - CALL_DEADLINE_MARGIN_S, worker.failures_in_row, PAUSED_CALL_CAP_S
            )
        timeout_s = max(self.timeout_s, left_s)
        worker.waited_s = 0.0
        try:
            reply = await self._stub(worker, self._target(worker)).heartbeat(request, timeout=timeout_s)
        except RPC_ERRORS:
            worker.failures_in_row += 1
            self.stats.failures += 1
            return
        finally:
            worker.in_flight = False
        if live_at_send:
            worker.waited_s = time.monotonic() - now
        if worker.killed:
            return
        worker.failures_in_row = 0
        worker.epoch_seen = max(worker.epoch_seen, reply.epoch)
        if reply.reregister:
            self.stats.reregisters += 1
            self._stop_all(worker)
            self.spawn(self.register(worker))
            return
        self.stats.acks += 1
        self.stats.latencies_s.append(time.monotonic() - now)
        worker.last_ack = now
        worker.dead_after_ms = reply.dead_after_ms or worker.dead_after_ms
        for aid in sent:
            worker.finished.pop(aid, None)
        for aid in reply.stop_assignment_ids:
            if worker.running.pop(aid, None) is not None:
                worker.cancelled.add(aid)
        worker.interval_s = _interval_of(reply, worker.interval_s)

    def pull_forward(self, worker: _Worker, now: float) -> None:
        """A job placed before started on ``worker`` at ``now``: its next heartbeat comes early
        when an agent's would (:func:`agent.fence.early_heartbeat_allowed`), and the regular ones count
        from it."""
        if worker.registering or not early_heartbeat_allowed(now, worker.early_at, worker.interval_s):
            return
        worker.early_at = now
        worker.schedule += 1
        heapq.heappush(self._heap, (now + EARLY_HEARTBEAT_GATHER_S, worker.id, worker.schedule))
        self._wake.set()

    def _stop_all(self, worker: _Worker) -> None:
        """Stop every running job (they never finished: no outcome) and refuse them from now on."""
        worker.cancelled.update(worker.running)
        worker.running.clear()

    async def timer_loop(self) -> None:
        """The one loop: send every due heartbeat, self-fence the silent, sleep until the next."""
        while True:
            now = time.monotonic()
            while self._heap and self._heap[0][0] <= now:
                due, worker_id, schedule = heapq.heappop(self._heap)
                worker = self.workers[worker_id]
                if worker.killed or worker.registering or schedule != worker.schedule:
                    continue  # a registration schedules its own first heartbeat
                if now - worker.last_ack > self.fence_s(worker):
                    self.stats.self_fences += 1
                    self._stop_all(worker)
                    self.spawn(self.register(worker))
                    continue
                if not worker.in_flight:
                    self.spawn(self.heartbeat(worker))
                following = due + worker.interval_s
                following = following if following > now else now + worker.interval_s
                heapq.heappush(self._heap, (following, worker_id, schedule))
            self._wake.clear()
            delay = min(self._heap[0][0] - now, 0.05) if self._heap else 0.05
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(delay, 0.0))
            except TimeoutError:
                pass

    def fence_s(self, worker: _Worker) -> float:
        """``worker``'s self-fence span, as an agent's (:func:`agent.fence.fence_after_s`):
        ``self_fence_s``, stretched with a longer told interval, kept 1 s below the told
        dead_after."""
        wanted = self.self_fence_s * max(1.0, worker.interval_s / self.interval_s)
        if not worker.dead_after_ms:
            return wanted
        return max(0.1, min(wanted, worker.dead_after_ms / 1000 - 1.0))

    # -- commands --------------------------------------------------------------------

    def kill(self, ids: Sequence[str]) -> list[str]:
        killed = []
        for worker_id in ids:
            worker = self.workers.get(worker_id)
            if worker is not None and not worker.killed:
                worker.killed = True
                worker.running.clear()
                killed.append(worker_id)
        return killed

    def held(self) -> dict[str, list[int]]:
        return {w.id: sorted(w.running) for w in self.workers.values() if w.running and not w.killed}


def _interval_of(reply: Any, default_s: float) -> float:
    """The heartbeat interval a reply asks for (a ``heartbeat_interval_ms`` field, when the
    protocol has one and it is set), else ``default_s``."""
    interval_ms = getattr(reply, "heartbeat_interval_ms", 0) or 0
    return interval_ms / 1000 if interval_ms > 0 else default_s


@attrs.define
class SimulatedWorkerService(pb.WorkerBase):
    """The Worker service of every simulated worker: sleep jobs only, checked as an agent does."""

    gen: LoadGenerator

    def _worker(self, worker_id: str) -> _Worker:
        worker = self.gen.workers.get(worker_id)
        if worker is None:
            raise grpclib.exceptions.GRPCError(
                grpclib.const.Status.INVALID_ARGUMENT, f"no worker {worker_id}"
            )
        if worker.killed:
            raise grpclib.exceptions.GRPCError(grpclib.const.Status.UNAVAILABLE, f"{worker_id} is down")
        return worker

    def _refusal(self, worker: _Worker, epoch: int, incarnation: int) -> str | None:
        if epoch < worker.epoch_seen:
            return "stale_epoch"
        worker.epoch_seen = epoch
        if incarnation != worker.incarnation or worker.registering:
            return "wrong_incarnation"
        return None

    async def assign(self, message: pb.AssignRequest) -> pb.AssignReply:
        worker = self._worker(message.worker_id)
        reason = self._refusal(worker, message.epoch, message.incarnation)
        accepted, refused = [], []
        now = time.monotonic()
        for assignment in message.assignments:
            aid = assignment.assignment_id
            if reason is not None:
                refused.append(pb.Refusal(assignment_id=aid, reason=reason))
            elif aid in worker.cancelled:
                refused.append(pb.Refusal(assignment_id=aid, reason="cancelled"))
            elif aid in worker.accepted:
                accepted.append(aid)  # a duplicate: acknowledged, not run twice
            elif assignment.spec is None or assignment.spec.sleep is None:
                refused.append(pb.Refusal(assignment_id=aid, reason="bad_spec"))
            else:
                worker.accepted.add(aid)
                duration_s = assignment.spec.sleep.duration_ms / 1000
                worker.running[aid] = _Run(job_id=assignment.job_id, started=now, ends=now + duration_s)
                accepted.append(aid)
                if assignment.placed_before:
                    self.gen.pull_forward(worker, now)
        return pb.AssignReply(accepted_ids=accepted, refused=refused, epoch_seen=worker.epoch_seen)

    async def cancel(self, message: pb.CancelRequest) -> pb.CancelReply:
        worker = self._worker(message.worker_id)
        reason = self._refusal(worker, message.epoch, message.incarnation)
        worker.settle(time.monotonic())
        acknowledged, finished, refused = [], [], []
        for aid in message.assignment_ids:
            if reason is not None:
                refused.append(pb.Refusal(assignment_id=aid, reason=reason))
            elif aid in worker.cancelled:
                acknowledged.append(aid)  # asked again: stopped already, as an agent answers
            elif aid in worker.finished or (aid in worker.accepted and aid not in worker.running):
                finished.append(aid)
            else:
                worker.running.pop(aid, None)
                worker.cancelled.add(aid)
                acknowledged.append(aid)
        return pb.CancelReply(
            acknowledged_ids=acknowledged,
            finished_ids=finished,
            refused=refused,
            epoch_seen=worker.epoch_seen,
        )


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
