"""Accounts' usage caps in the placer's pure plan (:func:`actors.round_plan.plan_round`): a job
whose account would pass its cpu_millis or memory_mb cap stays pending with a reason naming
the cap, counting what the round itself places; other accounts' jobs are placed past it, best
fit still chooses the worker, and an over-cap job reserves nothing (docs/quotas.md)."""

from __future__ import annotations

from collections import defaultdict

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples
from test_plan_round import NOW, live_workers, placer_settings

from actors.messages import WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placer_store import LiveWorker
from actors.quotas import AccountQuota
from actors.rooms import WorkerRoom
from actors.round_plan import RoundPlan, plan_round
from runtime.settings.leader import PlacerSettings

SETTINGS = PlacerSettings(policy="best_fit")


def worker(worker_id: str, cpu_millis: int = 16000, memory_mb: int = 65536, used_cpu: int = 0) -> LiveWorker:
    ref = WorkerRef(worker_id=worker_id, address="127.0.0.1:1", incarnation=1)
    room = WorkerRoom(
        worker_id=worker_id, cpu_millis=cpu_millis, memory_mb=memory_mb, cpu_allocated_millis=used_cpu
    )
    return LiveWorker(ref=ref, room=room, confirmed=100)


def queue_of(*jobs: PendingJob, reasons: dict[int, str] | None = None) -> PendingQueue:
    queue = PendingQueue()
    queue.replace(list(jobs), reasons)
    return queue


def job(
    job_id: int, owner: str, cpu_millis: int = 1000, memory_mb: int = 1024, priority: int = 0
) -> PendingJob:
    return PendingJob(
        job_id=job_id, cpu_millis=cpu_millis, memory_mb=memory_mb, priority=priority, owner=owner
    )


def plan(
    queue: PendingQueue,
    workers: list[LiveWorker],
    quotas: dict[str, AccountQuota],
    s: PlacerSettings = SETTINGS,
) -> RoundPlan:
    return plan_round(queue, workers, s, max_rows=1000, now=NOW, quotas=quotas)


def test_a_job_over_its_accounts_cpu_cap_waits_naming_it_and_others_are_placed_past_it() -> None:
    """alice uses 32000 of 32000 cpu_millis: her job, first in the queue, stays pending with the
    reason naming the cap; bob's job after it is placed."""
    quotas = {"alice": AccountQuota(cpu_millis=32000, used_cpu_millis=32000)}
    done = plan(queue_of(job(1, "alice", priority=5), job(2, "bob")), [worker("w-1")], quotas)
    assert done.placed_job_ids == (2,)
    assert done.reasons == ((1, "quota: alice uses 32000 of 32000 cpu_millis"),)


def test_the_round_counts_what_it_places_itself() -> None:
    """With a 2000 cpu_millis cap and nothing in use, two of alice's three 1000-cpu_millis jobs
    are placed; the third waits for the cap, which her use reaches in this round."""
    quotas = {"alice": AccountQuota(cpu_millis=2000)}
    done = plan(queue_of(job(1, "alice"), job(2, "alice"), job(3, "alice")), [worker("w-1")], quotas)
    assert done.placed_job_ids == (1, 2)
    assert done.reasons == ((3, "quota: alice uses 2000 of 2000 cpu_millis"),)


def test_a_memory_cap_is_named_when_memory_is_what_it_passes() -> None:
    """A job within the cpu cap but past the memory cap waits naming memory_mb."""
    quotas = {"alice": AccountQuota(cpu_millis=64000, memory_mb=4096, used_memory_mb=3072)}
    done = plan(queue_of(job(1, "alice", memory_mb=2048)), [worker("w-1")], quotas)
    assert done.placed_job_ids == ()
    assert done.reasons == ((1, "quota: alice uses 3072 of 4096 memory_mb"),)


def test_best_fit_still_chooses_the_worker_for_a_job_within_its_caps() -> None:
    """A capped account's job within its caps goes where best fit puts it: the fuller worker."""
    quotas = {"alice": AccountQuota(cpu_millis=8000, used_cpu_millis=4000)}
    workers = [worker("w-1"), worker("w-2", used_cpu=12000)]
    done = plan(queue_of(job(1, "alice", cpu_millis=4000)), workers, quotas)
    assert [(p.job_id, p.worker_id) for p in done.placements] == [(1, "w-2")]
    assert done.reasons == ()


def test_a_job_over_its_cap_reserves_no_worker() -> None:
    """A job too large for any free room but over its account's cap reserves nothing, so a
    smaller job of another account after it takes the room."""
    s = attrs.evolve(SETTINGS, max_reservations=1, reserve_after_s=0.0)
    quotas = {"alice": AccountQuota(cpu_millis=1000)}
    queue = queue_of(job(1, "alice", cpu_millis=8000, priority=1), job(2, "bob", cpu_millis=2000))
    done = plan(queue, [worker("w-1", cpu_millis=8000, used_cpu=4000)], quotas, s)
    assert done.reservations == ()
    assert done.placed_job_ids == (2,)
    assert done.reasons == ((1, "quota: alice uses 0 of 1000 cpu_millis"),)


