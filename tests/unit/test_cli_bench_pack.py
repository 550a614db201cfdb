"""``stockade bench pack`` refuses bad options at once, naming the option, the value and the
limit, and starts nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "100000"], "error: --workers must be an integer between 1 and 1000, got 100000"),
        (["--jobs", "-5"], "error: --jobs must be an integer between 1 and 1000000, got -5"),
        (["--fleet-size", "1001"], "error: --fleet-size must be an integer between 0 and 1000, got 1001"),
        (["--burst-jobs", "0"], "error: --burst-jobs must be an integer between 1 and 1000000, got 0"),
        (
            ["--arrival-rate", "inf"],
            "error: --arrival-rate must be a finite number between 0 and 100000, got 'inf'",
        ),
        (["--arrival-rate", "0.001"], "--arrival-rate must be 0 (skip the arriving scenario) or between 1"),
        (["--json", "/nonexistent-folder/out.json"], "--json: folder /nonexistent-folder does not exist"),
        (["--policy", "fastest"], "error: --policy must list some of best_fit, first_fit, worst_fit"),
        (["--gang-share", "1.5"], "error: --gang-share must be a number between 0 and 1, got 1.5"),
        (
            ["--only-scale", "--device-share", "0.5", "--gang-share", "0.75"],
            "error: --gang-share must be at most 1 - --device-share 0.5 = 0.5 (the jobs asking gpu are "
            "single jobs), got 0.75",
        ),
    ],
)
def test_bad_options_are_refused_before_anything_starts(
    args: list[str], message: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    result = CliRunner().invoke(app, ["bench", "pack", "--state-dir", str(state), *args])
    assert result.exit_code == EXIT_INVALID
    assert message in result.output
    assert not state.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "error: --workers must be an integer between 1 and 10000, got 0"),
        (
            ["--unschedulable", "-1"],
            "error: --unschedulable must be an integer between 0 and 1000000, got -1",
        ),
        (["--rounds", "0"], "error: --rounds must be an integer between 1 and 100000, got 0"),
    ],
)
def test_bench_unschedulable_refuses_bad_options_before_anything_starts(
    args: list[str], message: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    result = CliRunner().invoke(app, ["bench", "unschedulable", "--state-dir", str(state), *args])
    assert result.exit_code == EXIT_INVALID
    assert message in result.output
    assert not state.exists()
