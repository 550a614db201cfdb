"""End to end: ``stockade up`` interrupted with Ctrl-C (SIGINT) while it starts the cluster.

What it started keeps running, as it says; it must also be recorded in the user config, so that
client commands run from any other folder find it, as they do after an ``up`` that completed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.config import CONFIG_ENV

pytestmark = pytest.mark.e2e

STARTED_WITHIN_S = 120.0


def stockade_env(config: Path, database_url: str) -> dict[str, str]:
    """The operator's environment: no STOCKADE_* variable but the user config's path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
    env[CONFIG_ENV] = str(config)
    env["DATABASE_URL"] = database_url
    return env


def test_an_up_interrupted_while_starting_leaves_its_cluster_findable(
    tmp_path: Path, database_url: str
) -> None:
    """SIGINT once up has started its first control plane: up exits 130 saying what still runs,
    the user config names the state folder, `stockade status` run in another folder reaches the
    cluster, and `stockade down` in the first folder stops it and removes the record."""
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    config = tmp_path / "config.toml"
    env = stockade_env(config, database_url)
    state = here / ".stockade"
    command = [sys.executable, "-m", "ops.cli"]
    up = subprocess.Popen(
        [*command, "up", "--insecure", "--control-planes", "1", "--workers", "1"],
        cwd=here,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + STARTED_WITHIN_S
        while not (state / "pids" / "cp-1.pid").exists():
            assert up.poll() is None, up.communicate()
            assert time.monotonic() < deadline, "up started no control plane"
            time.sleep(0.02)
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
        assert up.returncode == 130, err
        assert "interrupted:" in err and "still run" in err and "names it" in err, err

        assert str(state) in config.read_text()
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run(
                [*command, "status"], cwd=elsewhere, env=env, capture_output=True, text=True, check=False
            )
            if status.returncode == 0:
                break
            assert time.monotonic() < deadline, status.stderr
            time.sleep(0.5)
        assert "cp-1" in status.stdout
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        down = subprocess.run(
            [*command, "down"], cwd=here, env=env, capture_output=True, text=True, check=False, timeout=120
        )
    assert down.returncode == 0, down.stderr
    assert not config.exists() or str(state) not in config.read_text()
