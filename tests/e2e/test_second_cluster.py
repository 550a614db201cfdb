"""End to end: ``stockade up`` in a second folder while the cluster of a first folder runs and
the user config names it. Starting a second cluster would take every client command away from
the first, so ``up`` refuses, naming the first folder and how to stop it, and changes nothing;
with ``--force`` it starts the second one, saying that the first still runs and how to reach it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_interrupted_up import stockade_env

pytestmark = pytest.mark.e2e

COMMAND = [sys.executable, "-m", "ops.cli"]
UP = [*COMMAND, "up", "--insecure", "--control-planes", "1", "--workers", "0"]


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=180)


def test_up_in_another_folder_refuses_while_the_recorded_cluster_runs_unless_forced(
    tmp_path: Path, database_url: str
) -> None:
    """With the cluster of ``first`` running: ``up`` in ``second`` exits 1 with one line naming
    ``first`` and ``--force``, starts nothing and leaves the user config naming ``first``;
    ``up --force`` there starts, warns naming ``first``, and the config then names
    ``second``; ``down`` in each folder stops its own."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    config = tmp_path / "config.toml"
    env = stockade_env(config, database_url)
    try:
        started = run(UP, first, env)
        assert started.returncode == 0, started.stderr
        assert str(first / ".stockade") in config.read_text()

        refused = run(UP, second, env)
        assert refused.returncode == 1, refused.stderr
        (line,) = [line for line in refused.stderr.splitlines() if line.strip()]
        assert line.startswith("error: the cluster of ") and str(first / ".stockade") in line
        assert "--force" in line and "stockade down" in line
        assert not (second / ".stockade" / "cluster.json").exists()
        assert str(first / ".stockade") in config.read_text()

        # Its own (embedded) database: two clusters never share one.
        own_database = {k: v for k, v in env.items() if k != "DATABASE_URL"}
        forced = run([*UP, "--force"], second, own_database)
        assert forced.returncode == 0, forced.stderr
        assert "warning: the cluster of " in forced.stderr and str(first / ".stockade") in forced.stderr
        assert str(second / ".stockade") in config.read_text()
    finally:
        downs = [run([*COMMAND, "down"], folder, env) for folder in (second, first)]
    assert all(down.returncode == 0 for down in downs), [down.stderr for down in downs]
