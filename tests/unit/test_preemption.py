"""Preemption's pure decision (actors/preemption.py): which running jobs a pending job of higher
priority stops, and where."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from actors.preemption import Candidate, Running, Shares, plan_preemptions, victim_order

BIG = Shares(cluster_cpu_millis=1_000_000, cluster_memory_mb=1_000_000, used={})
"""A cluster so large that no account is near its fair share (no protection applies)."""


def candidate(
    job_id: int = 100,
    *,
    priority: int = 10,
    cpu: int = 4000,
    memory: int = 4096,
    account: str = "alice",
    workers: tuple[str, ...] = ("w-1",),
) -> Candidate:
    return Candidate(
        job_id=job_id,
        priority=priority,
        cpu_millis=cpu,
        memory_mb=memory,
        account=account,
        worker_ids=workers,
    )


def running(
    assignment_id: int,
    *,
    worker: str = "w-1",
    cpu: int = 1000,
    memory: int = 1024,
    priority: int = 0,
    account: str = "alice",
    started: float = 0.0,
) -> Running:
    return Running(
        assignment_id=assignment_id,
        job_id=assignment_id + 1000,
        worker_id=worker,
        cpu_millis=cpu,
        memory_mb=memory,
        priority=priority,
        account=account,
        started_at_s=started,
    )


def test_takes_lowest_priority_then_youngest_until_it_fits() -> None:
    """On one worker, victims go lowest priority first, then youngest first, and no more than fit."""
    victims = [
        running(1, priority=5, started=1.0),
        running(2, priority=1, started=1.0),
        running(3, priority=1, started=9.0),
        running(4, priority=1, started=5.0),
    ]
    (decision,) = plan_preemptions(
        [candidate(cpu=2000, memory=2048)], {"w-1": (0, 0)}, victims, BIG, max_preemptions=8
    )
    assert decision.worker_id == "w-1"
    assert decision.assignment_ids == (3, 4)


def test_counts_the_free_room() -> None:
    """Free room on the worker lowers what must be stopped."""
    victims = [running(1), running(2), running(3)]
    (decision,) = plan_preemptions(
        [candidate(cpu=2000, memory=2048)], {"w-1": (1000, 1024)}, victims, BIG, max_preemptions=8
    )
    assert len(decision.victims) == 1


def test_chooses_the_worker_needing_the_fewest_victims() -> None:
    """Of two workers, the one where fewer jobs must stop is chosen."""
    victims = [
        running(1, worker="w-1", cpu=1000, memory=1024),
        running(2, worker="w-1", cpu=1000, memory=1024),
        running(3, worker="w-2", cpu=2000, memory=2048),
    ]
    (decision,) = plan_preemptions(
        [candidate(cpu=2000, memory=2048, workers=("w-1", "w-2"))],
        {"w-1": (0, 0), "w-2": (0, 0)},
        victims,
        BIG,
        max_preemptions=8,
    )
    assert (decision.worker_id, decision.assignment_ids) == ("w-2", (3,))


def test_ties_go_to_the_lower_victim_priority() -> None:
    """With as many victims on either worker, the one whose highest victim priority is lower wins."""
    victims = [running(1, worker="w-1", priority=3), running(2, worker="w-2", priority=2)]
    (decision,) = plan_preemptions(
        [candidate(cpu=1000, memory=1024, workers=("w-1", "w-2"))],
        {"w-1": (0, 0), "w-2": (0, 0)},
        victims,
        BIG,
        max_preemptions=8,
    )
    assert decision.worker_id == "w-2"


def test_never_stops_equal_or_higher_priority() -> None:
    """Only running jobs of a lower priority than the candidate's are stopped."""
    victims = [running(1, priority=10), running(2, priority=11)]
    assert (
        plan_preemptions([candidate(cpu=1000, memory=1024)], {"w-1": (0, 0)}, victims, BIG, max_preemptions=8)
        == ()
    )


