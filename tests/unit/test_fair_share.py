"""Fair share in the placer's pure plan (:mod:`actors.fair_share`, docs/fair-share.md): accounts
that compete for a full cluster get capacity by weighted Dominant Resource Fairness with their
decayed past use added; a lone account takes the whole cluster; priority still goes first; best
fit still chooses the worker; a held worker goes to its job alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples
from test_plan_quotas import job, queue_of, worker
from test_plan_round import NOW

from actors.fair_share import AccountShare, decayed_allocation, dominant_share, fair_order, fair_shares
from actors.pending_queue import PendingJob
from actors.placer_store import LiveWorker
from actors.round_plan import RoundPlan, plan_round
from runtime.settings.leader import PlacerSettings

SETTINGS = PlacerSettings(policy="best_fit", max_reservations=0)


def plan(
    jobs: list[PendingJob],
    workers: list[LiveWorker],
    shares: dict[str, AccountShare] | None,
    held: dict[str, int] | None = None,
) -> RoundPlan:
    return plan_round(queue_of(*jobs), workers, SETTINGS, max_rows=100_000, now=NOW, shares=shares, held=held)


def placed_by_owner(result: RoundPlan, jobs: list[PendingJob]) -> Counter[str]:
    owner = {j.job_id: j.owner for j in jobs}
    return Counter(owner[p.job_id] for p in result.placements)


def test_two_accounts_weighted_one_to_three_fill_an_empty_cluster_one_to_three() -> None:
    """alice (weight 1) submitted 400 jobs before bob (weight 3) submitted his 400: a cluster of
    100 such jobs' room goes 25 to alice and 75 to bob, not to alice's first 100."""
    jobs = [job(n, "alice") for n in range(1, 401)] + [job(n, "bob") for n in range(401, 801)]
    workers = [worker(f"w-{k}", cpu_millis=10_000, memory_mb=65536) for k in range(10)]
    shares = {"bob": AccountShare(weight=3.0)}
    got = placed_by_owner(plan(jobs, workers, shares), jobs)
    assert got == {"alice": 25, "bob": 75}


def test_without_fair_share_the_queue_order_decides() -> None:
    jobs = [job(n, "alice") for n in range(1, 401)] + [job(n, "bob") for n in range(401, 801)]
    workers = [worker(f"w-{k}", cpu_millis=10_000, memory_mb=65536) for k in range(10)]
    assert placed_by_owner(plan(jobs, workers, None), jobs) == {"alice": 100}


def test_a_lone_account_takes_the_whole_cluster_whatever_its_weight() -> None:
    jobs = [job(n, "alice") for n in range(1, 401)]
    workers = [worker(f"w-{k}", cpu_millis=10_000, memory_mb=65536) for k in range(10)]
    shares = {"alice": AccountShare(weight=0.01), "bob": AccountShare(weight=100.0, used_cpu_millis=0)}
    assert placed_by_owner(plan(jobs, workers, shares), jobs) == {"alice": 100}


def test_what_an_account_holds_already_counts_against_it() -> None:
    """Equal weights; alice's running jobs already hold 60 of the 100 cpu units: of the 40 free,
    bob gets every one until he holds as much as she does (40 < 60)."""
    jobs = [job(n, "alice") for n in range(1, 101)] + [job(n, "bob") for n in range(101, 201)]
    workers = [worker(f"w-{k}", cpu_millis=10_000, memory_mb=65536, used_cpu=6_000) for k in range(10)]
    shares = {"alice": AccountShare(used_cpu_millis=60_000, used_memory_mb=60 * 1024)}
    assert placed_by_owner(plan(jobs, workers, shares), jobs) == {"bob": 40}


def test_decayed_past_use_counts_against_an_account() -> None:
    """Equal weights, nothing running: alice used the whole cluster until a half-life ago
    (decayed past use of half the cluster), bob nothing: bob goes first, then they alternate."""
    jobs = [job(n, "alice") for n in range(1, 101)] + [job(n, "bob") for n in range(101, 201)]
    workers = [worker(f"w-{k}", cpu_millis=10_000, memory_mb=65536) for k in range(10)]
    past = decayed_allocation(100_000, started_ago_s=1e9, ended_ago_s=3600, half_life_s=3600)
    assert past == pytest.approx(50_000)
    shares = {"alice": AccountShare(decayed_cpu_millis=past)}
    got = placed_by_owner(plan(jobs, workers, shares), jobs)
    # bob's key reaches alice's past share (0.5) after 50 jobs; then each takes one in turn.
    assert got == {"bob": 75, "alice": 25}


def test_the_dominant_resource_is_what_counts() -> None:
    """DRF's example (Ghodsi et al., section 4): 9 CPUs and 18 GB; A's tasks <1 CPU, 4 GB>, B's
    <3 CPU, 1 GB>; A's dominant resource is memory, B's CPU: A gets 3 tasks, B 2."""
    jobs = [job(n, "A", cpu_millis=1000, memory_mb=4096) for n in range(1, 11)] + [
        job(n, "B", cpu_millis=3000, memory_mb=1024) for n in range(11, 21)
    ]
    workers = [worker("w-1", cpu_millis=9000, memory_mb=18 * 1024)]
    assert placed_by_owner(plan(jobs, workers, {}), jobs) == {"A": 3, "B": 2}


def test_priority_goes_before_fair_share() -> None:
    """bob holds nothing and weighs 3, but alice's jobs of priority 5 all go first."""
    jobs = [job(n, "alice", priority=5) for n in range(1, 31)] + [job(n, "bob") for n in range(31, 200)]
    workers = [worker(f"w-{k}", cpu_millis=10_000, memory_mb=65536) for k in range(5)]
    got = placed_by_owner(plan(jobs, workers, {"bob": AccountShare(weight=3.0)}), jobs)
    assert got == {"alice": 30, "bob": 20}


