"""Gangs in the placer's round (actors/round_plan.py, one call of actors/gangs.py's place_gangs):
a whole gang goes into the round's placements with each worker's incarnation, the single jobs get
what it leaves, and the workers a waiting gang reserves take no single job."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.fair_share import AccountShare
from actors.gang_queue import GangQueue, GangTask
from actors.messages import WorkerRef
from actors.pending_queue import PendingJob, PendingQueue
from actors.placer_store import LiveWorker
from actors.quotas import AccountQuota
from actors.rooms import WorkerRoom
from actors.round_plan import plan_round
from runtime.settings.leader import PlacerSettings

NOW = 100.0


def _worker(
    index: int, cpu: int, allocated: int = 0, *, confirmed: int = 50, trial: bool = False
) -> LiveWorker:
    worker_id = f"w-{index}"
    return LiveWorker(
        ref=WorkerRef(worker_id=worker_id, address=f"10.0.0.{index}:1", incarnation=10 + index),
        room=WorkerRoom(worker_id=worker_id, cpu_millis=cpu, memory_mb=8192, cpu_allocated_millis=allocated),
        confirmed=confirmed,
        trial=trial,
    )


def _gangs(
    gang_id: int,
    size: int,
    cpu: int,
    *,
    spread: bool = False,
    priority: int = 0,
    owner: str = "",
    gpu: int = 0,
) -> GangQueue:
    queue = GangQueue()
    queue.add(
        [
            (
                PendingJob(
                    job_id=gang_id + rank,
                    cpu_millis=cpu,
                    memory_mb=64,
                    priority=priority,
                    owner=owner,
                    resources=(("gpu", gpu),) if gpu else (),
                ),
                GangTask(gang_id=gang_id, rank=rank, size=size, spread=spread),
                "",
            )
            for rank in range(size)
        ],
        now=0.0,
        not_before={},
    )
    return queue


def _singles(*sizes: int, priority: int = 0, owner: str = "", gpu: int = 0) -> PendingQueue:
    queue = PendingQueue()
    asked = (("gpu", gpu),) if gpu else ()
    queue.replace(
        [
            PendingJob(
                job_id=1 + k, cpu_millis=cpu, memory_mb=64, priority=priority, owner=owner, resources=asked
            )
            for k, cpu in enumerate(sizes)
        ]
    )
    return queue


def test_a_whole_gang_is_placed_before_the_single_jobs() -> None:
    """A spread gang of 3 takes one worker each, with their incarnations; the single job fits
    into what is left."""
    workers = [_worker(i, 4000) for i in range(1, 4)]
    plan = plan_round(
        _singles(2000),
        workers,
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 3, 3000, spread=True).whole(),
    )
    gang = [(p.job_id, p.worker_id, p.incarnation) for p in plan.placements if p.job_id >= 100]
    assert sorted(gang) == [(100, "w-1", 11), (101, "w-2", 12), (102, "w-3", 13)]
    assert [p.job_id for p in plan.placements if p.job_id < 100] == []  # 1000 cpu_millis left on each


def test_a_reserved_worker_takes_no_single_job() -> None:
    """A gang of 2 of 4000 cpu_millis that has waited keeps the two workers it lacks least for;
    a small single job goes to neither."""
    workers = [_worker(1, 4000, 1000), _worker(2, 4000, 1000), _worker(3, 4000, 3000)]
    settings_ = PlacerSettings(max_reservations=1, reserve_after_s=0.0)
    plan = plan_round(
        _singles(500), workers, settings_, max_rows=100, now=NOW, gangs=_gangs(100, 2, 4000).whole()
    )
    assert not [p for p in plan.placements if p.job_id >= 100]
    assert [(p.job_id, p.worker_id) for p in plan.placements] == [(1, "w-3")]
    assert {job_id for job_id, _ in plan.reasons if job_id >= 100} == {100, 101}


@given(
    st.integers(1, 6), st.integers(500, 5000), st.booleans(), st.lists(st.integers(100, 4000), max_size=10)
)
@settings(max_examples=examples(100))
def test_a_round_places_a_gang_whole_or_not_at_all(
    size: int, cpu: int, spread: bool, singles: list[int]
) -> None:
    """Whatever the single jobs, a round holds all of a gang's tasks or none, and never more
    than a worker's free room."""
    workers = [_worker(i, 4000, 500 * i) for i in range(1, 5)]
    plan = plan_round(
        _singles(*singles),
        workers,
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, size, cpu, spread=spread).whole(),
    )
    placed = {p.job_id for p in plan.placements if p.job_id >= 100}
    assert placed in (set(), set(range(100, 100 + size)))
    used = {w.ref.worker_id: w.room.cpu_allocated_millis for w in workers}
    for p in plan.placements:
        used[p.worker_id] += p.cpu_millis
    assert all(cpu_used <= 4000 for cpu_used in used.values())


