"""``stockade bench unschedulable`` on a real database, small: it stores every unschedulable
reason before timing, times the rounds asked for, and places small jobs as room frees."""

from __future__ import annotations

from ops.bench.pack.unschedulable import run_unschedulable


async def test_the_bench_settles_the_reasons_then_times_its_rounds(database_url: str) -> None:
    """With 300 jobs too large and 50 small ones on 5 workers, the first round stores every
    reason (at most 500 rows a round), so no round is needed to settle them; then 5 rounds are
    timed and some small jobs are placed."""
    result = await run_unschedulable(database_url, unschedulable=300, schedulable=50, workers=5, rounds=5)
    assert (result.unschedulable, result.schedulable, result.workers) == (300, 50, 5)
    assert result.settle_rounds == 0 and result.rounds == 5
    assert result.placed > 0
    assert 0 < result.round_p50_ms <= result.round_p99_ms <= result.round_max_ms