def test_best_fit_still_chooses_the_worker() -> None:
    """Two accounts, one job each: each goes to the worker it fits best (the smaller free room)."""
    jobs = [job(1, "alice", cpu_millis=3000), job(2, "bob", cpu_millis=3000)]
    workers = [worker("w-big", cpu_millis=16_000), worker("w-small", cpu_millis=7_000)]
    result = plan(jobs, workers, {})
    assert {p.job_id: p.worker_id for p in result.placements} == {1: "w-small", 2: "w-small"}


def test_a_held_worker_goes_to_its_job_alone() -> None:
    """w-1 is held for job 9: the jobs before it in the queue are placed elsewhere or not at all,
    and job 9 is placed on w-1 although it comes last."""
    jobs = [job(n, "alice", cpu_millis=2000) for n in range(1, 9)] + [job(9, "bob", cpu_millis=4000)]
    workers = [worker("w-1", cpu_millis=4000), worker("w-2", cpu_millis=6000)]
    for shares in (None, {}):
        result = plan(jobs, workers, shares, held={"w-1": 9})
        placed = {p.job_id: p.worker_id for p in result.placements}
        assert placed[9] == "w-1"
        assert [j for j, w in placed.items() if w == "w-1"] == [9]
        assert sum(1 for w in placed.values() if w == "w-2") == 3


def test_a_held_worker_not_yet_free_takes_nothing_else() -> None:
    """w-1's victims have not ended yet: job 9 does not fit it, and nothing else goes there."""
    jobs = [job(n, "alice", cpu_millis=1000) for n in range(1, 5)] + [job(9, "bob", cpu_millis=4000)]
    workers = [worker("w-1", cpu_millis=4000, used_cpu=2000), worker("w-2", cpu_millis=2000)]
    result = plan(jobs, workers, {}, held={"w-1": 9})
    placed = {p.job_id: p.worker_id for p in result.placements}
    assert 9 not in placed and set(placed.values()) == {"w-2"} and len(placed) == 2


def test_fair_order_leaves_one_account_in_queue_order() -> None:
    n = 5
    args = {
        "owner": np.zeros(n, dtype=np.int64),
        "cpu": np.full(n, 100, dtype=np.int64),
        "mem": np.full(n, 10, dtype=np.int64),
        "prio": np.zeros(n, dtype=np.int64),
        "candidate": np.ones(n, dtype=bool),
        "owners": ["alice"],
        "shares": {},
        "total_cpu_millis": 1000.0,
        "total_memory_mb": 1000.0,
    }
    assert fair_order(**args) is None  # type: ignore[arg-type]


def test_the_helpers_refuse_what_has_no_meaning() -> None:
    with pytest.raises(ValueError, match="half_life_s must be positive"):
        decayed_allocation(1, 10, 0, 0)
    with pytest.raises(ValueError, match="ends after it starts"):
        decayed_allocation(1, 10, 20, 5)
    with pytest.raises(ValueError, match="weight must be positive"):
        fair_shares({"a": 0.0})
    assert fair_shares({"a": 1.0, "b": 3.0}) == {"a": 0.25, "b": 0.75}
    assert dominant_share(50, 10, 100, 0) == 0.5


@settings(max_examples=examples(60), deadline=None)
@given(
    weights=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    unit=st.sampled_from([1, 2, 3, 4, 6]),
    workers_n=st.integers(1, 6),
)
def test_progressive_filling_gives_each_account_its_weighted_share_within_one_job(
    weights: list[int], unit: int, workers_n: int
) -> None:
    """Accounts with more jobs than fit, all of one size that divides the workers' room, on an
    empty cluster: it is filled, and each account got its last job while its weighted dominant
    share was no larger than any other's would be with one more job (DRF's progressive filling:
    the next job goes to the account of the smallest share)."""
    accounts = [f"a{k}" for k in range(len(weights))]
    size = {a: 1000 * unit for a in accounts}
    jobs: list[PendingJob] = []
    for a in accounts:
        jobs += [job(len(jobs) + 1, a, cpu_millis=size[a], memory_mb=1) for _ in range(200)]
    workers = [worker(f"w-{k}", cpu_millis=12_000, memory_mb=1 << 20) for k in range(workers_n)]
    shares = {a: AccountShare(weight=float(weights[k])) for k, a in enumerate(accounts)}
    got = placed_by_owner(plan(jobs, workers, shares), jobs)
    total = 12_000 * workers_n
    assert sum(got.values()) * 1000 * unit == total  # full: each account has jobs left

    def key(a: str, jobs_n: int) -> float:
        return jobs_n * size[a] / total / shares[a].weight

    for a in accounts:
        for b in accounts:
            # a got its last job while its share was no larger than what b's next would make b's.
            assert got[a] == 0 or key(a, got[a] - 1) <= key(b, got[b] + 1) + 1e-9
