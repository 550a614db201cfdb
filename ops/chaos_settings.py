"""What ``stockade chaos`` (:mod:`ops.chaos`) is asked to do: :class:`ChaosSettings`, and the
constants a run's faults and jobs follow. Only attrs: ``stockade chaos`` declares its options
from these defaults without loading the harness."""

from __future__ import annotations

import attrs

CHAOS_PREEMPT_GRACE_S = 1.0
"""The preemption grace of a chaos run with ``preemption``, seconds."""
CHAOS_PREEMPT_COOLDOWN_S = 5.0
"""The preemption cooldown of a chaos run with ``preemption``, seconds."""
HIGH_PRIORITY_EVERY = 15
"""With ``preemption``, every this-many-th job asks 4,000 cpu_millis at :data:`HIGH_PRIORITY` (the
others stay at 0), so it often fits nowhere and preempts."""
HIGH_PRIORITY = 10
"""The priority of those jobs; with ``accounts`` > 1 each user account is given it as its
``max_priority`` (users are capped at 0 otherwise: docs/quotas.md)."""
PREEMPTION_JOB_DURATION_S = (2.0, 6.0)
"""With ``preemption``, the jobs' durations (uniform, seconds) and sizes of 1,000, 2,000 or 4,000
cpu_millis: about 1.4 times what the 10 workers of a chaos run hold at 12 jobs/s, so the
cluster is full and a backlog builds."""
CHAOS_GPUS_PER_WORKER = 8
"""With ``devices``, the fake gpu units each worker of a chaos run offers (``--resource gpu=0,...,7``)."""
DEVICE_JOB_GPUS = (1, 4)
"""With ``devices``, the gpu a device job asks: uniform, inclusive."""
DEVICE_JOB_DURATION_S = (3.0, 9.0)
"""With ``devices``, a device job's duration (uniform, seconds): at 12 jobs/s, a share of 0.75 of
them asking 2.5 gpu for 6 s on average want about 135 of the 80 gpu of 10 workers, so the gpu
stay busy and a device backlog builds (what the device use while jobs wait is measured on); a
unit idles between two jobs for a heartbeat and a round, a smaller share of a longer job."""
FAILING_MAX_ATTEMPTS = 2
"""Runs of a job a chaos run makes to fail (:attr:`ChaosSettings.failing_share`): one retry."""


CHAOS_SCHEDULE_NAME = "chaos-tick"
CHAOS_SCHEDULE_DEADLINE_S = 30
"""The chaos schedule's starting deadline: a slot missed during a takeover (a few seconds) still
fires; one missed longer (a database outage) is recorded missed."""


@attrs.frozen(kw_only=True)
class ChaosSettings:
    """One chaos run. Durations in seconds."""

    failovers: int = 200
    """Leader failovers to inject, alternating kill and freeze (kill first)."""
    worker_kills: int = 0
    """Workers to SIGKILL (and restart) along the way, spread over the run."""
    worker_restarts: int = 0
    """Planned restarts of workers (SIGHUP: the agent exits leaving its jobs running, and is
    started again to take them over), spread over the run."""
    partitions: int = 0
    """Times to cut a worker off from every control plane for ``partition_s``, spread over the run."""
    partition_s: float = 4.0
    """How long a partition lasts: longer than dead_after (2.5 s), so its jobs are moved."""
    mass_partitions: int = 0
    """Times to cut every worker off at once for ``mass_partition_s``, spread over the run: the
    leader must hold its declarations and the paused jobs resume when contact returns."""
    mass_partition_s: float = 10.0
    db_restarts: int = 0
    """Times to stop the database (fast shutdown and SIGKILL, alternating) for a random time in
    ``db_down_s``, spread over the run."""
    db_down_s: tuple[float, float] = (2.0, 12.0)
    db_failovers: int = 0
    """With ``ha_db``: times to SIGKILL the database's primary host, wait for the standby's
    promotion and start the old primary again as the standby, spread over the run."""
    ha_db: bool = False
    """Run the chaos cluster on the HA PostgreSQL pair (``stockade up --ha-db``)."""
    docker: bool = False
    """Run the chaos cluster in containers (``stockade up --docker``)."""
    control_planes: int = 3
    workers: int = 10
    submit_rate_per_s: float = 12.0
    """Sleep jobs submitted per second during the injections."""
    job_duration_s: tuple[float, float] = (0.2, 2.0)
    """Uniform range of the sleep jobs' durations."""
    failing_share: float = 0.1
    """Share of the jobs (0 to 1) made to fail: a command that exits 3, with ``max_attempts``
    :data:`FAILING_MAX_ATTEMPTS`, so it must end failed, its attempts spent."""
    freeze_s: float = 3.0
    """How long a plain freeze lasts (more than the 2 s lease)."""
    mid_transaction_freeze_s: float = 5.0
    """How long a freeze inside a fenced transaction lasts (more than lease + idle timeout)."""
    mid_transaction_every: int = 5
    """Freezes 2, 2 + this, 2 + 2 * this, ... park inside a fenced transaction (0: never)."""
    settle_s: float = 0.3
    """Pause after each failover, before the next."""
    new_leader_timeout_s: float = 20.0
    """Give up waiting for a new leader after this long (counts as a failed run)."""
    finish_timeout_s: float = 300.0
    """After the injections, how long the wait for every job to finish goes on with no job
    ending before it gives up (a stall); it goes on as long as jobs keep ending."""
    seed: int = 1
    accounts: int = 1
    """User accounts the jobs are submitted by, round-robin (chaos-1, chaos-2, ...; weights 1, 2,
    3 in turn; max_priority :data:`HIGH_PRIORITY`); 1: every job is the operator's."""
    schedule_every_s: int = 2
    """A schedule firing a short sleep job every this many seconds (6-field cron ``*/N * * * *
    *``, a starting deadline of :data:`CHAOS_SCHEDULE_DEADLINE_S`) runs through the run and is
    paused at its end; the checker proves each of its slots was recorded once (0: none)."""
    gangs: bool = False
    """Mix gangs into the jobs (docs/gangs.md): every :data:`GANG_EVERY`-th submission is a gang of
    2 to 8 sleep tasks (every other one spread when smaller than ``workers``, ``max_attempts``
    :data:`GANG_MAX_ATTEMPTS`),
    and the database is sampled for partial gangs every :data:`GANG_SAMPLE_EVERY_S`."""
    preemption: bool = False
    """Run the control planes with preemption on (``--preemption``, a grace of
    :data:`CHAOS_PREEMPT_GRACE_S`, a cooldown of :data:`CHAOS_PREEMPT_COOLDOWN_S`); every
    :data:`HIGH_PRIORITY_EVERY`-th job then asks a whole worker at priority 10."""
    devices: bool = True
    """Give every worker :data:`CHAOS_GPUS_PER_WORKER` fake gpu units and make ``device_share``
    of the jobs ask 1 to 4 of them (docs/devices.md); the checker then also checks that no unit
    was held by two jobs at once."""
    device_share: float = 0.75
    """With ``devices``: the share of jobs (0 to 1) that ask gpu."""


GANG_EVERY = 5
"""With ``--gangs``, every fifth submission is a gang."""
GANG_MAX_ATTEMPTS = 20
"""A chaos gang's attempts (its kills spend none: count_lost is off; a spare for anything else)."""
GANG_SAMPLE_EVERY_S = 0.5
"""How often a chaos run with ``--gangs`` reads the view ``partial_gangs``."""
FINISH_PROGRESS_EVERY_S = 30.0
"""How often the wait for every job to finish says how many are left."""
