"""``stockade bench pack``: how well and how fast the placer packs, on this machine: every
policy on a seeded stream all at once and arriving, a burst into an empty cluster, and the
placer round as the queue and the cluster grow (docs/benchmarks.md, "`just bench-pack`"; the
figures: docs/design.md, "Packing figures").
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
