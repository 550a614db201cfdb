"""A worker whose registration answer is lost or late, against two real ingest replicas over
real gRPC on a real PostgreSQL: the hedged copy and the retries are answered with the one
incarnation the first copy created, and they use up no incarnation number of their own (the
sequence the numbers come from reads exactly one per registration)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from serving import serve_ingests

from agent.core import Agent
from agent.main import run_agent
from protocol import pb
from runtime import faults
from runtime.aio import PgConnection
from runtime.client import ControlPlaneClient
from runtime.errors import DatabaseUnavailable
from runtime.settings.agent import AgentSettings
from runtime.settings.control_plane import IngestSettings
from runtime.text import read_jsonl

TIMEOUT_S = 30.0


def settings(addresses: list[str], work_dir: Path) -> AgentSettings:
    return AgentSettings(
        worker_id="w-1",
        control_planes=tuple(addresses),
        cpu_millis=1000,
        memory_mb=512,
        work_dir=str(work_dir),
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=0.5,
        labels={"container": "none"},
    )


def lose_answer() -> Callable[[], Awaitable[None]]:
    """The first registration committed fails to answer (UNAVAILABLE, as when the connection
    broke after the commit)."""
    hits: list[None] = []

    async def hook() -> None:
        hits.append(None)
        if len(hits) == 1:
            raise DatabaseUnavailable("the answer was lost after the commit")

    return hook


def late_answers(count: int, late_s: float) -> Callable[[], Awaitable[None]]:
    """The first ``count`` registrations committed answer ``late_s`` after their commit."""
    hits: list[None] = []

    async def hook() -> None:
        hits.append(None)
        if len(hits) <= count:
            await trio.sleep(late_s)

    return hook


@pytest.mark.parametrize(
    "hook",
    [
        pytest.param(lose_answer, id="answer-lost"),
        # Past the hedge (0.5 s): the other replica is asked too and answers with the copy.
        pytest.param(lambda: late_answers(1, 3.0), id="answer-late-hedged"),
        # Past the call's deadline at both replicas: the registration is retried after a
        # backoff, and the retry is answered with what the first copy created.
        pytest.param(lambda: late_answers(2, 3.0), id="answer-late-retried"),
    ],
)
async def test_a_registration_whose_answer_is_lost_or_late_makes_one_incarnation(
    database_url: str, tmp_path: Path, hook: Callable[[], Callable[[], Awaitable[None]]]
) -> None:
    """The worker ends registered once: its incarnation is the row's, the incarnation sequence
    has given out exactly one number, the ingests answered copies again, and the agent logged
    one registration and heartbeats on without being asked to register again."""
    async with (
        serve_ingests(database_url, "cp-1", "cp-2") as replicas,
        faults.installed("ingest.register_after_commit", hook()),
        trio.open_nursery() as nursery,
    ):
        admin = await PgConnection.connect(database_url)
        try:
            with trio.fail_after(TIMEOUT_S):
                agent: Agent = await nursery.start(
                    run_agent, settings([r.address for r in replicas], tmp_path)
                )
                await agent.wait_registered()
                await trio.sleep(1.0)  # heartbeats on
                row = await admin.fetchrow("SELECT incarnation, state FROM workers WHERE id = 'w-1'")
                numbers = await admin.fetchval("SELECT last_value FROM worker_incarnation_seq")
        finally:
            await admin.close()
            nursery.cancel_scope.cancel()
    assert row is not None and (row["incarnation"], row["state"]) == (agent.incarnation, "alive")
    assert numbers == agent.incarnation == 1
    registers = [r for r in read_jsonl(tmp_path / "agent.jsonl") if r["event"] == "register"]
    assert len(registers) == 1


async def copy_waiting(admin: PgConnection) -> None:
    """Return once some session waits for a lock (the database says so; no event reaches
    here from inside it)."""
    for _ in range(int(TIMEOUT_S / 0.02)):
        if await admin.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"):
            return
        await trio.sleep(0.02)
    raise AssertionError("no session waited for a lock")


async def test_a_copy_of_a_first_registration_that_meets_it_uncommitted_uses_no_number(
    database_url: str,
) -> None:
    """The first registration of a worker is held before its commit while a copy (same run and
    number) reaches the other replica: the copy waits for it, and both answer with incarnation
    1; the sequence has given out one number."""
    held = trio.Event()
    release = trio.Event()
    hits: list[None] = []

    async def hold_first() -> None:
        hits.append(None)
        if len(hits) == 1:
            held.set()
            await release.wait()

    request = pb.RegisterWorkerRequest(
        worker_id="w-1",
        address="127.0.0.1:9",
        cpu_millis=1000,
        memory_mb=512,
        agent_run_id="run-1",
        registration_seq=1,
    )
    answers: list[int] = []
    async with (
        serve_ingests(database_url, "cp-1", "cp-2", settings=IngestSettings(lock_timeout_s=10.0)) as replicas,
        faults.installed("ingest.promise_before_commit", hold_first),
    ):
        clients = [ControlPlaneClient([r.address], timeout_s=10.0) for r in replicas]
        admin = await PgConnection.connect(database_url)
        try:
            with trio.fail_after(TIMEOUT_S):
                async with trio.open_nursery() as nursery:

                    async def register(client: ControlPlaneClient) -> None:
                        answers.append((await client.call("register_worker", request)).incarnation)

                    nursery.start_soon(register, clients[0])
                    await held.wait()
                    nursery.start_soon(register, clients[1])
                    await copy_waiting(admin)
                    release.set()
            numbers = await admin.fetchval("SELECT last_value FROM worker_incarnation_seq")
        finally:
            await admin.close()
            for client in clients:
                client.close()
    assert answers == [1, 1]
    assert numbers == 1
