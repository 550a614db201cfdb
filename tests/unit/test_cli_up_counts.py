"""``stockade up`` with a count the recorded cluster cannot take (one that would split a fleet)
is refused as bad input: one line naming --workers, the rule, the count, what it would split and
what the nearest counts that split nothing do; exit 2; nothing started or changed, and no word
about processes left running (none was started)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.cluster import StateDir
from ops.launcher.plan import LaunchOptions, plan


def test_a_count_that_splits_a_fleet_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 workers in two fleets of 20 (none running), ``up --workers 5``: exit 2, one line."""
    state = StateDir(tmp_path / "state")
    ports = itertools.count(7000)
    config = plan(
        None,
        state=state,
        database_url="postgresql://db/x",
        pg_port=None,
        control_planes=3,
        workers=40,
        running=(),
        options=LaunchOptions(fleet_size=20),
        free_port=ports.__next__,
    ).config
    state.save(config)
    recorded = state.config_path.read_text()
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state.root))
    monkeypatch.setenv("STOCKADE_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/x")
    result = CliRunner().invoke(app, ["up", "--insecure", "--workers", "5"])
    assert result.exit_code == EXIT_INVALID, result.output
    assert result.stderr.splitlines()[-1] + "\n" == (
        "error: --workers must keep or stop each fleet whole (a fleet's workers run in one process), "
        "got 5 (it would stop w-6..w-20 of fleet-1 and keep w-1..w-5; --workers 0 stops fleet-1 and "
        "fleet-2 with w-1..w-40; --workers 20 stops fleet-2 with w-21..w-40)\n"
    )
    assert result.stderr.count("error:") == 1 and "still run" not in result.stderr
    assert state.config_path.read_text() == recorded
    assert not (tmp_path / "config.toml").exists()
