"""The heartbeat interval on a real PostgreSQL through a real ingest (gRPC): what registrations
and heartbeats tell, the dead_after each worker is judged by (workers.dead_after_ms), and the
leader's declaration honouring it (docs/design.md, "Heartbeat interval").

The rule under test: a worker is judged by at least the dead_after its self-fence may be
derived from, which is the one told in the newest reply it may have received or the one its
newest heartbeat says it uses; a late copy of an older heartbeat never lowers it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from serving import ingest_and_leader, serve_ingests
from test_leave import EPOCH, Cluster

from actors import queries
from actors.heartbeat_policy import HeartbeatPolicy, default_policy
from actors.reconciler_store import PgReconcilerStore
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.settings.leader import ReconcilerSettings

DEFAULTS = default_policy(ReconcilerSettings())


class Told(Cluster):
    async def beat(
        self, worker_id: str, incarnation: int, *, sent_us: int, in_use_ms: int
    ) -> pb.HeartbeatReply:
        reply: pb.HeartbeatReply = await self.cp.call(
            "heartbeat",
            pb.HeartbeatRequest(
                worker_id=worker_id,
                incarnation=incarnation,
                sent_monotonic_us=sent_us,
                dead_after_in_use_ms=in_use_ms,
            ),
        )
        return reply

    async def judged_ms(self, worker_id: str) -> int | None:
        value = await self.admin.fetchval("SELECT dead_after_ms FROM workers WHERE id = $1", worker_id)
        return None if value is None else int(value)

    async def set_policy(self, interval_ms: int, dead_after_ms: int) -> None:
        policy = HeartbeatPolicy(
            interval_ms=interval_ms, dead_after_ms=dead_after_ms, workers=1, reason="test"
        )
        await self.admin.execute(
            queries.SET_HEARTBEAT_POLICY,
            EPOCH,
            policy.interval_ms,
            policy.dead_after_ms,
            policy.workers,
            policy.cpu_per_heartbeat_us,
            policy.reason,
        )

    async def declare(self, worker_id: str, incarnation: int, dead_after_s: float) -> list[str]:
        rows = await self.admin.fetch(
            queries.DECLARE_DEAD_WORKERS, EPOCH, dead_after_s, [worker_id], [incarnation], None
        )
        return [r["id"] for r in rows]


@pytest.fixture
async def cluster(database_url: str) -> AsyncIterator[Told]:
    async with ingest_and_leader(database_url, epoch=EPOCH) as (cp, admin):
        yield Told(cp=cp, admin=admin, database_url=database_url)


async def test_before_any_choice_the_control_planes_defaults_are_told_and_recorded(cluster: Told) -> None:
    """No policy row: the registration and the heartbeat tell the defaults (250 ms, 2.5 s), and
    the row records 2.5 s as the dead_after the worker is judged by."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    reply = await cluster.beat("w-1", incarnation, sent_us=10, in_use_ms=DEFAULTS.dead_after_ms)
    assert (reply.heartbeat_interval_ms, reply.dead_after_ms) == (250, 2500)
    assert await cluster.judged_ms("w-1") == 2500


async def test_a_longer_dead_after_is_recorded_with_the_reply_that_tells_it(cluster: Told) -> None:
    """The leader chose 1 s / 4 s: the next heartbeat is told so, and the row says 4 s in the
    same statement, before the worker can have heard of it."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    await cluster.set_policy(1000, 4000)
    reply = await cluster.beat("w-1", incarnation, sent_us=10, in_use_ms=2500)
    assert (reply.heartbeat_interval_ms, reply.dead_after_ms) == (1000, 4000)
    assert await cluster.judged_ms("w-1") == 4000


async def test_a_shorter_dead_after_is_judged_only_once_a_newer_heartbeat_says_it_is_in_use(
    cluster: Told,
) -> None:
    """From 4 s down to 2.5 s: the heartbeat told 2.5 s still says it uses 4 s, so 4 s stays
    (its reply may be lost); the next one, saying 2.5 s, lowers it."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    await cluster.set_policy(1000, 4000)
    await cluster.beat("w-1", incarnation, sent_us=10, in_use_ms=2500)
    await cluster.admin.execute("DELETE FROM heartbeat_policy")  # back to the defaults
    told = await cluster.beat("w-1", incarnation, sent_us=20, in_use_ms=4000)
    assert told.dead_after_ms == 2500
    assert await cluster.judged_ms("w-1") == 4000
    await cluster.beat("w-1", incarnation, sent_us=30, in_use_ms=2500)
    assert await cluster.judged_ms("w-1") == 2500


async def test_a_late_copy_of_an_older_heartbeat_never_lowers_it(cluster: Told) -> None:
    """A heartbeat sent at 50 µs recorded 8 s; a copy of one sent earlier (30 µs, saying it
    used 2.5 s) arrives late: 8 s stays. A copy of the same heartbeat lowers nothing either."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    await cluster.set_policy(2000, 8000)
    await cluster.beat("w-1", incarnation, sent_us=50, in_use_ms=2500)
    await cluster.admin.execute("DELETE FROM heartbeat_policy")
    await cluster.beat("w-1", incarnation, sent_us=30, in_use_ms=2500)
    assert await cluster.judged_ms("w-1") == 8000
    await cluster.beat("w-1", incarnation, sent_us=50, in_use_ms=2500)
    assert await cluster.judged_ms("w-1") == 8000


async def test_a_new_incarnation_starts_from_what_its_registration_told(cluster: Told) -> None:
    """A registration of a new agent run tells the policy in force and resets the order: its
    first heartbeats, whatever their monotonic time, are newer than nothing."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    await cluster.set_policy(2000, 8000)
    await cluster.beat("w-1", incarnation, sent_us=10**12, in_use_ms=8000)
    await cluster.admin.execute("DELETE FROM heartbeat_policy")
    again = await cluster.register("w-1", "run-b", heartbeat=False)
    assert again != incarnation
    assert await cluster.judged_ms("w-1") == 2500
    await cluster.beat("w-1", again, sent_us=5, in_use_ms=2500)
    assert await cluster.judged_ms("w-1") == 2500


