"""The typed results of chaos, check and the benchmarks: each is written to JSON with the keys
README and the tests read, and rendered for the terminal by one function."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ops.bench import pack
from ops.bench.failover import FailoverFigures, FailoverSamples, failover_table
from ops.bench.overload import OverloadResult, OverloadSettings, StepResult, render, save
from ops.bench.pack import (
    BurstResult,
    PackReport,
    PackSettings,
    PhaseFigures,
    PlacerFigures,
    PolicyResult,
    ProbeFigures,
    ScalePoint,
    Scenario,
    WaitFigures,
)
from ops.chaosresult import ChaosResult, chaos_table
from ops.checker import check_table
from ops.checker_records import History
from ops.checker_report import CheckReport
from ops.cli import EXIT_INVALID, app
from ops.faults import Failover
from ops.invariants import check

REPORT = CheckReport(
    double_placements=0,
    double_runs=0,
    false_deaths=0,
    stale_writes_rejected=2,
    jobs_submitted=10,
    jobs_finished=10,
    unfinished_job_ids=(),
    details=("worker w-1 [red]declared[/red] dead",),
    elections=3,
)


def text(renderable: object) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


PACK_CHECK = attrs.evolve(REPORT, jobs_submitted=300, jobs_finished=300, elections=1)


def policy(name: str, cpu_use_waiting: float, **changes: object) -> PolicyResult:
    fields: dict[str, object] = {
        "policy": name,
        "arrival_rate_per_s": None,
        "cpu_use_waiting": cpu_use_waiting,
        "memory_use_waiting": 0.5,
        "cpu_use_pending": 0.9,
        "finished_s": 100.0,
        "jobs_per_s": 3.0,
        "makespan_lower_bound_s": 90.0,
        "makespan_over_bound": 1.111,
        "placer": PlacerFigures(
            round_p50_ms=1.0, rounds=10, placements=300, round_phases={"read": PhaseFigures(p50_ms=0.5)}
        ),
        "mean_pending_while_waiting": 4,
        "waits": WaitFigures(wait_p50_s=0.1),
        "placements_per_s": 3.0,
        "overcommitted_workers": (),
        "check": PACK_CHECK,
        "probes": ProbeFigures(db_commit_p50_ms=2.0, db_stalls=((3.0, 1.5),)),
        "samples": ((0.5, 0.9, 0.5, 10, 2),),
    }
    fields.update(changes)
    return PolicyResult(**fields)  # type: ignore[arg-type]


def test_a_policy_result_is_written_flat_with_its_figures_keys() -> None:
    """The placer's, the waits' and the probes' figures and the checker's counts sit among the
    policy's own keys, as in bench-pack.json."""
    data = policy("best_fit", 0.9, check=attrs.evolve(PACK_CHECK, elections=3, self_fences=1)).to_json()
    assert {"placer", "waits", "probes", "check"}.isdisjoint(data)
    assert {key: data[key] for key in pack.report.CHECK_KEYS} == {
        "double_placements": 0,
        "double_runs": 0,
        "lease_losses": 2,
        "worker_deaths": 0,
        "self_fences": 1,
        "extra_assignments": 0,
        "lost_successes": 0,
        "jobs_finished": 300,
        "unfinished_job_ids": [],
    }
    assert (data["rounds"], data["placements"], data["wait_p50_s"], data["db_commit_p50_ms"]) == (
        10,
        300,
        0.1,
        2.0,
    )
    assert data["round_phases"]["read"] == {"p50_ms": 0.5, "p99_ms": None}
    assert data["db_stalls"] == [[3.0, 1.5]]
    assert json.loads(json.dumps(data))["samples"] == [[0.5, 0.9, 0.5, 10, 2]]


def test_the_pack_report_keeps_its_json_keys_and_ratios(tmp_path: Path) -> None:
    """settings, policies, ratios, arrivals, burst, scale and scale_growth, as README lists them;
    the ratios are the first policy's figures over each other one's."""
    settings = PackSettings(jobs=300, arrival_rate_per_s=0, policies=("best_fit", "worst_fit"))
    report = PackReport(
        settings=settings,
        all_at_once=Scenario(
            title="all at once", policies=(policy("best_fit", 0.9), policy("worst_fit", 0.6))
        ),
        burst=BurstResult(burst_jobs=10, burst_started=10, burst_s=2.0, burst_placements_per_s=5.0),
        scale=(
            ScalePoint(
                pending=1000,
                workers=100,
                first_round_ms=9,
                round_p50_ms=1,
                round_p99_ms=2,
                round_max_ms=3,
                placed=40,
            ),
            ScalePoint(
                pending=10000,
                workers=100,
                first_round_ms=9,
                round_p50_ms=2,
                round_p99_ms=2,
                round_max_ms=3,
                placed=40,
            ),
        ),
    )
    data = report.to_json()
    assert list(data) == ["settings", "policies", "ratios", "arrivals", "burst", "scale", "scale_growth"]
    assert data["ratios"] == {
        "best_fit/worst_fit": {"cpu_use_waiting": 1.5, "memory_use_waiting": 1.0, "finished_s": 1.0}
    }
    assert data["arrivals"] is None and data["burst"]["burst_placements_per_s"] == 5.0
    assert data["scale"][0]["pending"] == 1000 and data["scale_growth"][0].startswith(
        "100 workers: p50 1 ms -> 2 ms"
    )
    assert report.ok
    shown = text(pack.render(report))
    assert "cpu_use_waiting" in shown and "best_fit / worst_fit: cpu_use_waiting x1.5" in shown
    assert "burst: 10 of 10 jobs started in 2.0 s" in shown
    assert "best_fit: database commits slower than 1 s: 1.5 s at 3 s" in shown
    pack.save(tmp_path / "pack.json", report)
    assert json.loads((tmp_path / "pack.json").read_text())["policies"][0]["policy"] == "best_fit"


