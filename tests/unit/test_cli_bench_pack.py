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
        (["--workers", "100000"], "--workers must be between 1 and 1000, got 100000"),
        (["--jobs", "-5"], "--jobs must be between 1 and 1000000, got -5"),
        (["--arrival-rate", "inf"], "--arrival-rate must be 0 (skip the arriving scenario) or between 1"),
        (["--arrival-rate", "0.001"], "got 0.001"),
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
