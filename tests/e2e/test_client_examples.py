"""The Python client's examples in docs/client.md, run as they are against a real local cluster
(two control planes, one worker, mutual TLS), each in a fresh interpreter that finds the
cluster as `stockade` does: the job is submitted, waited for, and its output printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ops.cluster import LocalCluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
EXAMPLES = ("client_trio.py", "client_asyncio.py")


def test_the_docs_examples_submit_wait_and_print_the_output(tmp_path: Path, database_url: str) -> None:
    """Each example exits 0 having printed its job's end (succeeded, exit code 0) and what the
    job wrote."""
    cluster = LocalCluster(tmp_path / "stockade", database_url=database_url)
    try:
        ready = cluster.up(control_planes=2, workers=1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_")}
        env.update(
            STOCKADE_CONTROL_PLANES=",".join(ready.config.control_plane_addresses),
            STOCKADE_CERTS_DIR=str(ready.config.cert_dir),  # the cluster's operator certificate
            STOCKADE_CONFIG=str(tmp_path / "config.toml"),  # no user config
            PYTHONPATH=str(ROOT),
        )
        for example in EXAMPLES:
            done = subprocess.run(
                [sys.executable, str(ROOT / "docs" / "examples" / example)],
                capture_output=True,
                text=True,
                timeout=180,
                env=env,
                cwd=tmp_path,
                check=False,
            )
            assert re.match(r"job \d+ succeeded, exit code 0\n", done.stdout), (
                example,
                done.stdout,
                done.stderr,
            )
            assert done.returncode == 0, (example, done.stderr)
            assert done.stdout.splitlines()[1:] == ["hello from a job"], (example, done.stdout)
    finally:
        cluster.down()
