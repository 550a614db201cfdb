"""A job file holding a pipeline, `stockade run FILE` against a real cluster (one control plane,
two workers, started by the launcher of `stockade up`): prepare, then an array of 4, then
collect, stored in one call and run in that order; run again with its key, nothing twice."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_job_files import Launch, launch, stockade, wait_for

from ops import rpc
from protocol import pb

pytestmark = pytest.mark.e2e

__all__ = ["launch"]  # the fixture, shared with test_job_files

PIPELINE = """\
[[job]]
name = "collect"
cpu_millis = 100
memory_mb = 64
command = ["true"]
after = ["shards"]

[[job]]
name = "shards"
cpu_millis = 100
memory_mb = 64
command = ["sh", "-c", "sleep 0.2"]
array = "0-3%2"
after = ["prepare"]

[[job]]
name = "prepare"
cpu_millis = 100
memory_mb = 64
command = ["sh", "-c", "sleep 0.5"]
"""


def test_a_pipeline_file_runs_in_order_and_is_stored_once(launch: Launch, tmp_path: Path) -> None:
    """collect, shards (an array of 4) and prepare, given in that order: the ids printed in the
    file's order; every task starts after prepare finished and collect after every task
    finished, all succeed; the same file run again with the same key prints the same ids and
    stores no job."""
    ready = launch(1, 2)
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_CONTROL_PLANES"}
    env["STOCKADE_CERTS_DIR"] = str(ready.config.cert_dir)
    where = ["--control-planes", ",".join(addresses), "--idempotency-key", "pipeline-1"]
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE)

    completed = stockade("run", str(path), *where, env=env)
    assert completed.returncode == 0, completed.stderr
    collect, shards, prepare = (int(line) for line in completed.stdout.split())

    def jobs() -> list[pb.JobInfo]:
        return list(rpc.call(addresses, "list_jobs", pb.ListJobsRequest(limit=100), tls=tls).jobs)

    def info(job_id: int) -> pb.JobInfo:
        return rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)

    wait_for(
        lambda: info(collect).state in ("succeeded", "failed", "cancelled"), timeout_s=90, what="collect"
    )
    every = {j.job_id: info(j.job_id) for j in jobs()}
    assert len(every) == 6 and {j.state for j in every.values()} == {"succeeded"}
    tasks = [j for j in every.values() if j.array_id == shards]
    assert len(tasks) == 4
    assert all(t.started_unix_s >= every[prepare].finished_unix_s for t in tasks)
    assert every[collect].started_unix_s >= max(t.finished_unix_s for t in tasks)

    again = stockade("run", str(path), *where, env=env)
    assert again.returncode == 0, again.stderr
    assert [int(line) for line in again.stdout.split()] == [collect, shards, prepare]
    assert len(jobs()) == 6