async def test_the_declaration_honours_the_dead_after_the_worker_is_judged_by(cluster: Told) -> None:
    """A worker told 8 s is not declared dead by a leader whose own dead_after is 0 s; once its
    row no longer says 8 s (as a worker an older control plane registered), it is."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    await cluster.set_policy(2000, 8000)
    await cluster.beat("w-1", incarnation, sent_us=10, in_use_ms=8000)
    assert await cluster.declare("w-1", incarnation, 0.0) == []
    await cluster.admin.execute("UPDATE workers SET dead_after_ms = NULL")
    await cluster.admin.execute("DELETE FROM heartbeat_policy")
    assert await cluster.declare("w-1", incarnation, 0.0) == ["w-1"]


async def test_a_worker_not_heard_since_the_interval_grew_is_judged_by_the_longer_dead_after(
    cluster: Told,
) -> None:
    """A worker registered while 2.5 s was in force, and none of its heartbeats got through
    since (a registration storm): the leader chose 16 s meanwhile, and the worker is judged by
    16 s, not by the 2.5 s its row still records; the reconciler's read and the declaration
    agree."""
    incarnation = await cluster.register("w-1", heartbeat=False)
    assert await cluster.judged_ms("w-1") == 2500
    await cluster.set_policy(4000, 16000)
    await cluster.admin.execute(
        "UPDATE workers SET last_heartbeat_at = now() - interval '5 seconds' WHERE id = 'w-1'"
    )
    assert await cluster.declare("w-1", incarnation, 0.0) == []
    ages = await cluster.admin.fetch(queries.HEARTBEAT_AGES)
    assert [(r["id"], r["dead_after_ms"]) for r in ages] == [("w-1", 16000)]
    # (Declared once 16 s have passed: the test before this one shows the rule for the row's.)


async def test_status_shows_the_interval_and_the_detection_time_in_force(cluster: Told) -> None:
    """Status says the defaults and their reason before any choice, then the leader's choice."""
    before: pb.StatusReply = await cluster.cp.call("status", pb.StatusRequest())
    assert (before.heartbeat_interval_ms, before.dead_after_ms) == (250, 2500)
    assert before.heartbeat_policy == "the control planes' settings"
    await cluster.set_policy(1000, 4000)
    after: pb.StatusReply = await cluster.cp.call("status", pb.StatusRequest())
    assert (after.heartbeat_interval_ms, after.dead_after_ms, after.heartbeat_policy) == (
        1000,
        4000,
        "when chosen: test",
    )


async def test_each_replica_records_the_99th_percentile_of_the_waits_its_heartbeats_report(
    database_url: str,
) -> None:
    """Heartbeats say how long the previous one waited (waited_ms); each replica records, with
    its presence, the 99th percentile over the workers it heard of each one's wait, and the
    leader's policy read finds one per replica: 12 workers whose waits at cp-1 are 100..1,200 ms
    give 900 ms (never one of the three largest), the same 12 at 4,000 ms at cp-2 give 4,000 (a
    replica sees only its own heartbeats). Heartbeats of an incarnation that is not alive (told
    to register again) are not recorded, and their waits not counted: four workers saying
    2**32 - 1 ms that way change nothing. The read counts both replicas as live."""
    async with serve_ingests(database_url, "cp-1", "cp-2", presence_interval_s=0.2) as ingests:
        clients = [ControlPlaneClient([i.address], timeout_s=10.0) for i in ingests]
        store = PgReconcilerStore(database_url=database_url, application_name="stockade test reconciler")
        try:
            cluster = Cluster(cp=clients[0], admin=None, database_url=database_url)  # type: ignore[arg-type]
            for n in range(12):
                worker_id = f"w-waits-{n}"
                incarnation = await cluster.register(worker_id, heartbeat=False)
                for index, waited_ms in ((0, 100 * (n + 1)), (1, 4000)):
                    await clients[index].call(
                        "heartbeat",
                        pb.HeartbeatRequest(
                            worker_id=worker_id, incarnation=incarnation, waited_ms=waited_ms
                        ),
                    )
            for n in range(4):
                worker_id = f"w-stale-{n}"
                incarnation = await cluster.register(worker_id, heartbeat=False)
                reply = await clients[0].call(
                    "heartbeat",
                    pb.HeartbeatRequest(
                        worker_id=worker_id, incarnation=incarnation + 100, waited_ms=2**32 - 1
                    ),
                )
                assert reply.reregister
            read: list[float] = []
            with trio.fail_after(10):
                while read != [900.0, 4000.0]:
                    await trio.sleep(0.1)  # the next presence records
                    read = sorted((await store.heartbeat_policy_inputs(60.0)).waits_ms)
            # Both replicas count as sharing the heartbeats, measured a cost or not.
            assert (await store.heartbeat_policy_inputs(60.0)).replicas == 2
        finally:
            for client in clients:
                client.close()
            await store.close()
