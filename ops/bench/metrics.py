"""What the benchmarks read from outside the processes: their /metrics and their CPU time."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Sequence
from typing import Any

import attrs
import psutil
from prometheus_client.parser import text_string_to_metric_families

# -- metrics --------------------------------------------------------------------------------


def fetch_text(address: str) -> str:
    """The /metrics text at ``address`` (host:port).

    Raises:
        OSError: it did not answer within 5 s (``urllib.error.URLError`` among others).
    """
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def samples(text: str) -> list[Any]:
    """Every sample of every family of a /metrics ``text``."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def total(found: Sequence[Any], name: str) -> float:
    """Sum of every series of ``name`` (whatever its labels)."""
    return sum(s.value for s in found if s.name == name)


def _buckets(found: Sequence[Any], name: str) -> dict[float, float]:
    """Cumulative counts of histogram ``name`` by upper bound, summed over its series."""
    counts: dict[float, float] = {}
    for s in found:
        if s.name == f"{name}_bucket":
            upper = float(s.labels["le"])
            counts[upper] = counts.get(upper, 0.0) + s.value
    return counts


@attrs.frozen
class Scraped:
    """What one /metrics endpoint said that the bench reads."""

    heartbeats: float
    rounds: dict[float, float]
    round_trips: dict[float, float]
    agent_failures: float
    gc_pauses: dict[float, float] = attrs.field(factory=dict)


def scrape_endpoint(address: str) -> Scraped | None:
    """The figures of the /metrics at ``address`` (host:port); None when it does not answer (a
    fleet that was killed)."""
    try:
        found = samples(fetch_text(address))
    except OSError:
        return None
    return Scraped(
        heartbeats=total(found, "stockade_heartbeats_recorded_total"),
        rounds=_buckets(found, "stockade_placer_round_seconds"),
        round_trips=_buckets(found, "stockade_agent_heartbeat_round_trip_seconds"),
        agent_failures=total(found, "stockade_agent_heartbeat_failures_total"),
        gc_pauses=_buckets(found, "stockade_gc_pause_seconds"),
    )


def read_metrics(addresses: Sequence[str]) -> dict[str, Scraped]:
    """Address -> its figures, for every endpoint of ``addresses`` that answers."""
    return {a: found for a in addresses if (found := scrape_endpoint(a)) is not None}


@attrs.frozen
class MetricsDelta:
    """What happened between two :func:`read_metrics`, summed over the endpoints that answered
    both times."""

    heartbeats: float
    rounds: list[tuple[float, float]]
    round_trips: list[tuple[float, float]]
    agent_failures: float
    gc_pauses: list[tuple[float, float]] = attrs.field(factory=list)
    """The control planes' (and agents') garbage-collection pauses, cumulative buckets."""

    @classmethod
    def of(cls, before: dict[str, Scraped], after: dict[str, Scraped]) -> MetricsDelta:
        common = [a for a in after if a in before]

        def buckets(name: str) -> list[tuple[float, float]]:
            summed: dict[float, float] = {}
            for address in common:
                for upper, count in bucket_delta(
                    getattr(before[address], name), getattr(after[address], name)
                ):
                    summed[upper] = summed.get(upper, 0.0) + count
            return sorted(summed.items())

        return cls(
            heartbeats=sum(after[a].heartbeats - before[a].heartbeats for a in common),
            rounds=buckets("rounds"),
            round_trips=buckets("round_trips"),
            agent_failures=sum(after[a].agent_failures - before[a].agent_failures for a in common),
            gc_pauses=buckets("gc_pauses"),
        )

    def gc_pauses_over(self, seconds: float) -> int:
        """Collections that held their process longer than ``seconds`` (a bucket bound)."""
        counts = dict(self.gc_pauses)
        return int(counts.get(math.inf, 0.0) - counts.get(seconds, 0.0))


def bucket_delta(before: dict[float, float], after: dict[float, float]) -> list[tuple[float, float]]:
    """The cumulative (upper bound, count) buckets of what happened between two snapshots."""
    return sorted((upper, count - before.get(upper, 0.0)) for upper, count in after.items())


def per_1000(amount: float | None, heartbeats: float) -> float | None:
    """``amount`` per 1,000 heartbeats (None when there were none)."""
    if amount is None or heartbeats <= 0:
        return None
    return round(amount * 1000 / heartbeats, 4)


# -- CPU ------------------------------------------------------------------------------------


def cpu_seconds(pids: Sequence[int], *, with_children: bool = False) -> dict[int, float]:
    """pid -> user + system CPU seconds of each live process of ``pids`` (and, with
    ``with_children``, of their descendants: PostgreSQL's backends)."""
    found: dict[int, float] = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            family = [process, *(process.children(recursive=True) if with_children else [])]
        except psutil.Error:
            continue
        for member in family:
            try:
                times = member.cpu_times()
            except psutil.Error:
                continue
            found[member.pid] = times.user + times.system
    return found


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two :func:`cpu_seconds` readings (a process that started in
    between counts whole; one that ended in between is lost)."""
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())
