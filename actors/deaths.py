"""Dead workers: which silent workers a pass names dead (:func:`judge_deaths`, rate-limited by
a :class:`TokenBucket`, held on mass silence) and from when silence counts
(:class:`SilenceFloor`). docs/design.md, "The reconciler's pass".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from actors.reconciler_store import HeartbeatAge
from runtime.settings.leader import ReconcilerSettings


def judged_dead_after_s(age: HeartbeatAge, dead_after_s: float) -> float:
    """The dead_after (seconds) ``age``'s worker is judged by: the larger of the reconciler's
    ``dead_after_s`` and the one its row records (docs/design.md, "Heartbeat interval")."""
    return dead_after_s if age.dead_after_s is None else max(dead_after_s, age.dead_after_s)


def contact_gap_for_s(ages: Iterable[HeartbeatAge], settings: ReconcilerSettings) -> float:
    """How long the leader's reads may be interrupted before silence counts anew (seconds):
    ``contact_gap_s`` scaled by the shortest judged dead_after over ``dead_after_s``, never less
    than ``contact_gap_s`` (docs/design.md, "Outages")."""
    shortest_s = min(
        (judged_dead_after_s(a, settings.dead_after_s) for a in ages), default=settings.dead_after_s
    )
    return settings.contact_gap_s * max(1.0, shortest_s / settings.dead_after_s)


@attrs.frozen
class TokenBucket:
    """Tokens for dead-worker declarations at trio time ``at``: one per declaration, refilled
    at a steady rate up to a burst (Kubernetes' k8s.io/client-go/util/flowcontrol, as the node
    lifecycle controller uses it for ``--node-eviction-rate``)."""

    tokens: float
    at: float

    def refilled(self, now: float, *, rate_per_s: float, burst: int) -> TokenBucket:
        """The bucket at ``now`` (trio seconds), ``rate_per_s`` tokens added per second since
        ``at``, holding at most ``burst``."""
        elapsed = max(0.0, now - self.at)
        return TokenBucket(min(float(burst), self.tokens + elapsed * rate_per_s), max(self.at, now))

    def take(self, count: int) -> TokenBucket:
        """The bucket after ``count`` declarations (never below 0)."""
        return TokenBucket(max(0.0, self.tokens - count), self.at)

    @property
    def whole(self) -> int:
        """Declarations the bucket allows now."""
        return math.floor(self.tokens + 1e-9)


@attrs.frozen(kw_only=True)
class DeathVerdict:
    """What one pass does about silent workers."""

    declare: tuple[tuple[str, int], ...]
    """(worker_id, incarnation) pairs to name dead now, longest silent first."""
    held: tuple[tuple[str, int], ...]
    """Silent past dead_after_s, but not named in this pass."""
    mass_silence: bool
    """Too many workers are silent at once: none is named."""
    alive: int
    """Alive workers (silent ones included)."""
    bucket: TokenBucket
    """The bucket refilled to this pass; charge it with the declarations that committed."""


def judge_deaths(
    ages: Sequence[HeartbeatAge],
    settings: ReconcilerSettings,
    bucket: TokenBucket,
    now: float,
    *,
    hold_on_mass_silence: bool = True,
) -> DeathVerdict:
    """Which silent workers to name dead in this pass.

    A worker is silent past the dead_after it is judged by (:func:`judged_dead_after_s`). None
    is named while more than ``mass_silence_fraction`` of the alive workers, and at least
    ``mass_silence_min_workers``, have been silent for ``suspect_after_s`` at once (the fault is
    more likely the control plane's); otherwise the longest silent, as many as ``bucket`` allows.
    Both rules are Kubernetes' node lifecycle controller's
    (kubernetes.io/docs/concepts/architecture/nodes/#rate-limits-on-eviction). Holding a
    declaration back is always safe: a silent worker fences itself.

    ``ages``: every alive worker incarnation's heartbeat age (database time); ``bucket``: as the
    previous pass left it; ``now``: trio time. With ``hold_on_mass_silence`` False (a mass
    silence lasted ``mass_silence_max_s``) a mass silence is reported but holds nothing back.
    """
    silent = sorted(
        (a for a in ages if a.age_s > judged_dead_after_s(a, settings.dead_after_s)),
        key=lambda a: (-a.age_s, a.worker_id, a.incarnation),
    )
    pairs = tuple((a.worker_id, a.incarnation) for a in silent)
    bucket = bucket.refilled(now, rate_per_s=settings.deaths_per_s, burst=settings.death_burst)
    # A worker judged by a longer dead_after is suspect after as large a share of it.
    share = settings.suspect_s / settings.dead_after_s
    suspects = sum(1 for a in ages if a.age_s > share * judged_dead_after_s(a, settings.dead_after_s))
    mass = suspects >= settings.mass_silence_min_workers
    mass = mass and suspects > settings.mass_silence_fraction * len(ages)
    allowed = 0 if mass and hold_on_mass_silence else min(len(pairs), bucket.whole)
    return DeathVerdict(
        declare=pairs[:allowed], held=pairs[allowed:], mass_silence=mass, alive=len(ages), bucket=bucket
    )


@attrs.define
class SilenceFloor:
    """From when (database time) the leader counts workers' silence, so that an outage is not
    taken for the death of every worker (docs/design.md, "Outages"). The floor moves to the
    database's ``now()`` on the first pass of an epoch, on the first pass after the leader's
    reads were interrupted for more than the contact gap, and when a mass silence ends. Moving
    it only ever delays a declaration, which is safe.
    """

    floor_unix_s: float | None = None
    contact_at: float = -math.inf
    """trio time of the last successful read."""
    epoch: int | None = None
    mass_silence: bool = False
    mass_since: float | None = None
    """trio time the current mass silence began; None while there is none."""

    def mass_silence_for_s(self, mass: bool, now: float) -> float:
        """How long the mass silence seen at trio time ``now`` has lasted (0 when ``mass`` is
        false, or when it begins now)."""
        if not mass:
            self.mass_since = None
            return 0.0
        if self.mass_since is None:
            self.mass_since = now
        return now - self.mass_since

    def read(self, epoch: int, now_unix_s: float, now: float, gap_s: float) -> bool:
        """Account for a successful read at database time ``now_unix_s`` and trio time ``now``
        under ``epoch``; True when the floor moved."""
        moved = epoch != self.epoch or now - self.contact_at > gap_s
        if moved:
            self.floor_unix_s = now_unix_s
            self.epoch = epoch
        self.contact_at = now
        return moved

    def mass_silence_seen(self, mass: bool, now_unix_s: float) -> bool:
        """Account for a pass's verdict; True (and the floor moved) when a mass silence ended."""
        ended = self.mass_silence and not mass
        self.mass_silence = mass
        if ended:
            self.floor_unix_s = now_unix_s
        return ended

    def floored(self, ages: Iterable[HeartbeatAge], now_unix_s: float) -> list[HeartbeatAge]:
        """``ages`` counted from the floor at the latest."""
        if self.floor_unix_s is None:
            return list(ages)
        most_s = max(0.0, now_unix_s - self.floor_unix_s)
        return [a if a.age_s <= most_s else attrs.evolve(a, age_s=most_s) for a in ages]