def test_a_stored_quota_reason_follows_the_cap_and_is_not_written_again() -> None:
    """Once the cap is raised, the job waiting for it is placed (its commit clears its reason)
    and the next one's reason says the new use; a reason already stored is not written again
    while it still holds."""
    reason = "quota: alice uses 1000 of 1000 cpu_millis"
    queue = queue_of(job(1, "alice"), job(2, "alice"), reasons={1: reason, 2: reason})
    raised = {"alice": AccountQuota(cpu_millis=2000, used_cpu_millis=1000)}
    done = plan(queue, [worker("w-1")], raised)
    assert done.placed_job_ids == (1,)
    assert done.reasons == ((2, "quota: alice uses 2000 of 2000 cpu_millis"),)
    same = plan(queue, [worker("w-1")], {"alice": AccountQuota(cpu_millis=1000, used_cpu_millis=1000)})
    assert (same.placed_job_ids, same.reasons, same.outcome) == ((), (), "nothing")


def test_a_stored_quota_reason_is_not_written_again_when_only_the_use_moved() -> None:
    """A job waiting for alice's 2000 cpu_millis cap keeps its stored reason while her use moves
    under the same cap (no row written at every round of a busy account); a job that has none
    yet is given one naming the use now."""
    queue = queue_of(
        job(1, "alice", cpu_millis=1500),
        job(2, "alice", cpu_millis=1500),
        reasons={1: "quota: alice uses 2000 of 2000 cpu_millis"},
    )
    done = plan(queue, [worker("w-1")], {"alice": AccountQuota(cpu_millis=2000, used_cpu_millis=1000)})
    assert done.placed_job_ids == ()
    assert done.reasons == ((2, "quota: alice uses 1000 of 2000 cpu_millis"),)


def test_a_changed_cap_makes_an_idle_round_decide_again() -> None:
    """A round with the same queue and workers as one that found nothing to do decides again
    when a cap changed."""
    queue = queue_of(job(1, "alice"))
    held = plan(queue, [worker("w-1")], {"alice": AccountQuota(cpu_millis=0)})
    again = plan_round(
        queue,
        [worker("w-1")],
        SETTINGS,
        max_rows=1000,
        now=NOW,
        idle_fingerprint=held.fingerprint,
        quotas={"alice": AccountQuota(cpu_millis=1000)},
    )
    assert again.placed_job_ids == (1,)


@st.composite
def owned_queues(draw: st.DrawFn) -> PendingQueue:
    ids = draw(st.lists(st.integers(1, 10_000), max_size=40, unique=True))
    owners = st.sampled_from(["alice", "bob", "carol"])
    jobs = [
        job(i, draw(owners), draw(st.integers(1, 9000)), draw(st.integers(1, 9000)), draw(st.integers(0, 3)))
        for i in ids
    ]
    return queue_of(*jobs)


caps = st.builds(
    AccountQuota,
    cpu_millis=st.none() | st.integers(0, 20000),
    memory_mb=st.none() | st.integers(0, 20000),
    used_cpu_millis=st.integers(0, 10000),
    used_memory_mb=st.integers(0, 10000),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    queue=owned_queues(),
    workers=live_workers(),
    s=placer_settings,
    quotas=st.dictionaries(st.sampled_from(["alice", "bob"]), caps),
)
def test_a_plan_never_takes_an_account_past_its_caps(
    queue: PendingQueue, workers: list[LiveWorker], s: PlacerSettings, quotas: dict[str, AccountQuota]
) -> None:
    """What a plan places for a capped account, added to what it uses, stays within each cap
    (when its use was within it); every job left with a quota reason is over a cap."""
    done = plan(queue, workers, quotas, s)
    owner_of = {j.job_id: j.owner for j in queue.jobs()}
    placed: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in done.placements:
        placed[owner_of[p.job_id]][0] += p.cpu_millis
        placed[owner_of[p.job_id]][1] += p.memory_mb
    for name, q in quotas.items():
        if q.cpu_millis is not None and q.used_cpu_millis <= q.cpu_millis:
            assert q.used_cpu_millis + placed[name][0] <= q.cpu_millis
        if q.memory_mb is not None and q.used_memory_mb <= q.memory_mb:
            assert q.used_memory_mb + placed[name][1] <= q.memory_mb
    for job_id, reason in done.reasons:
        if reason.startswith("quota:"):
            assert owner_of[job_id] in quotas
