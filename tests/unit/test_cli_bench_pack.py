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
        (
            ["--workers", "100000"],
            "Invalid value for '--workers': Input should be less than or equal to 1000",
        ),
        (["--jobs", "-5"], "Invalid value for '--jobs': Input should be greater than or equal to 1"),
        (
            ["--fleet-size", "1001"],
            "Invalid value for '--fleet-size': Input should be less than or equal to 1000",
        ),
        (
            ["--burst-jobs", "0"],
            "Invalid value for '--burst-jobs': Input should be greater than or equal to 1",
        ),
        (
            ["--arrival-rate", "inf"],
            "Invalid value for '--arrival-rate': Input should be less than or equal to",
        ),
        (["--arrival-rate", "0.001"], "--arrival-rate must be 0 (skip the arriving scenario) or between 1"),
        (["--json", "/nonexistent-folder/out.json"], "--json: folder /nonexistent-folder does not exist"),
        (["--policy", "fastest"], "policy must list some of best_fit, first_fit, worst_fit"),
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
