"""``stockade check`` on a real database: a worker killed by hand (``kill -9``, no harness to
record it) is a false death until the operator gives the fault with ``--fault``; a fault of a
fleet counts for its workers; faults naming no process of the cluster, or malformed, are
refused with exit status 2 before anything is read."""

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


def check(state: StateDir, *faults: str) -> tuple[int, str]:
    args = ["check", "--state-dir", str(state.root), "--json"]
    for fault in faults:
        args += ["--fault", fault]
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
