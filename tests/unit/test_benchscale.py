"""The pure parts of ``stockade bench scale`` and its load generator: statistics, growth per
doubling, the JSON's shape, the ``--workers`` check, the home control plane of a worker, and
the simulated Worker service's checks of epoch, incarnation and assignment ids."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from typer.testing import CliRunner

from ops.bench.loadgen.generator import LoadGenerator, home_control_plane, percentile, worker_ids
from ops.bench.loadgen.service import SimulatedWorkerService
from ops.bench.metrics import bucket_delta, cpu_used, per_1000
from ops.bench.scale_report import (
    GROWTH_METRICS,
    WORKERS_LIMIT,
    ScalePoint,
    ScaleReport,
    growth_per_doubling,
    parse_workers,
)
from ops.cli import EXIT_INVALID, app
from protocol import pb
from runtime.errors import InvalidArgument


def _point(workers: int, **values: object) -> ScalePoint:
    defaults = {f.name: None for f in attrs.fields(ScalePoint)}
    defaults |= {
        "workers": workers,
        "mode": "loadgen",
        "duration_s": 60.0,
        "heartbeat_interval_s": 1.0,
        "heartbeats": 0,
        "heartbeats_per_s": 0.0,
        "heartbeats_acked": 0,
        "heartbeat_failures": 0,
        "reregisters": 0,
        "self_fences": 0,
        "false_deaths": 0,
        "deaths": 0,
        "elections": 0,
        "placer_rounds": 0,
        "killed_workers": (),
        "jobs_moved": 0,
        "jobs_not_moved": 0,
    }
    return ScalePoint(**(defaults | values))  # type: ignore[arg-type]


def test_percentile_is_the_nearest_rank() -> None:
    """p50 of 1..100 is 50, p99 is 99, p100 is the largest; none of nothing."""
    values = [float(v) for v in range(100, 0, -1)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (50.0, 99.0, 100.0)
    assert percentile([], 0.5) is None


def test_percentile_refuses_a_quantile_outside_0_to_1() -> None:
    with pytest.raises(ValueError, match=r"q must be in 0\.\.1, got 1\.5"):
        percentile([1.0], 1.5)


def test_a_worker_has_one_stable_home_and_the_homes_spread() -> None:
    """The same id always maps to the same control plane, and 1,000 ids use all three."""
    ids = worker_ids(1000)
    homes = [home_control_plane(w, 3) for w in ids]
    assert homes == [home_control_plane(w, 3) for w in ids]
    assert all(homes.count(i) > 250 for i in range(3))


def test_growth_per_doubling_normalises_uneven_steps() -> None:
    """x4 over a quadrupling is x2 per doubling; x1 is flat; a missing value gives None."""
    points = [_point(100, ack_p99_ms=10.0), _point(400, ack_p99_ms=40.0), _point(800, ack_p99_ms=None)]
    assert growth_per_doubling(points, "ack_p99_ms") == [
        {"from": 100, "to": 400, "factor": 2.0},
        {"from": 400, "to": 800, "factor": None},
    ]
    flat = [_point(100, heartbeats_per_s=5.0), _point(200, heartbeats_per_s=5.0)]
    assert growth_per_doubling(flat, "heartbeats_per_s") == [{"from": 100, "to": 200, "factor": 1.0}]


def test_the_json_has_settings_points_and_growth_of_every_metric() -> None:
    report = ScaleReport(settings={"workers": [100, 200]}, points=(_point(100), _point(200)))
    data = report.to_json()
    assert set(data) == {"settings", "points", "growth_per_doubling"}
    assert set(data["points"][0]) == {f.name for f in attrs.fields(ScalePoint)}
    assert set(data["growth_per_doubling"]) == set(GROWTH_METRICS)
    assert report.ok and not ScaleReport(settings={}, points=(_point(1, false_deaths=1),)).ok


def test_workers_list_is_parsed_and_sorted() -> None:
    assert parse_workers("500, 100") == (100, 500)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100,abc", "--workers must list whole numbers of workers in 1..20000, got 'abc'"),
        ("0", f"--workers must list worker counts in 1..{WORKERS_LIMIT}, got 0"),
        ("100,30000", f"--workers must list worker counts in 1..{WORKERS_LIMIT}, got 30000"),
        ("100,100", "--workers must not list a count twice, got 100"),
        ("100,", "--workers must be comma-separated worker counts such as 100,500, got '100,'"),
    ],
)
def test_bad_workers_values_are_named_with_the_limit(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_workers(text)
    assert str(raised.value) == message


def test_the_command_refuses_bad_workers_before_anything_starts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = CliRunner().invoke(app, ["bench", "scale", "--state-dir", str(state), "--workers", "100,-3"])
    assert result.exit_code == EXIT_INVALID
    assert "--workers must list worker counts in 1..20000, got -3" in result.output
    assert not state.exists()


def test_window_arithmetic() -> None:
    """Bucket deltas subtract per bound; CPU counts new processes whole; per 1,000 heartbeats."""
    assert bucket_delta({0.1: 2.0, float("inf"): 3.0}, {0.1: 5.0, float("inf"): 9.0}) == [
        (0.1, 3.0),
        (float("inf"), 6.0),
    ]
    assert cpu_used({1: 1.0, 2: 5.0}, {1: 1.5, 3: 2.0}) == 2.5
    assert per_1000(2.0, 500) == 4.0 and per_1000(1.0, 0) is None


def _service() -> tuple[SimulatedWorkerService, LoadGenerator]:
    gen = LoadGenerator(
        control_planes=["127.0.0.1:1"],
        count=1,
        cpu_millis=1000,
        memory_mb=1024,
        interval_s=1.0,
        timeout_s=1.5,
        self_fence_s=3.5,
        cert_dir=None,
    )
    gen.setup()
    worker = gen.workers["sim-1"]
    worker.incarnation, worker.epoch_seen = 7, 3
    return SimulatedWorkerService(gen), gen


def _assignment(aid: int, *, sleep: bool = True) -> pb.Assignment:
    runtime = {"sleep": pb.SleepRuntime(duration_ms=60_000)} if sleep else {"command": pb.CommandRuntime()}
    spec = pb.JobSpec(name="j", cpu_millis=500, memory_mb=256, **runtime)  # type: ignore[arg-type]
    return pb.Assignment(assignment_id=aid, job_id=aid, spec=spec, committed_epoch=3)


async def test_the_simulated_worker_checks_epoch_incarnation_and_ids() -> None:
    """Stale epochs and other incarnations are refused; a duplicate is acknowledged and runs
    once; a cancelled id is refused for ever and acknowledged again when asked again; a job
    that is not a sleep is refused."""
    service, gen = _service()
    worker = gen.workers["sim-1"]
    stale = await service.assign(
        pb.AssignRequest(epoch=2, worker_id="sim-1", incarnation=7, assignments=[_assignment(1)])
    )
    assert [r.reason for r in stale.refused] == ["stale_epoch"] and not worker.running
    other = await service.assign(
        pb.AssignRequest(epoch=3, worker_id="sim-1", incarnation=6, assignments=[_assignment(1)])
    )
    assert [r.reason for r in other.refused] == ["wrong_incarnation"]
    request = pb.AssignRequest(
        epoch=4, worker_id="sim-1", incarnation=7, assignments=[_assignment(1), _assignment(2, sleep=False)]
    )
    first = await service.assign(request)
    again = await service.assign(request)
    assert first.accepted_ids == again.accepted_ids == [1] and list(worker.running) == [1]
    assert [r.reason for r in first.refused] == ["bad_spec"] and first.epoch_seen == 4
    cancelled = await service.cancel(
        pb.CancelRequest(epoch=4, worker_id="sim-1", incarnation=7, assignment_ids=[1])
    )
    assert cancelled.acknowledged_ids == [1] and not worker.running
    asked_again = await service.cancel(
        pb.CancelRequest(epoch=4, worker_id="sim-1", incarnation=7, assignment_ids=[1])
    )
    assert asked_again.acknowledged_ids == [1] and not asked_again.finished_ids  # as an agent answers
    refused = await service.assign(
        pb.AssignRequest(epoch=4, worker_id="sim-1", incarnation=7, assignments=[_assignment(1)])
    )
    assert [r.reason for r in refused.refused] == ["cancelled"]


async def test_a_finished_sleep_is_reported_succeeded_until_acknowledged() -> None:
    service, gen = _service()
    worker = gen.workers["sim-1"]
    await service.assign(
        pb.AssignRequest(epoch=3, worker_id="sim-1", incarnation=7, assignments=[_assignment(5)])
    )
    run = worker.running[5]
    worker.settle(run.ends + 0.25)
    (outcome,) = worker.outcomes(run.ends + 0.25)
    assert (outcome.assignment_id, outcome.state, outcome.exit_code) == (5, "succeeded", 0)
    assert (outcome.run_ms, outcome.ended_ago_ms) == (60_000, 250) and not worker.running


def test_the_embedded_server_loads_the_libraries_asked_for(tmp_path: Path) -> None:
    """``preload_libraries`` becomes ``shared_preload_libraries``; none asked, none set."""
    from ops.launcher.pg import EmbeddedPostgres

    asked = EmbeddedPostgres(data_dir=tmp_path, port=5999, preload_libraries=("pg_stat_statements",))
    assert asked.server_settings()["shared_preload_libraries"] == "pg_stat_statements"
    assert "shared_preload_libraries" not in EmbeddedPostgres(data_dir=tmp_path, port=5999).server_settings()


def test_the_interval_a_reply_names_wins_over_the_own_setting() -> None:
    """A reply with ``heartbeat_interval_ms`` set (a protocol that has the field) sets the
    interval; a reply without it, or with 0, keeps the generator's own."""
    from types import SimpleNamespace

    from ops.bench.loadgen.generator import _interval_of

    assert _interval_of(SimpleNamespace(heartbeat_interval_ms=2500), 1.0) == 2.5
    assert _interval_of(SimpleNamespace(heartbeat_interval_ms=0), 1.0) == 1.0
    assert _interval_of(pb.HeartbeatReply(epoch=1), 1.0) == 1.0


