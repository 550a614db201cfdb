"""Heartbeats recorded in groups on a real PostgreSQL: the statement ``record_heartbeats``
(schema.sql) called by hand, and the ingest's grouped path through real gRPC
(docs/design.md, "Grouped heartbeats")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from prometheus_client import REGISTRY
from serving import ingest_and_leader
from test_leave import EPOCH, RUN, Cluster

from actors import queries
from protocol import pb
from runtime.aio import PgConnection

TOLD = (250, 2500)


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Cluster]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Cluster(cp=cp, admin=admin, database_url=database_url)


async def record(
    conn: PgConnection, members: list[tuple[str, int]], running: dict[int, list[int]] | None = None
) -> list[Any]:
    """Call record_heartbeats for ``members`` (worker id, incarnation), ``running`` giving the
    assignments each (by 1-based member number) lists."""
    running = running or {}
    ids = [a for n in sorted(running) for a in running[n]]
    owners = [n for n in sorted(running) for _ in running[n]]
    return list(
        await conn.fetch(
            queries.RECORD_HEARTBEATS,
            [w for w, _ in members],
            [i for _, i in members],
            [1] * len(members),
            [0] * len(members),
            ids,
            owners,
            *TOLD,
        )
    )


async def stamp(cluster: Cluster, worker_id: str) -> Any:
    return await cluster.admin.fetchval("SELECT last_heartbeat_at FROM workers WHERE id = $1", worker_id)


async def test_one_statement_answers_each_member_alive_or_reregister_with_newer_registration(
    cluster: Cluster,
) -> None:
    """An alive member is stamped; a dead one, an unknown one and an earlier incarnation are
    told to register again, the last with the registration that replaced it."""
    alive = await cluster.register("w-1")
    dead = await cluster.register("w-2")
    await cluster.admin.execute("UPDATE workers SET state = 'dead' WHERE id = 'w-2'")
    old = await cluster.register("w-4")
    new = await cluster.register("w-4", seq=2)
    before = await stamp(cluster, "w-1")
    rows = await record(cluster.admin, [("w-1", alive), ("w-2", dead), ("w-3", 7), ("w-4", old)])
    assert [(r["member"], r["alive"], r["skipped"]) for r in rows] == [
        (1, True, False),
        (2, False, False),
        (3, False, False),
        (4, False, False),
    ]
    assert [(r["newer_agent_run_id"], r["newer_incarnation"]) for r in rows] == [
        (None, None),
        (None, None),
        (None, None),
        (RUN, new),
    ]
    assert rows[3]["newer_address"] == "127.0.0.1:9"
    assert {(r["current_epoch"], r["told_interval_ms"], r["told_dead_after_ms"]) for r in rows} == {
        (EPOCH, *TOLD)
    }
    assert await stamp(cluster, "w-1") > before


async def test_running_confirmations_and_stop_lists_are_per_member(cluster: Cluster) -> None:
    """Each member's running assignments are confirmed only when active on its own worker
    (their jobs run); the ones that are not are named to stop, to that member only."""
    i1 = await cluster.register("w-1")
    i2 = await cluster.register("w-2")
    a1 = await cluster.place(await cluster.submit(), "w-1", i1)
    a2 = await cluster.place(await cluster.submit(), "w-2", i2)
    rows = await record(cluster.admin, [("w-1", i1), ("w-2", i2)], {1: [a1, a2, 999], 2: [a2]})
    assert [sorted(r["stop_assignment_ids"]) for r in rows] == [sorted([a2, 999]), []]
    confirmed = await cluster.admin.fetch(
        "SELECT a.id, j.state FROM assignments a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.confirmed_at IS NOT NULL ORDER BY a.id"
    )
    assert [(r["id"], r["state"]) for r in confirmed] == [(a1, "running"), (a2, "running")]


async def test_answers_stay_per_member_once_the_statement_runs_on_cached_generic_plans(
    cluster: Cluster,
) -> None:
    """Called again and again on one connection (its plans cached and generic from the first
    call), each member keeps its own answer wherever it stands in the group: an alive member
    with an assignment to stop, an unknown worker, an earlier incarnation; and an assignment
    placed between two calls is confirmed by the next one."""
    i1 = await cluster.register("w-1")
    i2 = await cluster.register("w-2")
    old = await cluster.register("w-3")
    new = await cluster.register("w-3", seq=2)
    a1 = await cluster.place(await cluster.submit(), "w-1", i1)
    a2 = 0
    members = [("w-9", 4), ("w-2", i2), ("w-3", old), ("w-1", i1)]
    for call in range(8):
        if call == 5:
            a2 = await cluster.place(await cluster.submit(), "w-2", i2)
        running = {2: [a2]} if call >= 5 else {}
        rows = await record(cluster.admin, members, {4: [a1, 999], **running})
        assert [(r["member"], r["alive"], r["skipped"]) for r in rows] == [
            (1, False, False),
            (2, True, False),
            (3, False, False),
            (4, True, False),
        ]
        assert [list(r["stop_assignment_ids"]) for r in rows] == [[], [], [], [999]]
        assert [r["newer_incarnation"] for r in rows] == [None, None, new, None]
    confirmed = await cluster.admin.fetch(
        "SELECT a.id, j.state FROM assignments a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.confirmed_at IS NOT NULL ORDER BY a.id"
    )
    assert [(r["id"], r["state"]) for r in confirmed] == [(a1, "running"), (a2, "running")]


async def test_a_member_whose_row_is_locked_is_skipped_and_the_others_recorded(
    cluster: Cluster, database_url: str
) -> None:
    """A worker row held by another transaction does not make the group wait: that member is
    answered skipped (nothing recorded for it), the others are recorded."""
    i1 = await cluster.register("w-1")
    i2 = await cluster.register("w-2")
    before = await stamp(cluster, "w-2")
    holder = await PgConnection.connect(database_url)
    try:
        await holder.execute("BEGIN")
        await holder.fetchval(queries.LOCK_WORKER, "w-2")
        with trio.fail_after(10.0):
            rows = await record(cluster.admin, [("w-1", i1), ("w-2", i2)])
        assert [(r["alive"], r["skipped"]) for r in rows] == [(True, False), (False, True)]
        await holder.execute("ROLLBACK")
    finally:
        await holder.close()
    assert await stamp(cluster, "w-2") == before


async def test_a_worker_named_twice_in_one_group_is_refused(cluster: Cluster) -> None:
    """The statement refuses a group that names a worker twice (the grouper keeps the second
    heartbeat for the next group), recording nothing."""
    i1 = await cluster.register("w-1")
    before = await stamp(cluster, "w-1")
    with pytest.raises(Exception, match="appears more than once"):
        await record(cluster.admin, [("w-1", i1), ("w-1", i1)])
    assert await stamp(cluster, "w-1") == before


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_concurrent_heartbeats_through_the_ingest_are_recorded_in_groups(cluster: Cluster) -> None:
    """Liveness-only heartbeats of many workers sent at once through the ingest are recorded
    by group statements, each worker answered for itself; a heartbeat with an outcome is still
    recorded (alone, durably)."""
    incarnations = {f"w-{n}": await cluster.register(f"w-{n}", heartbeat=False) for n in range(20)}
    job = await cluster.submit()
    assignment = await cluster.place(job, "w-0", incarnations["w-0"])
    members_before = sample("stockade_heartbeat_group_heartbeats_sum")
    statements_before = sample("stockade_heartbeat_group_statements_total", {"result": "recorded"})
    replies: dict[str, pb.HeartbeatReply] = {}

    async def beat(worker_id: str) -> None:
        running = [assignment] if worker_id == "w-0" else []
        replies[worker_id] = await cluster.heartbeat(worker_id, incarnations[worker_id], *running)

    async with trio.open_nursery() as nursery:
        for worker_id in incarnations:
            nursery.start_soon(beat, worker_id)
    assert sample("stockade_heartbeat_group_heartbeats_sum") - members_before == 20
    assert sample("stockade_heartbeat_group_statements_total", {"result": "recorded"}) > statements_before
    assert all(not r.reregister and r.epoch == EPOCH for r in replies.values())
    assert await cluster.admin.fetchval("SELECT state FROM jobs WHERE id = $1", job) == "running"

    done = pb.JobOutcome(
        assignment_id=assignment, job_id=job, state="succeeded", has_exit_code=True, exit_code=0
    )
    members_before = sample("stockade_heartbeat_group_heartbeats_sum")
    reply = await cluster.cp.call(
        "heartbeat", pb.HeartbeatRequest(worker_id="w-0", incarnation=incarnations["w-0"], finished=[done])
    )
    assert not reply.reregister
    assert sample("stockade_heartbeat_group_heartbeats_sum") == members_before
    assert await cluster.admin.fetchval("SELECT state FROM jobs WHERE id = $1", job) == "succeeded"
