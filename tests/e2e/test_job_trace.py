"""One trace per job, end to end: a local cluster started as `stockade up --json-logs` starts it
(the launcher, real processes, JSON logs), a job whose worker is SIGKILLed runs elsewhere, and
`stockade job ID --events --json` (the CLI, as a process) tells that story from the database,
while the control plane's and both agents' JSON log lines about the job carry its keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cluster import wait_for

from ops import rpc
from ops.cluster import LocalCluster
from protocol import pb

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).parents[2]
SLEEP_S = 6.0
"""How long the job sleeps: long enough to be killed mid-run, short enough for its second run."""


@pytest.fixture
def cluster(tmp_path: Path, database_url: str) -> Iterator[LocalCluster]:
    """One control plane and two workers, every process logging JSON lines; brought down after."""
    cluster = LocalCluster(
        tmp_path / "stockade", database_url=database_url, cp_args=["--json-logs"], agent_args=["--json-logs"]
    )
    try:
        yield cluster
    finally:
        cluster.down()


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a process's log (anything else on stderr, such as a traceback, is left
    out)."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def about(lines: list[dict[str, Any]], job_id: int) -> list[dict[str, Any]]:
    """The lines about ``job_id``: it is their ``job_id``, or one of their ``job_ids``."""
    return [line for line in lines if line.get("job_id") == job_id or job_id in (line.get("job_ids") or ())]


def events_of(cluster: LocalCluster, job_id: int) -> list[dict[str, Any]]:
    """`stockade job ID --events --json`, run as a command in the cluster's state folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STOCKADE_") or k == "STOCKADE_CONFIG"}
    env.update(STOCKADE_STATE_DIR=str(cluster.state.root), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "job", str(job_id), "--events", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    events: list[dict[str, Any]] = json.loads(done.stdout)
    return events


def test_a_job_whose_worker_is_killed_runs_elsewhere_and_its_history_says_so(cluster: LocalCluster) -> None:
    """Placed on worker A at epoch E, A SIGKILLed, A declared dead at epoch E' >= E, the run ended
    lost (fenced at E'), the job requeued, placed on worker B and succeeded: so say the job's
    events, in order; and the JSON log lines of the control plane and of both agents that are about
    the job carry job_id (or job_ids), assignment_id(s), epoch and worker_id."""
    ready = cluster.up(control_planes=1, workers=2)
    addresses, tls = ready.config.control_plane_addresses, ready.config.client_tls
    spec = pb.JobSpec(
        name="traced", cpu_millis=500, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=int(SLEEP_S * 1000))
    )
    job_id = int(rpc.call(addresses, "submit_job", pb.SubmitJobRequest(spec=spec), tls=tls).job_id)

    def job() -> pb.JobInfo:
        info: pb.JobInfo = rpc.call(addresses, "get_job", pb.GetJobRequest(job_id=job_id), tls=tls)
        return info

    wait_for(lambda: job().state == "running", timeout_s=30, what="the job to run")
    first = job()
    worker_a, epoch_e = first.worker_id, int(first.epoch)
    cluster.kill(worker_a)
    wait_for(lambda: job().state == "succeeded", timeout_s=60, what="the job to succeed elsewhere")
    worker_b = job().worker_id
    assert worker_b != worker_a

    events = events_of(cluster, job_id)
    assert [e["kind"] for e in events] == [
        "submitted",
        "placed",
        "confirmed",
        "worker_dead",
        "ended",
        "requeued",
        "placed",
        "confirmed",
        "ended",
        "final",
    ]
    placed_a, _, dead, lost, requeued, placed_b, _, ended, final = events[1:]
    assert (placed_a["worker_id"], placed_a["epoch"], placed_a["assignment_id"]) == (
        worker_a,
        epoch_e,
        first.assignment_id,
    )
    assert placed_a["incarnation"] and placed_a["leader"] == "cp-1"
    assert (dead["worker_id"], dead["incarnation"]) == (worker_a, placed_a["incarnation"])
    epoch_e2 = dead["epoch"]
    assert epoch_e2 >= epoch_e
    assert (lost["assignment_id"], lost["state"], lost["reason"], lost["epoch"]) == (
        placed_a["assignment_id"],
        "lost",
        "worker_dead",
        epoch_e2,
    )
    assert requeued["assignment_id"] == placed_a["assignment_id"]
    assert placed_b["worker_id"] == worker_b and placed_b["epoch"] >= epoch_e2
    assert (ended["assignment_id"], ended["reason"], ended["exit_code"]) == (
        placed_b["assignment_id"],
        "succeeded",
        0,
    )
    assert final["state"] == "succeeded"
    times = [e["at_unix_s"] for e in events[:-1]]
    assert times == sorted(times)

    # The control plane's lines: the submission, both placements, the death's requeue, the outcome.
    cp_lines = about(json_lines(cluster.state.log_path("cp-1")), job_id)
    by_event = {line["event"]: line for line in cp_lines}
    assert {"job submitted", "placed", "reconciled", "outcomes recorded"} <= set(by_event), sorted(by_event)
    placed_lines = [line for line in cp_lines if line["event"] == "placed"]
    assert len(placed_lines) == 2
    for line, event in zip(placed_lines, (placed_a, placed_b), strict=True):
        index = line["job_ids"].index(job_id)
        assert (line["assignment_ids"][index], line["worker_ids"][index], line["epoch"]) == (
            event["assignment_id"],
            event["worker_id"],
            event["epoch"],
        )
    reconciled = by_event["reconciled"]
    assert reconciled["epoch"] == epoch_e2 and worker_a in reconciled["dead_workers"]
    index = reconciled["assignment_ids"].index(placed_a["assignment_id"])
    assert (reconciled["job_ids"][index], reconciled["worker_ids"][index]) == (job_id, worker_a)
    assert job_id in reconciled["requeued_job_ids"]
    outcome = by_event["outcomes recorded"]
    assert (outcome["worker_id"], outcome["assignment_ids"]) == (worker_b, [placed_b["assignment_id"]])
    assert "epoch" in outcome

    # Each agent's own lines about the job: keyed by job, run, epoch and worker.
    for worker, event, wanted in (
        (worker_a, placed_a, {"assignments accepted", "job started"}),
        (worker_b, placed_b, {"assignments accepted", "job started", "job ended"}),
    ):
        lines = about(json_lines(cluster.state.log_path(worker)), job_id)
        assert wanted <= {line["event"] for line in lines}, (worker, lines)
        for line in lines:
            assert line["worker_id"] == worker and line["epoch"] == event["epoch"], line
            if "job_id" in line:
                assert line["assignment_id"] == event["assignment_id"], line
            else:
                assert event["assignment_id"] in line["assignment_ids"], line
