"""The agent's fence deadline: when it is, how it moves, and how the reapers learn it.

The deadline is the send time of the newest acknowledged heartbeat (or registration) plus the
self-fence span in force, published to ``<work_dir>/fence_deadline`` for the reapers before the
agent's own copy moves (docs/design.md, "The agent's loops"). :class:`FenceClock` holds that
state for one agent. All timing uses trio's clock; :func:`monotonic_of` and :func:`trio_time_of`
convert at the edge, exactly outside tests (trio's system clock is ``CLOCK_MONOTONIC``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from agent.deadman import write_fence_deadline
from runtime.settings.agent import AgentSettings

MAX_PAUSES = 64
"""Pauses a :class:`FenceClock` remembers (for sleep jobs' durations)."""

FENCE_DEADLINE_FILE = "fence_deadline"
"""The fence-deadline file in the work folder (see :mod:`agent.reaper`)."""


def monotonic_of(trio_time: float) -> float:
    """``trio_time`` (trio's clock) as a ``time.monotonic()`` time."""
    return time.monotonic() + (trio_time - trio.current_time())


def trio_time_of(monotonic_s: float) -> float:
    """A ``time.monotonic()`` time (another process's, such as the fence-deadline file's) in
    trio's clock."""
    return trio.current_time() + (monotonic_s - time.monotonic())


def fence_after_s(
    settings: AgentSettings, dead_after_s: float | None, interval_s: float | None = None
) -> float:
    """The self-fence deadline to use, in seconds.

    Invariant 7: a cut-off worker stops its jobs before the cluster may place them elsewhere.
    The agent fences ``self_fence_after_s`` after the send time of its last acknowledged
    heartbeat and takes up to ``stop_grace_s`` to stop a job; the control planes declare it dead
    ``dead_after_s`` after the last heartbeat they recorded, which was sent no earlier. So
    ``self_fence_after_s + stop_grace_s + self_fence_margin_s`` must not exceed
    ``dead_after_s``; when it would, the deadline is lowered to fit (never below
    ``min_self_fence_s``). Unknown ``dead_after_s`` keeps the setting.

    A told heartbeat interval ``interval_s`` longer than the agent's own stretches
    ``self_fence_after_s`` in proportion, within the same limit (docs/design.md, "Heartbeat
    interval").
    """
    wanted = settings.self_fence_after_s
    if interval_s is not None and interval_s > settings.heartbeat_interval_s:
        wanted *= interval_s / settings.heartbeat_interval_s
    if dead_after_s is None:
        return settings.self_fence_after_s
    limit = dead_after_s - settings.stop_grace_s - settings.self_fence_margin_s
    return max(settings.min_self_fence_s, min(wanted, limit))


def told_refusal(settings: AgentSettings, interval_s: float, dead_after_s: float | None) -> str | None:
    """Why the agent refuses a told heartbeat interval ``interval_s`` (seconds) that would go
    with ``dead_after_s`` (seconds; None: none known), or None when it takes it: the interval
    must be a number within ``heartbeat_interval_min_s`` .. ``heartbeat_interval_max_s``, and
    the self-fence span it gives with that dead_after (:func:`fence_after_s`) longer than the
    interval, so that a heartbeat can be answered before the worker fences.
    """
    if not (math.isfinite(interval_s) and interval_s > 0):
        return f"heartbeat interval must be > 0 s, got {interval_s:g}"
    low, high = settings.heartbeat_interval_min_s, settings.heartbeat_interval_max_s
    if not low <= interval_s <= high:
        return (
            f"heartbeat interval {interval_s:g} s is outside heartbeat_interval_min_s = {low:g}"
            f" .. heartbeat_interval_max_s = {high:g}"
        )
    if dead_after_s is None:
        return None
    fence_s = fence_after_s(settings, dead_after_s, interval_s)
    if fence_s <= interval_s:
        return (
            f"the self-fence span it leaves, {fence_s:g} s (dead_after {dead_after_s:g} s - stop_grace_s"
            f" {settings.stop_grace_s:g} s - self_fence_margin_s {settings.self_fence_margin_s:g} s), must"
            f" be longer than the heartbeat interval {interval_s:g} s"
        )
    return None


EARLY_HEARTBEAT_EVERY_INTERVALS = 4.0
"""A heartbeat pulled forward by a moved job's start comes at most once every this many
heartbeat intervals (:func:`early_heartbeat_allowed`)."""

EARLY_HEARTBEAT_GATHER_S = 0.02
"""How long a heartbeat pulled forward waits after the start that called it: the other jobs of
the same assignment start meanwhile and are confirmed by the same heartbeat."""


def patient_deadline_s(span_s: float, failures: int, cap_s: float) -> float:
    """How long a paused worker's heartbeat waits for an answer, in seconds: ``span_s`` doubled
    for each of the ``failures`` calls in a row that no control plane answered, at most
    ``cap_s``, never less than ``span_s``: TCP's retransmission backoff (RFC 6298, 5.5).
    """
    return max(span_s, min(cap_s, span_s * 2.0 ** min(failures, 32)))


def early_heartbeat_allowed(now: float, last_early_at: float, interval_s: float) -> bool:
    """Whether a job placed before that started at ``now`` may pull the worker's next heartbeat
    forward: at most once every :data:`EARLY_HEARTBEAT_EVERY_INTERVALS` intervals since the last
    early one (``last_early_at``). All in seconds, on one clock."""
    return now - last_early_at >= EARLY_HEARTBEAT_EVERY_INTERVALS * interval_s


@attrs.define(eq=False, kw_only=True)
class FenceClock:
    """One agent's fence state: live or not, the deadline, and its publication to the
    fence-deadline file ``path`` (a failed publication is logged to ``logger``)."""

    settings: AgentSettings
    path: Path
    logger: Any
    fence_after_s: float = attrs.field(
        default=attrs.Factory(lambda self: self.settings.self_fence_after_s, takes_self=True)
    )
    """The self-fence span in force: the setting, or less when the control planes'
    dead_after leaves too small a margin (see :func:`fence_after_s`)."""
    last_acked_send_time: float | None = None
    """trio time the newest acknowledged heartbeat or registration was sent; None before the
    first registration."""
    self_fenced: bool = False
    """True from a self-fence (every job stopped) until the next registration."""
    fenced_at: float | None = None
    """While paused or self-fenced: the trio time the jobs count as stopped at (the fence
    deadline, or the pause itself when that came first)."""
    paused: bool = False
    """True from the fence deadline until a fresh acknowledged heartbeat resumes the jobs, or
    the kill deadline fences the worker."""
    live: trio.Event = attrs.field(factory=trio.Event)
    """Set while registered and neither paused nor fenced; replaced by a fresh one when that
    ends."""
    pauses: list[list[float | None]] = attrs.field(factory=list)
    """This life's pauses, oldest first, each ``[from, until]`` in trio time (``until`` None
    while it lasts): what sleep jobs do not count (the newest :data:`MAX_PAUSES` are kept)."""
    changed: trio.Event = attrs.field(factory=trio.Event)
    """Set (and replaced by a fresh one) whenever the jobs pause, resume or are fenced: what
    the agent's own timers (sleep jobs) wait on."""

    def deadline(self) -> float | None:
        """The fence deadline in trio time; None before the first registration."""
        if self.last_acked_send_time is None:
            return None
        return self.last_acked_send_time + self.fence_after_s

    def outage_grace_s(self) -> float:
        """How long after the send time of the last acknowledged heartbeat paused jobs are
        killed, in seconds: ``db_outage_grace_s``, never less than the fence span (0: killed
        at the fence deadline, no pause)."""
        return max(self.settings.db_outage_grace_s, self.fence_after_s)

    def kill_deadline(self) -> float | None:
        """The trio time paused jobs are killed at; None before the first registration."""
        if self.last_acked_send_time is None:
            return None
        return self.last_acked_send_time + self.outage_grace_s()

    def _missed_deadline(self) -> float | None:
        """The fence deadline while live with it passed (the agent has not noticed yet, or is
        about to); otherwise None."""
        deadline = self.deadline()
        # >= rather than >: sleep_until(deadline) wakes exactly at the deadline on a mock
        # clock, and a strict test there would spin without time moving on.
        if self.live.is_set() and deadline is not None and trio.current_time() >= deadline:
            return deadline
        return None

    def due(self) -> bool:
        """True when live and the fence deadline has passed."""
        return self._missed_deadline() is not None

    def kill_due(self) -> bool:
        """True when paused, or live with the fence deadline passed, and the kill deadline has
        passed too."""
        kill_at = self.kill_deadline()
        return (self.paused or self.live.is_set()) and kill_at is not None and trio.current_time() >= kill_at

    def paused_since(self) -> float | None:
        """The trio time the jobs count as paused from: while paused, :attr:`fenced_at`; while
        live with the fence deadline passed (not noticed yet), that deadline; otherwise None."""
        if self.paused or self.self_fenced:
            return self.fenced_at
        return self._missed_deadline()

    def paused_s_between(self, start: float, end: float) -> float:
        """Seconds of pause between trio times ``start`` and ``end``: the recorded pauses, and the
        time since a passed fence deadline not noticed yet."""
        now = trio.current_time()
        total = 0.0
        spans: list[tuple[float, float]] = [
            (float(a), now if b is None else float(b)) for a, b in self.pauses if a is not None
        ]
        missed = self._missed_deadline()
        if missed is not None:
            spans.append((missed, now))
        for a, b in spans:
            total += max(0.0, min(b, end) - max(a, start))
        return total

    def pause_from(self, now: float) -> float:
        """Record a pause noticed at trio time ``now``, counted from the fence deadline (or
        from ``now``, when that came first), and return that time (:attr:`fenced_at`)."""
        deadline = self.deadline()
        self.fenced_at = now if deadline is None else min(now, deadline)
        self.pauses.append([self.fenced_at, None])
        del self.pauses[:-MAX_PAUSES]
        return self.fenced_at

    def pause_ended(self, at: float) -> None:
        """Record the end of the current pause at trio time ``at``."""
        if self.pauses and self.pauses[-1][1] is None:
            self.pauses[-1][1] = at

    def signal_change(self) -> None:
        """Wake whoever waits on :attr:`changed`, and arm a fresh one."""
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def leave_live(self) -> None:
        """No longer live: the fence watcher parks until the next registration."""
        if self.live.is_set():
            self.live = trio.Event()

    def call_deadline_s(self, failures: int = 0) -> float:
        """How long the next heartbeat or registration may wait for an answer, in seconds.

        While live: until ``call_deadline_margin_s`` before the fence deadline. Otherwise the
        self-fence span minus the margin, stretched by :func:`patient_deadline_s` after
        ``failures`` unanswered calls in a row. Never less than ``heartbeat_timeout_s``.
        """
        deadline = self.deadline()
        if self.live.is_set() and deadline is not None:
            left_s = deadline - trio.current_time() - self.settings.call_deadline_margin_s
        else:
            left_s = patient_deadline_s(
                self.fence_after_s - self.settings.call_deadline_margin_s,
                failures,
                self.settings.register_timeout_s,
            )
        return max(self.settings.heartbeat_timeout_s, left_s)

    def register_deadline_s(self) -> float:
        """How long a new registration may wait for an answer, in seconds: a new incarnation
        holds no job, so until ``call_deadline_margin_s`` before the kill deadline such an answer
        sets, at most ``register_timeout_s``, never less than :meth:`call_deadline_s`."""
        left_s = self.outage_grace_s() - self.settings.call_deadline_margin_s
        return max(self.call_deadline_s(), min(self.settings.register_timeout_s, left_s))

    def publish(self, deadline: float) -> None:
        """Write ``deadline`` (trio time) for the reapers, atomically, as ``time.monotonic()`` s,
        with the kill deadline that goes with it (``db_outage_grace_s - fence_after_s`` later).

        Called *before* the agent's own deadline moves, with no checkpoint until it does, so an
        agent frozen in between holds a deadline no later than the reapers'. A failed write is
        logged, not raised: the reapers keep the previous deadline (fail safe).
        """
        try:
            grace_s = self.outage_grace_s() - self.fence_after_s
            write_fence_deadline(self.path, monotonic_of(deadline), monotonic_of(deadline + grace_s))
        except OSError as exc:
            self.logger.error(
                "cannot write the fence deadline: command jobs will be killed at the previous one",
                path=str(self.path),
                error=repr(exc),
            )

    def registered(self, sent_at: float, *, new_incarnation: bool) -> None:
        """A registration sent at ``sent_at`` was answered: publish its deadline (before any job
        of this life can start; the reapers resume paused jobs on it), count from it, and end
        any pause or self-fence. A ``new_incarnation`` also forgets the pauses: every job of the
        previous life has ended. Not live yet: the caller sets :attr:`live` once it is."""
        self.publish(sent_at + self.fence_after_s)
        self.last_acked_send_time = sent_at
        self.self_fenced = False
        self.paused = False
        self.fenced_at = None
        if new_incarnation:
            self.pauses.clear()

    def acknowledged(self, sent_at: float, *, resuming: bool = False) -> None:
        """A heartbeat sent at ``sent_at`` was answered: move the deadline (published first,
        while live, or when ``resuming`` paused jobs) unless a later send was answered
        already. While paused (not ``resuming``) nothing moves: the reapers' kill deadline
        and the agent's stay the same."""
        if self.paused and not resuming:
            return
        if self.last_acked_send_time is None or sent_at > self.last_acked_send_time:
            if self.live.is_set() or resuming:
                self.publish(sent_at + self.fence_after_s)
            self.last_acked_send_time = sent_at
