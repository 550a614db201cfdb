"""What each benchmark (``stockade bench``) is asked: its settings class, with the defaults.
Kept apart from the benchmarks, which load the cluster's code, and light (attrs and the few
constants they need), so that the command reads its options' defaults here without loading them."""

from __future__ import annotations

from typing import Any

import attr
import attrs

from actors.heartbeat_policy import SHRINK_AFTER_S
from runtime.errors import InvalidArgument
from runtime.settings.leader import PLACEMENT_POLICIES

POLICIES = PLACEMENT_POLICIES
"""The policies a pack benchmark compares by default (every one :mod:`actors.placement` knows)."""
KINDS = ("command", "sleep")
"""The kinds of job the overload benchmark submits."""
SETTLED_S = SHRINK_AFTER_S + 5.0
"""The scale benchmark's warm-up ends once the interval has not changed for this long (s), or
after :data:`ops.bench.scale.WARM_UP_TIMEOUT_S`: a new interval is taken within the
stabilization window and a pass."""


@attrs.frozen(kw_only=True)
class FailoverBenchSettings:
    """How many of each fault to inject (``stockade bench failover`` says how many by default)."""

    kills: int
    freezes: int
    stops: int
    worker_kills: int
    workers: int = 5
    long_jobs: int = 24
    """Sleep jobs (500 cpu_millis, 256 MiB, 10 minutes) kept running so killed workers have jobs
    to move; replaced by fresh ones after each worker kill, so no round times the requeue
    backoff of a job lost again."""


@attrs.frozen(kw_only=True)
class FairShareSettings:
    """One run: ``jobs`` per account, each ``cpu_millis`` for ``duration_ms``, on ``workers``
    workers; ``window_s`` the measurement windows; ``weights`` alice's and bob's."""

    jobs: int = 5000
    workers: int = 10
    cpu_millis: int = 1000
    memory_mb: int = 128
    duration_ms: int = 2000
    window_s: float = 60.0
    weights: tuple[float, float] = (1.0, 3.0)
    alone: bool = True
    """Also run alice alone, with fair share on and off."""
    alone_jobs: int = 2000
    timeout_s: float = 1800.0


@attrs.frozen(kw_only=True)
class OverloadSettings:
    """One run of the overload benchmark."""

    rates: tuple[float, ...] = (10.0, 25.0, 50.0, 100.0, 200.0, 400.0)
    """Offered jobs per second, one step each, in this order; the first is run again last."""
    step_s: float = 20.0
    """Seconds each step lasts."""
    kind: str = "command"
    """``command`` (``true``) or ``sleep``."""
    sleep_ms: int = 500
    """Duration of a sleep job, in milliseconds."""
    workers: int = 5
    """Workers, each an agent process of its own."""
    batch_interval_s: float = 0.1
    """The generator submits one batch this often."""
    drain_limit_s: float = 300.0
    """After the last step, wait at most this long for the accepted jobs to finish."""
    submit_timeout_s: float = 5.0
    """Deadline of one submission call to one control plane, in seconds."""

    def __attrs_post_init__(self) -> None:
        if not self.rates or any(not 0 < r <= 100_000 for r in self.rates):
            raise InvalidArgument("rates", list(self.rates), "must be 1 or more rates in (0, 100000] jobs/s")
        if not 1 <= self.step_s <= 3600:
            raise InvalidArgument("step_s", self.step_s, "must be between 1 and 3600 s")
        if self.kind not in KINDS:
            raise InvalidArgument("kind", self.kind, f"must be one of {', '.join(KINDS)}")
        if not 1 <= self.sleep_ms <= 3_600_000:
            raise InvalidArgument("sleep_ms", self.sleep_ms, "must be between 1 and 3600000")
        if not 1 <= self.workers <= 100:
            raise InvalidArgument("workers", self.workers, "must be between 1 and 100")


