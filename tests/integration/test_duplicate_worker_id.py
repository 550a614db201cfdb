"""Two agent processes started with the same worker id, against a real ingest on a real
PostgreSQL: the later registration keeps the id, and the earlier agent, told by its next
heartbeat that a newer incarnation of another agent run holds it, stops its jobs and ends with
an error naming the other agent, instead of registering again and taking the id back (each
would end the other's jobs in turn, for ever)."""

from __future__ import annotations

from pathlib import Path

import trio
from serving import serve_ingests

from agent.core import Agent
from agent.main import run_agent
from runtime.aio import PgConnection
from runtime.errors import FailedPrecondition
from runtime.settings.agent import AgentSettings

TIMEOUT_S = 20.0


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside ``error``'s (nested) groups, or ``error`` itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def settings(address: str, work_dir: Path) -> AgentSettings:
    return AgentSettings(
        worker_id="w-1",
        control_planes=(address,),
        cpu_millis=1000,
        memory_mb=512,
        work_dir=str(work_dir),
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=1.0,
        labels={"container": "none"},
    )


async def test_the_earlier_of_two_agents_sharing_an_id_stops_and_the_later_keeps_it(
    database_url: str, tmp_path: Path
) -> None:
    """w-1 registers, then a second agent registers as w-1 too: the first ends with one error
    naming the second's address and incarnation; the second stays registered, its incarnation
    the worker's row's, heartbeating."""
    ended: list[BaseException] = []
    first_done = trio.Event()

    async def first_agent(task_status: trio.TaskStatus[Agent]) -> None:
        try:
            await run_agent(settings(ingest.address, tmp_path / "a"), task_status=task_status)
        except* FailedPrecondition as group:  # from inside the agent's nurseries
            ended.extend(leaves(group))
        finally:
            first_done.set()

    async with serve_ingests(database_url, "cp-1") as (ingest,), trio.open_nursery() as nursery:
        admin = await PgConnection.connect(database_url)
        try:
            with trio.fail_after(TIMEOUT_S):
                first: Agent = await nursery.start(first_agent)
                await first.wait_registered()
                second: Agent = await nursery.start(run_agent, settings(ingest.address, tmp_path / "b"))
                await second.wait_registered()
                await first_done.wait()  # told by its next heartbeat
                await trio.sleep(0.5)  # the second heartbeats on, unbothered
                row = await admin.fetchrow(
                    "SELECT incarnation, address, state,"
                    " last_heartbeat_at > now() - interval '0.4 s' AS fresh"
                    " FROM workers WHERE id = 'w-1'"
                )
        finally:
            await admin.close()
            nursery.cancel_scope.cancel()
    assert row is not None
    assert (row["incarnation"], row["address"], row["state"], row["fresh"]) == (
        second.incarnation,
        second.address,
        "alive",
        True,
    )
    (raised,) = ended
    message = str(raised)
    assert f"another agent registered as worker w-1 (from {second.address}, incarnation" in message
    assert "two agents must not share an id" in message
