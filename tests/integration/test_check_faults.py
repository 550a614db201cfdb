"""``stockade check`` on a real database: a worker killed by hand (``kill -9``, no harness to
record it) is a false death until the operator gives the fault with ``--fault``, also a worker
started by hand (registered, not in cluster.json); a fault of a fleet counts for its workers;
faults naming no process or registered worker of the cluster, or malformed, are
refused with exit status 2 before anything is read; jobs still at work are reported as running
(exit 0) unless ``--wait-s`` waited for them in vain."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from typer.testing import CliRunner

from ops.cli import app
from ops.cluster import ClusterConfig, ProcessSpec, StateDir, WorkerSpec

KILLED_AGO_S = 4.0


def fetchval(url: str, sql: str, *args: Any) -> Any:
    async def run() -> Any:
        connection = await asyncpg.connect(url, timeout=10)
        try:
            return await connection.fetchval(sql, *args)
        finally:
            await connection.close()

    return asyncio.run(run())


@pytest.fixture
def state(tmp_path: Path, database_url: str) -> StateDir:
    """A recorded cluster (cp-1, agent w-1, fleet-1 hosting w-2 and w-3) on the test's database."""
    state = StateDir(tmp_path / "stockade")
    state.save(
        ClusterConfig(
            database_url=database_url,
            embedded_pg_port=None,
            processes=[
                ProcessSpec(id="cp-1", kind="cp", address="127.0.0.1:7001", args=("cp", "--id", "cp-1")),
                ProcessSpec(id="w-1", kind="agent", address="127.0.0.1:7101", args=("agent", "--id", "w-1")),
                ProcessSpec(id="fleet-1", kind="fleet", address="", args=("fleet", "--id", "fleet-1")),
            ],
            hosted_workers=[
                WorkerSpec(
                    id=w, address=f"127.0.0.1:710{n}", cpu_millis=1000, memory_mb=1024, process_id="fleet-1"
                )
                for n, w in ((2, "w-2"), (3, "w-3"))
            ],
        )
    )
    return state


def declare_dead(url: str, worker_id: str) -> float:
    """Record ``worker_id`` declared dead now, silent for 2.5 s; returns its kill time (Unix s),
    KILLED_AGO_S ago."""
    fetchval(
        url,
        "INSERT INTO worker_deaths (worker_id, incarnation, epoch, last_heartbeat_at)"
        " VALUES ($1, 1, 1, now() - interval '2.5 seconds')",
        worker_id,
    )
    return float(fetchval(url, "SELECT extract(epoch FROM now())::float8")) - KILLED_AGO_S


def check(state: StateDir, *faults: str, wait_s: float | None = None) -> tuple[int, str]:
    args = ["check", "--state-dir", str(state.root), "--json"]
    for fault in faults:
        args += ["--fault", fault]
    if wait_s is not None:
        args += ["--wait-s", str(wait_s)]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def test_a_kill_by_hand_explains_the_death_only_when_given(state: StateDir, database_url: str) -> None:
    """w-1 SIGKILLed by hand and declared dead: without --fault the check fails with one false
    death; with --fault kill:w-1@TIME it passes."""
    killed_at = declare_dead(database_url, "w-1")
    status, output = check(state)
    assert status == 1 and json.loads(output)["false_deaths"] == 1
    status, output = check(state, f"kill:w-1@{killed_at}")
    assert status == 0, output
    assert json.loads(output)["false_deaths"] == 0


def test_a_freeze_of_a_fleet_explains_the_deaths_of_its_workers(state: StateDir, database_url: str) -> None:
    """A fleet process frozen with SIGSTOP: the deaths of the workers it hosts are explained by
    --fault freeze:fleet-1@TIME..UNTIL; w-1's, in no fleet, is not."""
    frozen_at = declare_dead(database_url, "w-2")
    declare_dead(database_url, "w-3")
    declare_dead(database_url, "w-1")
    status, output = check(state, f"freeze:fleet-1@{frozen_at}..{frozen_at + 5}")
    report = json.loads(output)
    assert status == 1 and report["false_deaths"] == 1
    assert report["details"][0].startswith("worker w-1 ")


def register_by_hand(url: str, worker_id: str) -> None:
    """A worker the cluster.json does not record registered with the cluster, as ``stockade
    agent --id w-ft ...`` started by hand registers."""
    fetchval(
        url,
        "INSERT INTO workers (id, address, cpu_millis, memory_mb, incarnation)"
        " VALUES ($1, '127.0.0.1:7999', 1000, 1024, 1)",
        worker_id,
    )


