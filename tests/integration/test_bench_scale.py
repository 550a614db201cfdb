"""One point of `stockade bench pack`'s scale curve, small, on the real database: the real
placer's rounds against simulated busy workers (their rows written the way the schema keeps
them)."""

from __future__ import annotations

from ops.bench.pack import run_scale_point


async def test_a_small_scale_point_runs_the_real_placer_rounds(database_url: str) -> None:
    point = await run_scale_point(database_url, pending=200, workers=10, rounds=3)
    assert (point.pending, point.workers) == (200, 10)
    assert point.placed > 0  # the freed room of the simulated workers was used
    assert 0 < point.round_p50_ms <= point.round_max_ms
