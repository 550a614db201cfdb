"""``stockade bench pack``: how well and how fast the placer packs, on this machine: every
policy on a seeded stream all at once and arriving, a burst into an empty cluster, and the
placer round as the queue and the cluster grow (docs/benchmarks.md, "`just bench-pack`"; the
figures: docs/design.md, "Packing figures").
"""

from ops.bench.pack.figures import (
    PhaseFigures,
    PlacerFigures,
    ProbeFigures,
    WaitFigures,
    histogram_quantile,
    overcommitted_workers,
    placer_figures,
    wait_figures,
)
from ops.bench.pack.report import (
    BurstResult,
    PackReport,
    PolicyResult,
    ScalePoint,
    Scenario,
    plot,
    render,
    save,
)
from ops.bench.pack.scenarios import run_pack, run_policy, run_scale_point
from ops.bench.settings import POLICIES, PackSettings

__all__ = [
    "POLICIES",
    "BurstResult",
    "PackReport",
    "PackSettings",
    "PhaseFigures",
    "PlacerFigures",
    "PolicyResult",
    "ProbeFigures",
    "ScalePoint",
    "Scenario",
    "WaitFigures",
    "histogram_quantile",
    "overcommitted_workers",
    "placer_figures",
    "plot",
    "render",
    "run_pack",
    "run_policy",
    "run_scale_point",
    "save",
    "wait_figures",
]