def test_a_kill_of_a_worker_started_by_hand_is_counted(state: StateDir, database_url: str) -> None:
    """w-ft, started by hand (registered, not in cluster.json), SIGKILLed and declared dead: the
    check takes --fault kill:w-ft@TIME and the death is explained."""
    register_by_hand(database_url, "w-ft")
    killed_at = declare_dead(database_url, "w-ft")
    status, output = check(state)
    assert status == 1 and json.loads(output)["false_deaths"] == 1
    status, output = check(state, f"kill:w-ft@{killed_at}")
    assert status == 0, output
    assert json.loads(output)["false_deaths"] == 0


def test_an_unknown_id_names_the_recorded_processes_and_the_workers_started_by_hand(
    state: StateDir, database_url: str
) -> None:
    """A typo is refused naming what it may be: the recorded processes and workers, and the
    workers the database knows that cluster.json does not."""
    register_by_hand(database_url, "w-ft")
    status, output = check(state, "kill:w-tf@1764538392")
    assert status == 2
    assert output == (
        "error: fault ID must name a process or worker of this cluster or a worker registered in "
        "its database (processes cp-1, fleet-1, w-1, w-2, w-3; workers started by hand: w-ft), "
        "got 'w-tf'\n"
    )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("kill:w-9@1764538392", "fault ID must name a process or worker of this cluster"),
        ("kil:w-1@1764538392", "fault kind must be one of kill, freeze, partition"),
    ],
)
def test_a_fault_that_cannot_be_right_is_refused(state: StateDir, fault: str, message: str) -> None:
    """An unknown id (a typo) or kind exits 2 with one line naming the field and the value."""
    status, output = check(state, fault)
    assert status == 2
    assert message in output


def add_job(url: str, state: str) -> int:
    """A sleep job in ``state`` (no assignment: what the check reads of it is its state)."""
    return int(
        fetchval(
            url,
            "INSERT INTO jobs (name, cpu_millis, memory_mb, runtime, sleep_ms, state)"
            " VALUES ('check', 100, 64, 'sleep', 1000, $1) RETURNING id",
            state,
        )
    )


def test_jobs_still_running_are_reported_as_running_and_pass(state: StateDir, database_url: str) -> None:
    """Two jobs pending and running: the check exits 0 and says how many are unfinished in each
    state; the table's jobs_finished reads running, not FAIL."""
    add_job(database_url, "running")
    add_job(database_url, "pending")
    status, output = check(state)
    report = json.loads(output)
    assert status == 0, output
    assert report["ok"] is True and report["finish_required"] is False
    assert report["jobs_unfinished"] == {"pending": 1, "running": 1}
    table = CliRunner().invoke(app, ["check", "--state-dir", str(state.root)], terminal_width=200)
    assert table.exit_code == 0
    (line,) = [row for row in table.output.splitlines() if "jobs_finished" in row]
    assert line.split()[-1] == "running" and "FAIL" not in table.output


def test_with_wait_s_a_job_that_does_not_finish_in_time_fails(state: StateDir, database_url: str) -> None:
    """--wait-s 0.5 with a job that stays running: after the wait the check exits 1 with the job
    unfinished; once it has succeeded, the same check exits 0."""
    job_id = add_job(database_url, "running")
    status, output = check(state, wait_s=0.5)
    report = json.loads(output)
    assert status == 1 and report["unfinished_job_ids"] == [job_id] and report["finish_required"]
    fetchval(database_url, "UPDATE jobs SET state = 'cancelled' WHERE id = $1", job_id)
    status, output = check(state, wait_s=0.5)
    assert status == 0, output


def test_a_worker_dropped_by_up_is_read_from_its_folder(state: StateDir, database_url: str) -> None:
    """w-9, stopped cleanly by an `up` that shrank the cluster (its leave line in its folder, its
    leave not recorded, then declared dead) and no longer in cluster.json: no false death."""
    stopped_at = declare_dead(database_url, "w-9")
    folder = state.work_dir("w-9")
    folder.mkdir(parents=True)
    leave = {"event": "leave", "worker_id": "w-9", "incarnation": 1, "epoch": 1, "time": stopped_at}
    (folder / "agent.jsonl").write_text(json.dumps({**leave, "left": False}) + "\n")
    status, output = check(state)
    assert status == 0, output
    assert json.loads(output)["false_deaths"] == 0