def test_a_round_never_carries_more_placements_than_its_rows() -> None:
    """Gangs and single jobs together stay within the round's rows."""
    workers = [_worker(i, 16000) for i in range(1, 5)]
    plan = plan_round(
        _singles(*[100] * 20),
        workers,
        PlacerSettings(),
        max_rows=6,
        now=NOW,
        gangs=_gangs(100, 4, 100).whole(),
    )
    assert len(plan.placements) <= 6
    assert {p.job_id for p in plan.placements if p.job_id >= 100} == {100, 101, 102, 103}


def test_a_gang_larger_than_the_send_windows_is_placed_whole() -> None:
    """Two fresh workers whose send windows allow 2 placements each in a round still take a
    gang of 10 small tasks at once: a gang is bounded by the workers' free room, not by what is
    left of their windows (else it would wait forever)."""
    workers = [_worker(i, 16000, confirmed=0) for i in (1, 2)]
    settings_ = PlacerSettings(initial_window=2, max_unconfirmed_per_worker=4)
    plan = plan_round(
        _singles(), workers, settings_, max_rows=100, now=NOW, gangs=_gangs(100, 10, 1000).whole()
    )
    assert sorted(p.job_id for p in plan.placements) == list(range(100, 110))


def test_a_gang_takes_no_worker_whose_send_window_is_closed_or_that_is_unhealthy() -> None:
    """A worker whose window is used up (unconfirmed assignments) or that is unhealthy with its
    probe due takes no task of a gang; an idle worker on trial takes as many as fit."""
    closed = attrs.evolve(_worker(1, 16000, confirmed=0), unconfirmed=16)
    probing = attrs.evolve(_worker(2, 16000), unhealthy=True, probe_due=True)
    workers = [closed, probing, _worker(3, 16000, confirmed=0, trial=True), _worker(4, 4000)]
    plan = plan_round(
        _singles(), workers, PlacerSettings(), max_rows=100, now=NOW, gangs=_gangs(100, 8, 2000).whole()
    )
    assert {p.worker_id for p in plan.placements} == {"w-3", "w-4"}
    assert len(plan.placements) == 8


def test_a_gang_that_needs_every_worker_of_a_fresh_cluster_is_placed() -> None:
    """Three idle workers, two on trial (never run a job): a spread gang of three takes all
    three (a gang that waited for trials only single jobs could end, reserving the workers they
    would have run on, waited forever)."""
    workers = [
        _worker(1, 4000),
        _worker(2, 4000, confirmed=0, trial=True),
        _worker(3, 4000, confirmed=0, trial=True),
    ]
    settings_ = PlacerSettings(max_reservations=1, reserve_after_s=0.0)
    plan = plan_round(
        _singles(100),
        workers,
        settings_,
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 3, 1000, spread=True).whole(),
    )
    assert sorted(p.job_id for p in plan.placements if p.job_id >= 100) == [100, 101, 102]


def test_an_unhealthy_worker_is_never_reserved_for_a_gang() -> None:
    """A gang that needs more than the healthy workers hold waits without keeping the unhealthy
    worker (whose probe is due) from its probe: the single job is placed there."""
    probing = attrs.evolve(_worker(1, 4000), unhealthy=True, probe_due=True)
    workers = [probing, _worker(2, 4000, 3000)]
    settings_ = PlacerSettings(max_reservations=1, reserve_after_s=0.0)
    plan = plan_round(
        _singles(500), workers, settings_, max_rows=100, now=NOW, gangs=_gangs(100, 2, 2000).whole()
    )
    assert [(p.job_id, p.worker_id) for p in plan.placements] == [(1, "w-1")]


def test_a_single_job_of_higher_priority_goes_before_a_gang() -> None:
    """Room for 4000 cpu_millis: a priority 5 job of 2000 is placed, and the priority 0 gang of
    two tasks of 2000 that would have filled the worker waits whole."""
    plan = plan_round(
        _singles(2000, priority=5),
        [_worker(1, 4000)],
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 2, 2000).whole(),
    )
    assert [p.job_id for p in plan.placements] == [1]
    assert {job_id for job_id, reason in plan.reasons if reason.startswith("gang: waiting")} == {100, 101}


def test_a_gang_of_higher_or_equal_priority_goes_before_the_single_jobs() -> None:
    for single in (0, 5):
        plan = plan_round(
            _singles(2000, priority=single),
            [_worker(1, 4000)],
            PlacerSettings(),
            max_rows=100,
            now=NOW,
            gangs=_gangs(100, 2, 2000, priority=5).whole(),
        )
        assert sorted(p.job_id for p in plan.placements) == [100, 101]


def test_a_gang_after_the_single_jobs_gets_what_they_leave() -> None:
    """A priority 0 gang behind a priority 5 job is placed on the room the job left."""
    plan = plan_round(
        _singles(1000, priority=5),
        [_worker(1, 4000)],
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 3, 1000).whole(),
    )
    assert sorted(p.job_id for p in plan.placements) == [1, 100, 101, 102]


