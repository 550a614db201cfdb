"""Fair share between accounts in a placer round (docs/fair-share.md): the order in which a
round considers the pending jobs of several accounts, by weighted Dominant Resource Fairness
(Ghodsi et al., "Dominant Resource Fairness: Fair Allocation of Multiple Resource Types", NSDI
2011) with each account's decayed past use added (as Slurm's fair-share factor decays usage with
a half-life: PriorityDecayHalfLife).

An account's dominant share is the larger of its cpu_millis over the cluster's and its memory_mb
over the cluster's. DRF's progressive filling gives the next unit of capacity to the account with
the smallest weighted dominant share; :func:`fair_order` does the same for a whole queue at once:
each job's key is its account's weighted dominant share once it and the account's jobs before it
(in queue order) were placed, plus the account's decayed past share, and the round takes jobs in
key order within each priority (priority first: a job of higher priority always goes first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs
import numpy as np


@attrs.frozen(kw_only=True)
class AccountShare:
    """An account as fair share reads it.

    Attributes:
        weight: its fair-share weight (accounts.weight; > 0): twice the weight, twice the share.
        used_cpu_millis, used_memory_mb: what its assigned and running jobs hold now.
        decayed_cpu_millis, decayed_memory_mb: its past allocation, each run weighted by
            2^(-age / half-life) and averaged over the decay (:func:`decayed_allocation`): an
            account that held 4,000 cpu_millis for many half-lives shows 4,000 here.
    """

    weight: float = 1.0
    used_cpu_millis: int = 0
    used_memory_mb: int = 0
    decayed_cpu_millis: float = 0.0
    decayed_memory_mb: float = 0.0


def decayed_allocation(size: float, started_ago_s: float, ended_ago_s: float, half_life_s: float) -> float:
    """One run's part of its account's decayed allocation: ``size`` (cpu_millis or memory_mb)
    held from ``started_ago_s`` to ``ended_ago_s`` seconds ago (0: still running), weighted by
    2^(-age / ``half_life_s``) and divided by the weight of all the past (half-life / ln 2):
    ``size * (2^(-ended_ago/h) - 2^(-started_ago/h))``. What queries.FAIR_SHARE_USAGE sums in SQL.

    Raises:
        ValueError: ``half_life_s`` is not positive, or the run ends before it starts.
    """
    if not half_life_s > 0:
        raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
    if ended_ago_s > started_ago_s:
        raise ValueError(
            f"a run ends after it starts: started {started_ago_s} s ago, ended {ended_ago_s} s ago"
        )
    return size * (2.0 ** (-ended_ago_s / half_life_s) - 2.0 ** (-started_ago_s / half_life_s))


def dominant_share(
    cpu_millis: float, memory_mb: float, total_cpu_millis: float, total_memory_mb: float
) -> float:
    """``max(cpu_millis / total_cpu_millis, memory_mb / total_memory_mb)``; 0 for a resource the
    cluster has none of."""
    cpu = cpu_millis / total_cpu_millis if total_cpu_millis > 0 else 0.0
    mem = memory_mb / total_memory_mb if total_memory_mb > 0 else 0.0
    return max(cpu, mem)


def fair_order(
    *,
    owner: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    prio: np.ndarray,
    candidate: np.ndarray,
    owners: Sequence[str],
    shares: Mapping[str, AccountShare],
    total_cpu_millis: float,
    total_memory_mb: float,
) -> np.ndarray | None:
    """The order in which a round considers a queue's jobs, as positions into it (int64), or
    None for the queue's own order (fewer than two accounts among the candidates, or no capacity).

    The candidates (``candidate``: jobs the round may place: eligible, holdable, within their
    caps) come first, by priority (high first), then by key (low first), then queue position;
    the others follow in queue order. A job's key is (the dominant share of its account's use,
    ``shares[...].used_*``, plus its own size and that of its account's candidates before it in
    the queue; plus the account's decayed past share) over the account's weight. An account
    absent from ``shares`` has weight 1 and no use.

    Args:
        owner, cpu, mem, prio: each job's account index (into ``owners``), cpu_millis,
            memory_mb and priority, in queue order (equal lengths).
        total_cpu_millis, total_memory_mb: the live workers' capacity.
    """
    at = np.flatnonzero(candidate)
    if at.size < 2 or not (total_cpu_millis > 0 or total_memory_mb > 0):
        return None
    accounts = owner[at]
    if accounts.min() == accounts.max():
        return None
    n = len(owners)
    weight = np.ones(n)
    used_cpu, used_mem = np.zeros(n), np.zeros(n)
    past = np.zeros(n)
    for k, name in enumerate(owners):
        share = shares.get(name)
        if share is None:
            continue
        weight[k] = share.weight
        used_cpu[k], used_mem[k] = share.used_cpu_millis, share.used_memory_mb
        past[k] = dominant_share(
            share.decayed_cpu_millis, share.decayed_memory_mb, total_cpu_millis, total_memory_mb
        )
    inv_cpu = 1.0 / total_cpu_millis if total_cpu_millis > 0 else 0.0
    inv_mem = 1.0 / total_memory_mb if total_memory_mb > 0 else 0.0
    # Each candidate's running total within its account, in queue order (a stable sort by
    # account keeps the queue order inside each).
    by_account = np.argsort(accounts, kind="stable")
    grouped = accounts[by_account]
    cum_cpu = np.cumsum(cpu[at][by_account], dtype=np.float64)
    cum_mem = np.cumsum(mem[at][by_account], dtype=np.float64)
    first = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    lengths = np.diff(np.r_[first, grouped.size])
    before_cpu = np.repeat(np.r_[0.0, cum_cpu][first], lengths)
    before_mem = np.repeat(np.r_[0.0, cum_mem][first], lengths)
    share = np.maximum(
        (used_cpu[grouped] + cum_cpu - before_cpu) * inv_cpu,
        (used_mem[grouped] + cum_mem - before_mem) * inv_mem,
    )
    key = np.empty(at.size)
    key[by_account] = (share + past[grouped]) / weight[grouped]
    # Stable sorts: equal keys keep queue order. One priority (the common case): one key.
    prios = prio[at]
    if prios.min() == prios.max():
        ranked = at[np.argsort(key, kind="stable")]
    else:
        ranked = at[np.lexsort((key, -prios))]
    return np.concatenate([ranked, np.flatnonzero(~candidate)])


def fair_shares(active: Mapping[str, float]) -> dict[str, float]:
    """Each active account's fair share of the cluster (its weight over the sum of the
    active accounts' weights), by name: what weighted DRF gives each when all compete.

    Raises:
        ValueError: a weight that is not positive and finite.
    """
    for name, w in active.items():
        if not (w > 0 and math.isfinite(w)):
            raise ValueError(f"account {name!r}: weight must be positive and finite, got {w!r}")
    total = sum(active.values())
    return {name: w / total for name, w in active.items()}