def test_a_candidate_nothing_makes_room_for_is_skipped() -> None:
    """When all lower-priority work on its workers is not enough, nothing is stopped for it."""
    victims = [running(1, cpu=1000)]
    assert plan_preemptions([candidate(cpu=4000)], {"w-1": (0, 0)}, victims, BIG, max_preemptions=8) == ()


def test_a_victim_is_used_once() -> None:
    """Two candidates never share a victim (nor a worker) in one round."""
    victims = [running(1, worker="w-1", cpu=1000, memory=1024)]
    decisions = plan_preemptions(
        [candidate(100, cpu=1000, memory=1024), candidate(101, cpu=1000, memory=1024)],
        {"w-1": (0, 0)},
        victims,
        BIG,
        max_preemptions=8,
    )
    assert [d.job_id for d in decisions] == [100]


def test_at_most_max_preemptions_candidates() -> None:
    """A round preempts for at most max_preemptions candidates."""
    victims = [running(i, worker=f"w-{i}", cpu=1000, memory=1024) for i in range(5)]
    cands = [candidate(100 + i, cpu=1000, memory=1024, workers=(f"w-{i}",)) for i in range(5)]
    free = {f"w-{i}": (0, 0) for i in range(5)}
    assert len(plan_preemptions(cands, free, victims, BIG, max_preemptions=2)) == 2


def test_another_account_is_not_preempted_below_its_fair_share() -> None:
    """Bob holds half the cluster, his fair share of two accounts: alice's job may not stop his."""
    shares = Shares(
        cluster_cpu_millis=2000, cluster_memory_mb=2048, used={"bob": (1000, 1024), "alice": (1000, 1024)}
    )
    victims = [running(1, account="bob", cpu=1000, memory=1024)]
    assert (
        plan_preemptions(
            [candidate(cpu=1000, memory=1024, account="alice")],
            {"w-1": (0, 0)},
            victims,
            shares,
            max_preemptions=8,
        )
        == ()
    )


def test_another_account_above_its_fair_share_may_be_preempted_down_to_it() -> None:
    """Bob holds the whole cluster: alice's job stops one of his, which leaves him at his share."""
    shares = Shares(
        cluster_cpu_millis=2000,
        cluster_memory_mb=2048,
        used={"bob": (2000, 2048)},
        active=frozenset({"alice"}),
    )
    victims = [running(1, account="bob"), running(2, account="bob", worker="w-1")]
    (decision,) = plan_preemptions(
        [candidate(cpu=1000, memory=1024, account="alice")],
        {"w-1": (0, 0)},
        victims,
        shares,
        max_preemptions=8,
    )
    assert len(decision.victims) == 1


def test_own_account_has_no_protection() -> None:
    """An account's own lower-priority jobs may be stopped whatever its share."""
    shares = Shares(
        cluster_cpu_millis=1000,
        cluster_memory_mb=1024,
        used={"alice": (1000, 1024)},
        active=frozenset({"bob"}),
    )
    victims = [running(1, account="alice")]
    (decision,) = plan_preemptions(
        [candidate(cpu=1000, memory=1024, account="alice")],
        {"w-1": (0, 0)},
        victims,
        shares,
        max_preemptions=8,
    )
    assert decision.assignment_ids == (1,)


def test_weights_set_the_fair_share() -> None:
    """An account of weight 3 beside one of weight 1 has a fair share of 3/4."""
    shares = Shares(
        cluster_cpu_millis=1,
        cluster_memory_mb=1,
        used={"a": (1, 1)},
        weights={"a": 3.0},
        active=frozenset({"b"}),
    )
    assert shares.fair_share("a") == pytest.approx(0.75)


def test_negative_max_preemptions_is_refused() -> None:
    """A negative limit is a caller's bug, named."""
    with pytest.raises(ValueError, match="max_preemptions must be >= 0, got -1"):
        plan_preemptions([], {}, [], BIG, max_preemptions=-1)


