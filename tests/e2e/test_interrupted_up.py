"""End to end: ``stockade up`` interrupted with Ctrl-C (SIGINT) or SIGTERM while it starts the
cluster.

What it started keeps running, as it says; it must also be recorded in the user config, so that
client commands run from any other folder find it, as they do after an ``up`` that completed.
Whenever the signal comes (while the CLI loads, while the embedded database is made or starts,
while the processes start, while ``up`` waits for them), ``up`` ends with one line and no
traceback, and ``down`` then stops everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops import pidfile
from ops.config import CONFIG_ENV
from ops.launcher import procs

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


def embedded_env(config: Path) -> dict[str, str]:
    """The operator's environment without DATABASE_URL: ``up`` makes its embedded database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_") and k != "DATABASE_URL"}
    env[CONFIG_ENV] = str(config)
    return env


def _database_made(state: Path) -> bool:
    return (state / "pg").is_dir()


def _server_starting(state: Path) -> bool:
    return (state / "pg" / "data" / "postmaster.pid").exists()


def _control_plane_started(state: Path) -> bool:
    return (state / "pids" / "cp-1.pid").exists()


def _waiting_for_the_worker(state: Path) -> bool:
    return (state / "pids" / "w-1.pid").exists()


MOMENTS = {
    "while the cli loads": lambda state: True,
    "while the database is made": _database_made,
    "while the database starts": _server_starting,
    "once a control plane started": _control_plane_started,
    "while up waits for its cluster": _waiting_for_the_worker,
}
"""When the signal is sent: once each of these holds of the state folder."""


@pytest.mark.parametrize(
    ("moment", "signum"),
    [*((moment, signal.SIGINT) for moment in MOMENTS), ("while up waits for its cluster", signal.SIGTERM)],
)
def test_an_up_interrupted_at_any_moment_ends_with_one_line_and_down_stops_everything(
    tmp_path: Path, moment: str, signum: signal.Signals
) -> None:
    """A signal at each stage of an ``up`` that makes its own embedded database: up ends (exit
    130, or 0 when it had just finished) with no traceback and, when it says so, one
    ``interrupted:`` line; ``down`` then leaves no process of the state folder and no server."""
    config = tmp_path / "config.toml"
    env = embedded_env(config)
    state = tmp_path / ".stockade"
    command = [sys.executable, "-m", "ops.cli"]
    up = subprocess.Popen(
        [*command, "up", "--insecure", "--control-planes", "1", "--workers", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reached = MOMENTS[moment]
    try:
        deadline = time.monotonic() + STARTED_WITHIN_S
        while not reached(state) and up.poll() is None:
            assert time.monotonic() < deadline, f"up never got {moment}"
            time.sleep(0.005)
        up.send_signal(signum)
        _, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        down = subprocess.run(
            [*command, "down"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=180,
        )
    assert "Traceback" not in err, err
    # 0: it had just finished; -SIGINT: the signal came before Python had started at all.
    assert up.returncode in (0, 130, -signal.SIGINT), err
    if up.returncode == 130:
        assert [line for line in err.splitlines() if line.startswith("interrupted:")], err
    assert down.returncode == 0, down.stderr
    assert "Traceback" not in down.stderr, down.stderr
    assert procs.marked_processes(state) == []
    assert pidfile.process(pidfile.read_pid(state / "pg" / "data" / "postmaster.pid")) is None