def test_a_gang_over_its_accounts_quota_waits_saying_so_and_counts_once_placed() -> None:
    """alice may hold 4000 cpu_millis and holds 1000: her gang of 4 x 1000 waits with the
    quota's reason; a gang of 3 x 1000 is placed, and then her single job waits for the quota."""
    quotas = {"alice": AccountQuota(cpu_millis=4000, used_cpu_millis=1000)}
    workers = [_worker(1, 16000)]
    big = plan_round(
        _singles(),
        workers,
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        quotas=quotas,
        gangs=_gangs(100, 4, 1000, owner="alice").whole(),
    )
    assert not big.placements
    assert dict(big.reasons)[100] == "quota: alice uses 1000 of 4000 cpu_millis"
    fits = plan_round(
        _singles(500, owner="alice"),
        workers,
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        quotas=quotas,
        gangs=_gangs(100, 3, 1000, owner="alice").whole(),
    )
    assert sorted(p.job_id for p in fits.placements) == [100, 101, 102]
    assert dict(fits.reasons)[1].startswith("quota: alice uses 4000 of 4000 cpu_millis")


def test_with_fair_share_the_gang_of_the_account_furthest_below_its_share_goes_first() -> None:
    """alice holds half the cluster, bob nothing: room for one of their two gangs, and bob's (the
    later id) is placed; alone by id, alice's would have been."""
    shares = {"alice": AccountShare(used_cpu_millis=8000), "bob": AccountShare()}
    gangs = GangQueue()
    for gang_id, owner in ((100, "alice"), (200, "bob")):
        gangs.add(
            [
                (
                    PendingJob(job_id=gang_id + rank, cpu_millis=2000, memory_mb=64, owner=owner),
                    GangTask(gang_id=gang_id, rank=rank, size=2),
                    "",
                )
                for rank in range(2)
            ],
            now=0.0,
            not_before={},
        )
    workers = [_worker(1, 16000, 12000)]
    fair = plan_round(
        _singles(), workers, PlacerSettings(), max_rows=100, now=NOW, gangs=gangs.whole(), shares=shares
    )
    assert sorted(p.job_id for p in fair.placements) == [200, 201]
    by_id = plan_round(_singles(), workers, PlacerSettings(), max_rows=100, now=NOW, gangs=gangs.whole())
    assert sorted(p.job_id for p in by_id.placements) == [100, 101]


def _gpu_worker(index: int, units: int) -> LiveWorker:
    worker = _worker(index, 16000)
    offered = tuple(str(u) for u in range(units))
    return attrs.evolve(worker, room=attrs.evolve(worker.room, resources={"gpu": offered}))


def test_a_gangs_units_go_into_its_placements_and_no_single_job_takes_them() -> None:
    """A gang of 2 asking 2 gpu on a worker with 4 gets units 0,1 and 2,3 in its placements; a
    single job asking 1 gpu after it waits, for none is left."""
    plan = plan_round(
        _singles(1000, gpu=1),
        [_gpu_worker(1, 4)],
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 2, 1000, gpu=2).whole(),
    )
    assert [(p.job_id, p.units) for p in plan.placements] == [
        (100, (("gpu", ("0", "1")),)),
        (101, (("gpu", ("2", "3")),)),
    ]


def test_a_gang_placed_after_the_single_jobs_gets_only_the_units_they_left() -> None:
    """A priority 5 job takes gpu 0,1 of a worker with 4; the priority 0 gang of 2 tasks asking
    1 gpu, placed after it, gets 2 and 3."""
    plan = plan_round(
        _singles(1000, priority=5, gpu=2),
        [_gpu_worker(1, 4)],
        PlacerSettings(),
        max_rows=100,
        now=NOW,
        gangs=_gangs(100, 2, 1000, gpu=1).whole(),
    )
    assert sorted((p.job_id, p.units) for p in plan.placements) == [
        (1, (("gpu", ("0", "1")),)),
        (100, (("gpu", ("2",)),)),
        (101, (("gpu", ("3",)),)),
    ]


def test_a_high_priority_job_that_can_never_run_does_not_send_gangs_behind_the_queue() -> None:
    """A priority 9 job stored as unschedulable is not a job the gang waits behind: the gang of
    two goes first and the priority 0 single job, which would have taken its room, waits."""
    queue = PendingQueue()
    queue.replace(
        [
            PendingJob(job_id=1, cpu_millis=64000, memory_mb=64, priority=9),
            PendingJob(job_id=2, cpu_millis=2000, memory_mb=64),
        ],
        reasons={1: "unschedulable: needs 64000 cpu_millis, no live worker has it"},
    )
    plan = plan_round(
        queue, [_worker(1, 4000)], PlacerSettings(), max_rows=100, now=NOW, gangs=_gangs(100, 2, 2000).whole()
    )
    assert sorted(p.job_id for p in plan.placements) == [100, 101]
