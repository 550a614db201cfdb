"""The placer with gangs (actors/placer.py): a gang's tasks are held apart from the single jobs,
read as they become pending, and committed all together once every one of them is pending."""

from __future__ import annotations

import trio
import trio.testing
from test_placer_queue import FakeStore, make_placer, waiting

from actors.gang_queue import GangTask
from actors.messages import CommitPlacements
from actors.pending_queue import PendingJob
from actors.placer_store import WaitingJob


def task(job_id: int, rank: int, size: int = 2) -> WaitingJob:
    return WaitingJob(
        job=PendingJob(job_id=job_id, cpu_millis=1000, memory_mb=100),
        reason="",
        gang=GangTask(gang_id=10, rank=rank, size=size),
    )


async def test_a_gang_is_committed_whole_once_all_its_tasks_are_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Rank 0 is read first and waits (not in the single jobs' queue); once rank 1 is read too,
    one commit carries both tasks, before the single job."""
    store = FakeStore(visible={1: task(10, 0), 2: waiting(3, 2)}, free_cpu=8000)
    placer, ledger = make_placer(store)
    commits: list[list[int]] = []

    async def answer() -> None:
        async for message in ledger:
            assert isinstance(message, CommitPlacements)
            commits.append([p.job_id for p in message.placements])
            message.reply.set(())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        await placer.round(epoch=1)
        assert [j.job_id for j in placer.queue.jobs()] == []
        assert placer.gangs.whole() == [] and len(placer.gangs) == 1
        store.visible[5] = task(11, 1)
        await placer.round(epoch=1)
        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert commits == [[3], [10, 11]]
