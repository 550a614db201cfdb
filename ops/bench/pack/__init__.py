"""``stockade bench pack``: how well and how fast the placer packs, on this machine.

Three parts, each printing measured numbers (timing goals are never asserted in tests):

1. Packing: for each policy (best fit, first fit, worst fit), a fresh cluster (3 control
   planes, 100 workers hosted in fleets) gets the same seeded stream of 10,000 sleep jobs in
   two scenarios, each on a fresh cluster: all submitted at the start ("all at once"), then
   arriving over time ("arriving"): a Poisson process at ``PackSettings.arrival_rate_per_s``
   (105 jobs/s, about 91 % of what the 100 workers can run for this stream), its gaps drawn by
   ``arrival_times`` from a generator of their own, submitted in batches every 0.1 s. All at
   once, the queue is so long that any free room is refilled by some small job and the
   policies tie; arriving near capacity, the queue stays short and how well a policy keeps
   room usable shows. Sampled every 0.5 s from the database: allocated / total capacity of
   CPU and memory, the pending count and how many of those have been pending for a second or
   more. Reported per scenario: ``cpu_use_waiting`` and ``memory_use_waiting`` (mean use over
   the samples taken while some job had been pending for a second or more: waiting for room,
   not for the next round; ``PackSettings.waiting_after_s``), ``cpu_use_pending`` (the same
   over every sample with any job pending), time
   from the first submit until every job finished and jobs per second, makespan against its
   lower bound (the largest of total requested cpu x seconds over total CPU, the same for
   memory, the longest job and, when jobs arrive, the latest arrival plus duration), the
   leader's round time p50 / p99 (from its Prometheus histogram, interpolated within a bucket
   as ``histogram_quantile`` does) and max, and placements per second.
2. Burst: 10,000 small jobs submitted at once into an empty cluster with room for all of
   them; the time from the first submit until every job is started by its worker (its start
   record in the worker's log): ``burst_placements_per_s``.
3. Scale curve: the real placer round (reads, decision, fenced commit) against a database
   holding 1,000 / 10,000 / 100,000 pending jobs and 100 / 1,000 simulated busy workers, with a
   little room freed before each round so every round places a job or two.

The package, in four parts: :mod:`~ops.bench.pack.stream` (the seeded jobs, their arrivals, the
makespan's lower bound, the settings), :mod:`~ops.bench.pack.scenarios` (each scenario on its
own cluster, and :func:`run_pack` running them all), :mod:`~ops.bench.pack.figures` (what is
computed from the measurements) and :mod:`~ops.bench.pack.report` (the typed results, their
table, picture and JSON). Beside them, :mod:`~ops.bench.pack.unschedulable` times the real round
against a queue mostly of jobs no worker can hold (``stockade bench unschedulable``).
"""

from ops.bench.pack.figures import (
    LARGE_CPU_MILLIS,
    PHASES,
    PhaseFigures,
    PlacerFigures,
    ProbeFigures,
    WaitFigures,
    histogram_quantile,
    overcommitted_workers,
    placer_figures,
    probe_figures,
    scrape,
    wait_figures,
)
from ops.bench.pack.report import (
    BurstResult,
    PackReport,
    PolicyResult,
    ScalePoint,
    Scenario,
    growth,
    plot,
    render,
    save,
)
from ops.bench.pack.scenarios import probe_commits, run_burst, run_pack, run_policy, run_scale_point
from ops.bench.pack.stream import (
    POLICIES,
    WORKER_SHAPES,
    JobDraw,
    PackSettings,
    arrival_times,
    job_stream,
    lower_bound_s,
    submit_arriving,
)

__all__ = [
    "LARGE_CPU_MILLIS",
    "PHASES",
    "POLICIES",
    "WORKER_SHAPES",
    "BurstResult",
    "JobDraw",
    "PackReport",
    "PackSettings",
    "PhaseFigures",
    "PlacerFigures",
    "PolicyResult",
    "ProbeFigures",
    "ScalePoint",
    "Scenario",
    "WaitFigures",
    "arrival_times",
    "growth",
    "histogram_quantile",
    "job_stream",
    "lower_bound_s",
    "overcommitted_workers",
    "placer_figures",
    "plot",
    "probe_commits",
    "probe_figures",
    "render",
    "run_burst",
    "run_pack",
    "run_policy",
    "run_scale_point",
    "save",
    "scrape",
    "submit_arriving",
    "wait_figures",
]
