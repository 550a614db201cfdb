"""Enforced job resources end to end: a local cluster of real processes (the launcher of
`stockade up`), the operator's commands run as `stockade ...` processes.

The workers find their mode themselves (``--job-resources auto``); where the machine gives
them no cgroups (their label ``resources=rlimit``) the test skips, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_cluster import Launch, launch, wait_for  # noqa: F401 (launch: a fixture)

from ops.cluster import ClusterConfig

pytestmark = pytest.mark.e2e


def stockade(config: ClusterConfig, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``stockade COMMAND --control-planes ... ARGS`` against the cluster, as its operator
    (the addresses go first: a submitted command follows ``--``)."""
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(config.cert_dir)  # the cluster's operator certificate
    addresses = ",".join(config.control_plane_addresses)
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", command, "--control-planes", addresses, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def cgroups_mode(config: ClusterConfig) -> str:
    """The resources label (``cgroup2`` or ``cgroup1``) of the cluster's first worker, as
    `status --json` shows it; the test skips, saying why, where the workers found no cgroups."""
    status = stockade(config, "status", "--json")
    assert status.returncode == 0, status.stderr
    mode = str(json.loads(status.stdout)["workers"][0]["labels"]["resources"])
    if mode == "rlimit":
        pytest.skip("the workers found no usable cgroups on this machine (resources=rlimit)")
    return mode


def test_a_job_over_its_memory_ends_failed_with_reason_oom_killed(
    launch: Launch,  # noqa: F811 (the fixture imported above)
) -> None:
    """`status --json` shows the worker's resources label; a job of 64 MiB that fills 128 MiB
    ends failed, `stockade job` showing the reason oom_killed, and its one attempt ended for
    that reason."""
    _, ready = launch(1, 1)
    config = ready.config
    assert cgroups_mode(config) in ("cgroup2", "cgroup1")

    submitted = stockade(
        config,
        "submit",
        "--cpu-millis",
        "500",
        "--memory-mb",
        "64",
        "--",
        "python3",
        "-c",
        "x = b'x' * (128 * 2**20)",
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    def ended() -> bool:
        shown = stockade(config, "job", job_id, "--json")
        return shown.returncode == 0 and json.loads(shown.stdout)["status"]["state"] in (
            "succeeded",
            "failed",
        )

    wait_for(ended, timeout_s=60, what=f"job {job_id} to end")
    job = json.loads(stockade(config, "job", job_id, "--json").stdout)["status"]
    assert job["state"] == "failed"
    assert job["reason"].startswith("oom_killed: the kernel killed it: it used more than its memory_mb of 64")
    assert [a["end_reason"] for a in job["attempt_history"]] == ["oom_killed"]
    shown = stockade(config, "job", job_id)
    assert "failed (oom_killed: " in shown.stdout, shown.stdout
