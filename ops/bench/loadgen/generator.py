"""The simulated workers of the load generator: :class:`LoadGenerator` (registration, the one
timer of heartbeats, self-fences, kills), :class:`LoadStats`, :func:`worker_ids` and
:func:`home_control_plane`. How they behave: docs/benchmarks.md, "The load generator".
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import math
import random
import ssl
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
from protocol import pb
from runtime import gcpause
from runtime.settings.agent import AgentSettings
from runtime.tls import ClientTls, Expected, TlsFiles, expected_server_name, server_context

__all__ = ["LoadGenerator", "LoadStats", "home_control_plane", "percentile", "worker_ids"]

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
agent's default ``register_timeout_s``)."""


def worker_ids(count: int, prefix: str = WORKER_PREFIX) -> list[str]:
    """``[prefix1, ..., prefixN]``: the ids of ``count`` simulated workers."""
    return [f"{prefix}{i}" for i in range(1, count + 1)]


def home_control_plane(worker_id: str, control_planes: int) -> int:
    """The index (0-based) of the control plane a worker heartbeats to: the first 8 bytes of
    the SHA-256 of its id, modulo ``control_planes`` (ValueError unless >= 1)."""
    if control_planes < 1:
        raise ValueError(f"control_planes must be >= 1, got {control_planes}")
    return int.from_bytes(hashlib.sha256(worker_id.encode()).digest()[:8], "big") % control_planes


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1, else ValueError) of ``values`` by the nearest-rank method;
    None when empty."""
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
class SleepRun:
    job_id: int
    started: float
    ends: float


@attrs.define
class SimulatedWorker:
    id: str
    home: int
    interval_s: float
    run_id: str = attrs.field(factory=lambda: uuid.uuid4().hex)
    seq: int = 0
    incarnation: int = 0
    epoch_seen: int = 0
    running: dict[int, SleepRun] = attrs.field(factory=dict)
    finished: dict[int, SleepRun] = attrs.field(factory=dict)
    """Ended on their own, not yet acknowledged by a heartbeat reply."""
    accepted: set[int] = attrs.field(factory=set)
    cancelled: set[int] = attrs.field(factory=set)
    last_ack: float = 0.0
    """Send time (``time.monotonic()``) of the newest acknowledged heartbeat or registration."""
    dead_after_ms: int = 0
    """The dead_after the newest reply told (0: none): its self-fence is derived from it."""
    failures_in_row: int = 0
    waited_s: float = 0.0
    """The last heartbeat's round trip if sent before the self-fence deadline and answered, else 0
    (the next one says it, waited_ms)."""
    in_flight: bool = False
    registering: bool = False
    schedule: int = 0
    """Bumped at each registration and early heartbeat: heap entries of an older one are dropped."""
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
                run_ms=round((run.ends - run.started) * 1000),
                ended_ago_ms=max(0, round((now - run.ends) * 1000)),
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
    workers: dict[str, SimulatedWorker] = attrs.field(factory=dict)
    stats: LoadStats = attrs.field(factory=LoadStats)
    gc_pauses: gcpause.GcPauses = attrs.field(factory=lambda: gcpause.GcPauses(warn_after_s=math.inf))
    """Times the process's collections (logs none: stdout is the bench's protocol)."""
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

    def _stub(self, worker: SimulatedWorker, index: int) -> pb.ControlPlaneStub:
        if self.cert_dir is None:
            return pb.ControlPlaneStub(self._shared[index])
        channels: dict[int, grpclib.client.Channel] = worker.client
        if index not in channels:
            tls = ClientTls(TlsFiles.in_dir(self.cert_dir, worker.id))
            channels[index] = self._channel(self.control_planes[index], tls)
        return pb.ControlPlaneStub(channels[index])

    def _target(self, worker: SimulatedWorker) -> int:
        """Its home control plane, or the next ones after failures in a row."""
        return (worker.home + worker.failures_in_row) % len(self.control_planes)

    # -- lifecycle -------------------------------------------------------------------

    def setup(self) -> None:
        """Make the workers (and, with TLS, each one's server context)."""
        ids = worker_ids(self.count, self.prefix)
        for worker_id in ids:
            worker = SimulatedWorker(
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
        """The Worker endpoint's context: it presents the certificate of the worker the caller
        names (SNI)."""
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

    async def register(self, worker: SimulatedWorker) -> None:
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

    async def heartbeat(self, worker: SimulatedWorker) -> None:
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
        # self-fence deadline; past it (paused), longer after each failed call; at least timeout_s.
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

    def pull_forward(self, worker: SimulatedWorker, now: float) -> None:
        """A job placed before started on ``worker`` at ``now``: its next heartbeat comes early when
        an agent's would (:func:`agent.fence.early_heartbeat_allowed`)."""
        if worker.registering or not early_heartbeat_allowed(now, worker.early_at, worker.interval_s):
            return
        worker.early_at = now
        worker.schedule += 1
        heapq.heappush(self._heap, (now + EARLY_HEARTBEAT_GATHER_S, worker.id, worker.schedule))
        self._wake.set()

    def _stop_all(self, worker: SimulatedWorker) -> None:
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

    def fence_s(self, worker: SimulatedWorker) -> float:
        """``worker``'s self-fence span, as an agent's (:func:`agent.fence.fence_after_s`)."""
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
    """The heartbeat interval a reply asks for (``heartbeat_interval_ms``, if set), else ``default_s``."""
    interval_ms = getattr(reply, "heartbeat_interval_ms", 0) or 0
    return interval_ms / 1000 if interval_ms > 0 else default_s
