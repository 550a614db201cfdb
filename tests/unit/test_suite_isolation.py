"""The suite's results do not depend on the cluster the developer runs: every test has a state
folder and a user config of its own and none of the variables that name a cluster, a
certificate or an identity (``_own_client_setup`` in ``tests/conftest.py``).

A cluster the developer started (``just up``) is recorded in the checkout's ``.stockade/`` and
in the user config, and variables set in the shell name one too; the last test here records a
fake one in each of those places and runs tests that call ``stockade`` in a fresh pytest, which
must pass as they do on a clean machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.config import (
    CERTS_DIR_ENV,
    CONFIG_ENV,
    CONTROL_PLANES_ENV,
    IDENTITY_ENV,
    INSECURE_ENV,
    STATE_DIR_ENV,
    ClusterError,
    default_state_dir,
    local_state_dirs,
    resolve_addresses,
    resolve_client_tls,
    user_config_path,
)

ROOT = Path(__file__).parents[2]
STARTUP = ROOT / "tests" / "unit" / "test_cli_startup.py"
CLIENT_ENV = (CERTS_DIR_ENV, CONFIG_ENV, CONTROL_PLANES_ENV, IDENTITY_ENV, INSECURE_ENV, STATE_DIR_ENV)
NO_CLUSTER = "no control-plane addresses"


def test_a_test_finds_no_cluster_but_its_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Inside a test, the state folder and the user config are the test's own and empty, a
    client finds no control plane and would present the test's own operator certificate, and
    ``stockade status`` (in the test's process and in one it starts) says it has no cluster."""
    own = tmp_path_factory.getbasetemp()
    assert default_state_dir().is_relative_to(own) and not default_state_dir().exists()
    assert user_config_path().is_relative_to(own) and not user_config_path().exists()
    assert list(local_state_dirs()) == [default_state_dir()]
    with pytest.raises(ClusterError, match=NO_CLUSTER):
        resolve_addresses(None)
    tls = resolve_client_tls()
    assert tls is not None and tls.cert_path == default_state_dir() / "certs" / "operator.crt"

    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 1 and NO_CLUSTER in result.stderr
    started = subprocess.run(
        [sys.executable, "-m", "ops.cli", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert started.returncode == 1 and NO_CLUSTER in started.stderr


def _record_cluster(state: Path, port: int) -> None:
    """A cluster recorded in ``state`` as ``stockade up`` records one: its control plane's
    address in ``cluster.json`` and a CA with the certificates it issued in ``certs/``."""
    from ops.certs import init_cluster

    init_cluster(state / "certs")
    processes = [{"id": "cp-1", "kind": "cp", "address": f"127.0.0.1:{port}"}]
    recorded = {"processes": processes, "cert_dir": str(state / "certs")}
    (state / "cluster.json").write_text(json.dumps(recorded))


@pytest.mark.parametrize("where", ["checkout and user config", "variables"])
def test_the_developers_cluster_changes_no_tests_result(tmp_path: Path, where: str) -> None:
    """With a cluster recorded in the checkout's ``.stockade/`` and the user config (as ``just
    up`` leaves them), or named by every variable a client reads, the tests that look for a
    cluster (the one above, the CLI's start-up tests) pass in a fresh pytest run there."""
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    _record_cluster(checkout / ".stockade", 7101)
    config = home / ".config" / "stockade" / "config.toml"
    config.parent.mkdir(parents=True)
    local = f'[local]\nstate_dir = "{checkout / ".stockade"}"\n'
    config.write_text(f'control_planes = ["127.0.0.1:7102"]\n\n{local}')
    env = {name: value for name, value in os.environ.items() if name not in (*CLIENT_ENV, "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    if where == "variables":
        _record_cluster(tmp_path / "named", 7103)
        env |= {
            STATE_DIR_ENV: str(tmp_path / "named"),
            CONTROL_PLANES_ENV: "127.0.0.1:7104",
            CONFIG_ENV: str(config),
            CERTS_DIR_ENV: str(tmp_path / "named" / "certs"),
            IDENTITY_ENV: "viewer",
            INSECURE_ENV: "1",
            "XDG_CONFIG_HOME": str(home / ".config"),
        }
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT)),
            f"{__file__}::test_a_test_finds_no_cluster_but_its_own",
            f"{STARTUP}::test_a_client_command_loads_the_client_and_nothing_of_the_server",
            f"{STARTUP}::test_logs_loads_the_client_and_nothing_of_the_server",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=checkout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
