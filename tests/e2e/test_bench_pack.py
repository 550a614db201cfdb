"""A small version of `stockade bench pack` (10 workers in fleets), all at once and arriving:
correctness only, no timing goals: every job finishes, none is placed or run twice, no worker
is ever over-committed according to its own log."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.bench.pack import PackSettings, run_policy

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def bench_root() -> Iterator[Path]:
    """A folder for the bench's cluster outside pytest's basetemp: its embedded PostgreSQL runs
    as another user, and a pytest session started meanwhile closes the basetemp's root (0700)
    under it (as in tests/e2e/test_bench_scale_command.py)."""
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-pack-"))
    try:
        yield root / "pack"
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_the_packing_benchmark_smoke_run_is_correct() -> None:
    """Best fit on a seeded 300-job stream, durations scaled down to a tenth (and the time a
    job must have been pending to count as waiting with them)."""
    settings = PackSettings(
        jobs=300,
        workers=10,
        fleet_size=5,
        policies=("best_fit",),
        duration_scale=0.1,
        waiting_after_s=0.1,
        finish_timeout_s=120,
    )
    with bench_root() as root:
        result = await run_policy(settings, "best_fit", root, lambda line: None)
    assert result.check.jobs_finished == 300 and result.check.unfinished_job_ids == ()
    assert (result.check.double_placements, result.check.double_runs) == (0, 0)
    assert result.overcommitted_workers == ()
    assert result.placer.rounds > 0 and result.placer.placements == 300
    assert result.cpu_use_waiting is not None and 0 < result.cpu_use_waiting <= 1
    assert result.cpu_use_pending is not None and 0 < result.cpu_use_pending <= 1
    probes = result.probes
    assert probes.db_commit_p50_ms is not None and probes.db_commit_max_ms is not None
    assert probes.db_commit_p50_ms > 0 and probes.db_commit_max_ms >= probes.db_commit_p50_ms
    assert not result.failed(300)
    flat = result.to_json()
    assert flat["placements"] == 300 and flat["db_commit_p50_ms"] == probes.db_commit_p50_ms


async def test_the_arriving_scenario_smoke_run_is_correct() -> None:
    """Worst fit on a seeded 150-job stream arriving at 30 jobs/s (about 28 % of what the 10
    workers can run at a tenth of the durations): every job is submitted, placed once and
    finished."""
    settings = PackSettings(
        jobs=150, workers=10, fleet_size=5, policies=("worst_fit",), duration_scale=0.1, finish_timeout_s=120
    )
    with bench_root() as root:
        result = await run_policy(settings, "worst_fit", root, lambda line: None, arrival_rate_per_s=30.0)
    assert result.arrival_rate_per_s == 30.0
    assert result.check.jobs_finished == 150 and result.check.unfinished_job_ids == ()
    assert (result.check.double_placements, result.check.double_runs) == (0, 0)
    assert result.overcommitted_workers == ()
    assert result.placer.placements == 150
