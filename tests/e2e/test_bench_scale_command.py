"""A tiny ``stockade bench scale`` (10 simulated workers, a short window) end to end: every
field of the JSON is there and measured, and nothing it started is left running. No timing
goals."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import attrs
import psutil
import pytest

from ops.bench import scale_report
from ops.bench.scale import ScaleSettings, run_scale

pytestmark = pytest.mark.e2e

MAY_BE_NONE = {"loadgen_cpu_s_per_1000_heartbeats", "loadgen_gc_pause_max_ms"}
"""Fields a run may leave None; every other is measured by even the smallest run."""


def _ours(root: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if str(root) in cmdline:
            found.append(process)
    return found


async def test_a_tiny_scale_run_reports_every_field_and_stops_everything(tmp_path: Path) -> None:
    """One killed worker's two jobs are timed until they run elsewhere; no false death."""
    settings = ScaleSettings(workers=(10,), duration_s=8.0, pending_jobs=100, kills=1, settle_s=0.0)
    # The database's files live outside pytest's basetemp, which another pytest session may
    # close (0700) under the server's user (tests/conftest.py, pg_admin_url).
    root = Path(tempfile.mkdtemp(prefix="stockade-bench-scale-"))
    try:
        report = await run_scale(settings, root, lambda line: None)
        assert _ours(root) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = tmp_path / "bench-scale.json"
    scale_report.save(out, report)
    scale_report.plot(report, out.with_suffix(".png"))
    data = json.loads(out.read_text())
    (point,) = data["points"]
    assert set(point) == {f.name for f in attrs.fields(scale_report.ScalePoint)}
    assert [k for k, v in point.items() if v is None and k not in MAY_BE_NONE] == []
    assert point["workers"] == 10 and point["mode"] == "loadgen"
    assert point["heartbeats"] > 0 and point["heartbeats_acked"] > 0 and point["heartbeat_failures"] == 0
    assert point["false_deaths"] == 0 and point["killed_workers"] == ["sim-1"]
    assert point["jobs_moved"] == 2 and point["jobs_not_moved"] == 0
    assert point["placer_rounds"] > 0
    assert set(data["growth_per_doubling"]) == set(scale_report.GROWTH_METRICS)
    assert out.with_suffix(".png").stat().st_size > 0