def test_gc_pauses_over_a_bound_count_the_window_only() -> None:
    """Two endpoints' pause histograms: the collections longer than 0.1 s in the window are
    those above the 0.1 bucket in the differences, summed (here 1 + 2)."""
    from ops.bench.metrics import MetricsDelta, Scraped

    def scraped(le_01: float, total: float) -> Scraped:
        return Scraped(
            heartbeats=0.0,
            rounds={},
            round_trips={},
            agent_failures=0.0,
            gc_pauses={0.05: le_01, 0.1: le_01, 1.0: total, float("inf"): total},
        )

    before = {"a": scraped(10, 11), "b": scraped(5, 5)}
    after = {"a": scraped(20, 22), "b": scraped(6, 8)}
    assert MetricsDelta.of(before, after).gc_pauses_over(0.1) == 3


def test_the_table_shows_every_measure_of_four_steps_whole_in_80_columns() -> None:
    """One row per measure, one column per worker count: in a terminal 80 columns wide, four
    steps' figures and every measure's name are printed whole (no cell cut short)."""
    import io

    from rich.console import Console

    from ops.bench.scale_report import render

    points = [
        _point(n, recovery_p50_s=13.661, ack_p99_ms=1837.776, workers_dead_rows=696)
        for n in (100, 500, 1000, 2000)
    ]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render(ScaleReport(settings={}, points=points)))
    text = out.getvalue()
    assert "…" not in text
    for heading in ("100", "500", "1,000", "2,000", "recovery p50 s", "ack p99 ms", "workers dead rows"):
        assert heading in text
    assert text.count("13.7") == 4 and text.count("1838") == 4