_running = st.builds(
    Running,
    assignment_id=st.integers(0, 10_000),
    job_id=st.integers(0, 10_000),
    worker_id=st.sampled_from(["w-1", "w-2", "w-3"]),
    cpu_millis=st.integers(1, 4000),
    memory_mb=st.integers(1, 4096),
    priority=st.integers(0, 5),
    account=st.sampled_from(["alice", "bob", "carol"]),
    started_at_s=st.floats(0, 1000),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    victims=st.lists(_running, max_size=20, unique_by=lambda r: r.assignment_id),
    sizes=st.lists(
        st.tuples(
            st.integers(1, 8000),
            st.integers(1, 8192),
            st.integers(0, 6),
            st.sampled_from(["alice", "bob", "carol"]),
        ),
        max_size=6,
    ),
    free=st.fixed_dictionaries(
        {w: st.tuples(st.integers(0, 2000), st.integers(0, 2048)) for w in ("w-1", "w-2", "w-3")}
    ),
    limit=st.integers(0, 4),
)
def test_decisions_keep_every_rule(
    victims: list[Running],
    sizes: list[tuple[int, int, int, str]],
    free: dict[str, tuple[int, int]],
    limit: int,
) -> None:
    """Whatever the input: each victim is of lower priority, used once, taken in order; each worker
    chosen once; the freed and free room fit the candidate; no other account goes below its fair
    share; at most the limit."""
    cands = [
        Candidate(
            job_id=100 + i,
            priority=prio,
            cpu_millis=cpu,
            memory_mb=mem,
            account=account,
            worker_ids=("w-1", "w-2", "w-3"),
        )
        for i, (cpu, mem, prio, account) in enumerate(sizes)
    ]
    used: dict[str, tuple[int, int]] = {}
    for v in victims:
        cpu, mem = used.get(v.account, (0, 0))
        used[v.account] = (cpu + v.cpu_millis, mem + v.memory_mb)
    shares = Shares(
        cluster_cpu_millis=12_000,
        cluster_memory_mb=12_288,
        used=used,
        active=frozenset(c.account for c in cands),
    )
    decisions = plan_preemptions(cands, free, victims, shares, max_preemptions=limit)
    assert len(decisions) <= limit
    by_id = {c.job_id: c for c in cands}
    seen: set[int] = set()
    workers = [d.worker_id for d in decisions]
    assert len(workers) == len(set(workers))
    after = dict(used)
    for d in decisions:
        c = by_id[d.job_id]
        assert d.victims
        assert list(d.victims) == sorted(d.victims, key=victim_order)
        for v in d.victims:
            assert v.worker_id == d.worker_id and v.priority < c.priority
            assert v.assignment_id not in seen
            seen.add(v.assignment_id)
            cpu, mem = after[v.account]
            after[v.account] = (cpu - v.cpu_millis, mem - v.memory_mb)
            if v.account != c.account:
                assert shares.dominant_share(*after[v.account]) >= shares.fair_share(v.account) - 1e-12
        room_cpu, room_mem = free[d.worker_id]
        assert room_cpu + sum(v.cpu_millis for v in d.victims) >= c.cpu_millis
        assert room_mem + sum(v.memory_mb for v in d.victims) >= c.memory_mb


def test_a_preempted_jobs_reason_stays_until_it_is_placed() -> None:
    """A job a preemption put back to pending keeps its reason ``preempted by job N`` through the
    rounds that cannot place it (no room), where another job's stale reason is cleared."""
    from test_plan_quotas import job, queue_of, worker
    from test_plan_round import NOW

    from actors.round_plan import plan_round
    from runtime.settings.leader import PlacerSettings

    queue = queue_of(job(1, "alice"), job(2, "bob"), reasons={1: "preempted by job 9", 2: "an old reason"})
    full = [worker("w-1", cpu_millis=16000, used_cpu=16000)]
    result = plan_round(queue, full, PlacerSettings(), max_rows=100, now=NOW, shares={})
    assert dict(result.reasons) == {2: ""}
