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
import trio

from ops.client import Client, ClientSettings, JobNotFound, StockadeError
from ops.cluster import LocalCluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
EXAMPLES = ("client_trio.py", "client_asyncio.py")


def serves_job_logs(settings: ClientSettings) -> bool:
    """Whether the control planes serve ReadJobLogs: a job that does not exist is then
    JobNotFound, where a build without it refuses the call itself (no role may make it, or
    UNIMPLEMENTED)."""

    async def probe() -> bool:
        async with Client.open(settings) as client:
            try:
                await client.logs(2**62).next()
            except JobNotFound:
                return True
            except StockadeError:
                return False
        return True

    return trio.run(probe)


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
        settings = ClientSettings(
            control_planes=ready.config.control_plane_addresses, tls=ready.config.client_tls
        )
        served = serves_job_logs(settings)
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
            if not served:
                assert done.returncode == 1 and "read_job_logs" in done.stderr, (example, done.stderr)
                continue
            assert done.returncode == 0, (example, done.stderr)
            assert done.stdout.splitlines()[1:] == ["hello from a job"], (example, done.stdout)
    finally:
        cluster.down()
    if not served:
        pytest.skip(
            "the examples submitted and waited, but these control planes do not serve ReadJobLogs, "
            "so the output was not read"
        )