@attrs.frozen(kw_only=True)
class PackSettings:
    """One benchmark run."""

    jobs: int = 10_000
    workers: int = 100
    seed: int = 1
    policies: tuple[str, ...] = POLICIES
    fleet_size: int = 25
    sample_interval_s: float = 0.5
    finish_timeout_s: float = 900.0
    burst: bool = True
    """Run the burst scenario."""
    burst_jobs: int = 10_000
    scale: bool = True
    """Run the scale curve."""
    scale_pending: tuple[int, ...] = (1_000, 10_000, 100_000)
    scale_workers: tuple[int, ...] = (100, 1_000)
    scale_rounds: int = 40
    scale_accounts: int = 1
    """Accounts the scale curve's pending jobs belong to, round-robin (fair share orders
    them); 1: every job is one account's."""
    scale_device_share: float = 0.0
    """The share of the scale curve's pending jobs (0 to 1) that ask 1 to 4 gpu of the simulated
    workers, which then each offer 8 (docs/devices.md); 0: no devices."""
    scale_gang_share: float = 0.0
    """The share of the scale curve's pending jobs (0 to 1, at most 1 - ``scale_device_share``)
    that are tasks of gangs of 2 to 8, a third of them spread (docs/gangs.md); 0: no gangs."""
    only_scale: bool = False
    """Run the scale curve alone (no stream, no burst)."""
    duration_scale: float = 1.0
    """Multiplies every job's duration (a smoke test runs the same stream faster)."""
    arrival_rate_per_s: float = 105.0
    """Jobs per second of the arriving scenario (0: skip it; not scaled by ``duration_scale``).
    The 100 workers can run about 115.3 jobs/s of the 10,000-job stream of seed 1 (1,200,000
    cpu_millis over 10,407 cpu_millis x s per job); near that the queue stays short, so the room
    a policy leaves decides what can start."""
    insecure: bool = False
    """Run the clusters with ``--insecure`` (plaintext gRPC) instead of mutual TLS."""
    heartbeat_interval_s: float = 1.0
    """The workers' heartbeat interval; the heartbeat deadline is 1.5 times it, the self-fence
    3.5 times and the control planes' dead_after 5 times (1 s: 1.5 s, 3.5 s and 5 s)."""
    docker: bool = False
    """Run the stream all at once under the first policy twice, side by side: the workers
    hosted in fleets (``fleet_size``), and each worker in a container of its own (``stockade
    up --docker``); no other scenario runs."""
    arrival_batch_interval_s: float = 0.1
    """How often the arriving scenario submits every job whose arrival time has come."""
    waiting_after_s: float = 1.0
    """A job pending this long (seconds since its submission) is waiting for room:
    ``cpu_use_waiting`` averages the samples taken while some job was. Ten placement rounds, so
    a job that only waits for the next round does not count."""


@attrs.frozen(kw_only=True)
class PreemptionBenchSettings:
    """One run: ``tries`` jobs of priority 10, each ``cpu_millis`` (fits no free room of a full
    cluster), one at a time, into a cluster of ``workers`` workers filled with jobs of
    ``filler_cpu_millis`` that ignore SIGTERM; ``grace_s`` the preemption grace."""

    tries: int = 10
    workers: int = 5
    grace_s: float = 2.0
    cpu_millis: int = 2000
    filler_cpu_millis: int = 1000
    ignore_term: bool = True
    """The filler jobs ignore SIGTERM: every preemption waits out the whole grace."""
    timeout_s: float = 120.0


@attrs.frozen(kw_only=True)
class ScaleSettings:
    """How ``stockade bench scale`` runs."""

    workers: tuple[int, ...] = (100, 500, 1000, 2000)
    """Worker counts, one step each, in this order."""
    duration_s: float = 60.0
    """Length of each step's measured window, seconds."""
    real_agents: bool = False
    """Run steps of at most :data:`ops.bench.scale_report.REAL_AGENTS_LIMIT` workers as real
    agents in fleets; larger steps (and all without it) use the load generator."""
    pending_jobs: int = 10_000
    """Jobs kept pending (topped up every second) so each placer round reads a long queue."""
    heartbeat_interval_s: float | None = None
    """None: the cluster chooses the heartbeat interval and dead_after as it would anywhere; a
    number: every worker heartbeats this often (:func:`ops.bench.heartbeat_flags`)."""
    kills: int = 3
    """Workers killed in each step (each holding long jobs)."""
    job_s: tuple[float, float] = (10.0, 30.0)
    """Sleep of the queue's jobs, drawn uniformly from this range, seconds."""
    fleet_size: int = 25
    """Most workers per fleet with real agents (a step has at least four fleets)."""
    insecure: bool = False
    seed: int = 1
    settle_s: float = SETTLED_S
    """The warm-up waits until the heartbeat interval has not changed for this long (s)."""

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self, retain_collection_types=False)
