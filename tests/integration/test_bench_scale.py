"""One point of `stockade bench pack`'s scale curve, small, on the real database: the real
placer's rounds against simulated busy workers (their rows written the way the schema keeps
them)."""

from __future__ import annotations

from rich.console import Console

from ops.bench.pack import PackReport, PackSettings, Scenario, render, run_scale_point
from runtime.aio import PgConnection, asyncio_bridge


async def test_a_small_scale_point_runs_the_real_placer_rounds(database_url: str) -> None:
    point = await run_scale_point(database_url, pending=200, workers=10, rounds=3)
    assert (point.pending, point.workers) == (200, 10)
    assert point.placed > 0  # the freed room of the simulated workers was used
    assert 0 < point.round_p50_ms <= point.round_max_ms


async def test_a_scale_point_with_gangs_stores_them_as_submit_job_does_and_reports(database_url: str) -> None:
    """A small point whose queue has gangs (and jobs asking gpu) runs its rounds and reports its
    gang share; each gang is one gangs row and its tasks, ranks 0 to size - 1, the first one's
    id the gang's."""
    point = await run_scale_point(
        database_url, pending=200, workers=10, rounds=3, device_share=0.25, gang_share=0.2
    )
    assert (point.pending, point.gang_share, point.gang_tasks) == (200, 0.2, 40)
    assert 0 < point.round_p50_ms <= point.round_max_ms
    console = Console(width=200, record=True)
    console.print(
        render(
            PackReport(settings=PackSettings(), all_at_once=Scenario(title="", policies=()), scale=(point,))
        )
    )
    assert "(25% asking gpu, 20% in gangs): round p50" in console.export_text()
    async with asyncio_bridge():
        db = await PgConnection.connect(database_url)
        try:
            gangs = await db.fetch(GANGS)
        finally:
            await db.close()
    assert sum(g["tasks"] for g in gangs) == 40
    assert all(2 <= g["size"] == g["tasks"] <= 8 for g in gangs)
    assert all(g["first"] == g["id"] and g["ranks"] == list(range(g["size"])) for g in gangs)
    assert all(g["no_devices"] and g["state"] == "live" for g in gangs)
    assert any(g["spread"] for g in gangs) and not all(g["spread"] for g in gangs)


GANGS = """
SELECT g.id, g.size, g.spread, g.state, count(j.id) AS tasks, min(j.id) AS first,
       array_agg(j.gang_rank ORDER BY j.gang_rank) AS ranks, bool_and(j.resources = '{}') AS no_devices
  FROM gangs g JOIN jobs j ON j.gang_id = g.id GROUP BY g.id ORDER BY g.id
"""