def test_a_pack_report_with_a_disturbance_is_not_ok() -> None:
    """A lease lost in a run without faults fails the run."""
    report = PackReport(
        settings=PackSettings(jobs=300, arrival_rate_per_s=0),
        all_at_once=Scenario(
            title="all at once",
            policies=(policy("best_fit", 0.9, check=attrs.evolve(PACK_CHECK, elections=2)),),
        ),
    )
    assert not report.ok and report.to_json()["burst"] == {}


def test_the_overload_result_keeps_its_json_keys(tmp_path: Path) -> None:
    """settings, steps, the run's figures, check (stockade check --json's keys) and samples, in
    that order."""
    step = StepResult(
        step="10/s",
        offered_per_s=10.0,
        accepted_per_s=10.0,
        shed_per_s=0.0,
        failed_per_s=0.0,
        goodput_per_s=9.0,
        finish_p50_s=0.2,
        finish_p99_s=0.5,
        elections=0,
        worker_deaths=0,
        self_fences=1,
    )
    result = OverloadResult(
        settings=OverloadSettings(rates=(10.0,)),
        steps=(step, step),
        peak_goodput_per_s=9.0,
        last_step_over_peak=1.0,
        recovery_over_first=1.0,
        backlog_after_steps=0,
        drain_s=1.5,
        unfinished_after_drain=0,
        check=REPORT,
        samples=((1.0, 0, 1, 2),),
    )
    data = result.to_json()
    assert list(data) == [
        "settings",
        "steps",
        "peak_goodput_per_s",
        "last_step_over_peak",
        "recovery_over_first",
        "backlog_after_steps",
        "drain_s",
        "unfinished_after_drain",
        "check",
        "samples",
    ]
    assert data["settings"]["rates"] == [10.0] and data["check"] == REPORT.to_json()
    assert data["steps"][0]["goodput_per_s"] == 9.0 and result.ok
    shown = text(render(result))
    assert "goodput" in shown and "disturbances: self_fences 2" in shown
    save(tmp_path / "o.json", result)
    assert json.loads((tmp_path / "o.json").read_text())["samples"] == [[1.0, 0, 1, 2]]


def test_the_failover_figures_keep_their_keys_and_summarise_the_samples() -> None:
    """p50 and max per kind from the samples, which are kept rounded to the millisecond."""
    figures = FailoverFigures.of(FailoverSamples(kill=(1.0, 2.00049, 3.0), worker_recovery=(4.0,)))
    data = figures.to_json()
    assert (data["failover_kill_p50_s"], data["failover_kill_max_s"]) == (2.0, 3.0)
    assert data["failover_freeze_p50_s"] is None
    assert data["samples"] == {"kill": [1.0, 2.0, 3.0], "freeze": [], "stop": [], "worker_recovery": [4.0]}
    shown = text(failover_table(figures))
    assert re.search(r"new leader after SIGKILL +3 +2\.00 s +3\.00 s", shown), shown


def test_the_chaos_result_keeps_its_json_keys_and_its_table_shows_the_verdicts() -> None:
    """The failover counts, the checker's counts and the details, markup shown as written."""
    result = ChaosResult(
        failovers=[
            Failover(kind="kill", leader="cp-1", epoch_before=1, epoch_after=2, seconds=1.5),
            Failover(kind="freeze_in_transaction", leader="cp-2", epoch_before=2, epoch_after=3, seconds=3.0),
        ],
        report=REPORT,
        duration_s=12.34,
    )
    data = result.to_json()
    assert data["failovers"] == {"killed": 1, "frozen": 1, "frozen_in_transaction": 1}
    assert (data["elections"], data["failover_kill_p50_s"], data["duration_s"], data["ok"]) == (
        3,
        1.5,
        12.3,
        True,
    )
    assert data["details"] == ["worker w-1 [red]declared[/red] dead"]
    shown = text(chaos_table(result))
    assert "failover_kill_p50_s / max" in shown and "1.50 s / 1.50 s" in shown
    assert "[red]declared[/red]" in shown and "FAIL" not in shown
    assert "worker_leaves" in text(check_table(REPORT))


def test_a_chaos_run_whose_jobs_did_not_all_finish_fails() -> None:
    """Chaos checks after waiting for every job: one still running fails it, its table saying
    FAIL for jobs_finished, not running."""
    report = check(History(assignments=(), job_states={1: "running"}), [])
    result = ChaosResult(report=report, duration_s=1.0)
    assert not result.ok and not result.to_json()["ok"]
    (line,) = [row for row in text(chaos_table(result)).splitlines() if "jobs_finished" in row]
    assert line.split()[-1] == "FAIL"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "-1"], "error: failovers must be an integer >= 0, got -1"),
        (["1", "--workers", "0"], "error: --workers must be an integer >= 1, got 0"),
        (["1", "--rate", "0"], "error: --rate must be a number >= 0.01, got 0.0"),
        (["1", "--partition-s", "0"], "error: --partition-s must be a number >= 0.01, got 0.0"),
    ],
)
def test_chaos_refuses_out_of_range_options_before_anything_starts(
    args: list[str], message: str, tmp_path: Path
) -> None:
    """An option's bounds refuse the value, naming the option, the limit and the value; no
    folder is made."""
    state = tmp_path / "state"
    result = CliRunner().invoke(app, ["chaos", *args, "--state-dir", str(state)])
    assert result.exit_code == EXIT_INVALID
    assert message in result.output
    assert not state.exists()
