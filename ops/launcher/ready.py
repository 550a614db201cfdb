"""Waiting for a started cluster: every control plane answers, one leads, every worker is alive;
for as long as the cluster makes progress, within a cap that grows with its workers (:class:`WaitRule`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import attrs
import trio

from ops import rpc
from ops.launcher.state import ClusterConfig, ClusterError, ProcessSpec, StateDir, option_value
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import ClusterBusy, Unavailable
from runtime.text import tail_lines

POLL_INTERVAL_S = 0.2
STATUS_TIMEOUT_S = 1.0
"""Deadline of a readiness status call to a control plane that answered the last one, in s."""
STATUS_TIMEOUT_MAX_S = 8.0
"""The longest deadline of a status call, in s: one not answered in time is given twice as long
at the next poll (500 workers' status from a busy replica takes over a second)."""
CAP_PER_WORKER_S = 1.0
"""How much each worker adds to the overall cap of a wait, in seconds (:class:`WaitRule`)."""
PROGRESS_EVERY_S = 2.0
"""The shortest time between two progress lines, in seconds."""
OVERRUN_GRACE_S = 10.0
"""How long past its cap a wait may run before its caller gives up on it whatever it is doing
(:func:`ops.rpc.with_client`'s ``limit_s``), in seconds."""
FRESH_HEARTBEAT_S = 2.0
"""A worker counts as alive only with a heartbeat younger than this, in seconds, or than two of
its heartbeat intervals where the cluster's workers beat less often."""


def fresh_heartbeat_s(config: ClusterConfig) -> float:
    """``FRESH_HEARTBEAT_S``, or twice the longest ``--heartbeat-interval-s`` of the cluster's
    agents and fleets when that is longer, in seconds."""
    intervals = [
        float(value)
        for spec in config.processes
        if spec.kind in ("agent", "fleet")
        and (value := option_value(spec.args, "--heartbeat-interval-s")) is not None
    ]
    return max([FRESH_HEARTBEAT_S, *(2 * interval for interval in intervals)])


@attrs.frozen(kw_only=True)
class Progress:
    """How far a starting cluster got, as one poll saw it."""

    answered: tuple[str, ...]
    """The ids of the control planes that answered a status call."""
    control_planes: int
    leader: str
    """The leader's id; empty: none elected (or no control plane answered)."""
    registered: int
    """Workers of the cluster that have a row, in any state."""
    live: int
    """Workers alive with a fresh heartbeat (and back, when restarted)."""
    workers: int
    busy: tuple[str, ...] = ()
    """The ids of the control planes that answered 'busy' (alive, shedding load)."""

    def counts(self) -> tuple[int, int, int, int]:
        """(control planes answered, 1 if a leader, workers registered, workers live)."""
        return (len(self.answered), 1 if self.leader else 0, self.registered, self.live)

    def line(self) -> str:
        """One line for the operator, e.g. ``control planes 3/3 answered (leader cp-1), workers
        live 153/500 (registered 480)``."""
        leader = f"leader {self.leader}" if self.leader else "no leader"
        answered = ", ".join(self.answered) or "none"
        busy = f", {len(self.busy)} busy" if self.busy else ""
        return (
            f"control planes {len(self.answered)}/{self.control_planes} answered ({answered}; {leader}"
            f"{busy}), workers live {self.live}/{self.workers} (registered {self.registered})"
        )


@attrs.define
class WaitRule:
    """When a wait for a starting cluster gives up: after ``stall_s`` seconds without progress,
    or ``cap_s`` after ``started_at``, whichever comes first. Pure: the caller passes the time.

    Progress is a new high of any of :meth:`Progress.counts`, so a cluster whose workers churn
    does not hold the wait for ever. While every control plane answers 'busy' (alive, working
    through a load), the time without progress stops running; the cap still ends the wait.
    """

    stall_s: float
    cap_s: float
    started_at: float
    progress_at: float = attrs.field(default=attrs.Factory(lambda self: self.started_at, takes_self=True))
    best: tuple[int, ...] = (0, 0, 0, 0)
    """The highest of each count seen so far."""

    @classmethod
    def for_cluster(cls, *, timeout_s: float, workers: int, now: float) -> WaitRule:
        """The rule of ``stockade up``: give up after ``timeout_s`` without progress, or after
        ``timeout_s`` plus :data:`CAP_PER_WORKER_S` per worker in all."""
        return cls(stall_s=timeout_s, cap_s=timeout_s + CAP_PER_WORKER_S * workers, started_at=now)

    def observe(self, progress: Progress, now: float) -> bool:
        """Record what a poll at ``now`` saw; True when it is progress."""
        if progress.control_planes and len(progress.busy) == progress.control_planes:
            self.progress_at = now  # every replica alive and busy: not a stall
            return False
        counts = progress.counts()
        better = any(new > old for new, old in zip(counts, self.best, strict=True))
        if better:
            self.best = tuple(max(new, old) for new, old in zip(counts, self.best, strict=True))
            self.progress_at = now
        return better

    def deadline(self) -> float:
        """When the wait gives up if nothing improves (trio seconds)."""
        return min(self.progress_at + self.stall_s, self.started_at + self.cap_s)

    def why_give_up(self, now: float) -> str | None:
        """Why the wait gives up at ``now``, or None while it goes on."""
        if now >= self.started_at + self.cap_s:
            return f"gave up {self.cap_s:g} s after it began (the cap for this many workers)"
        if now >= self.progress_at + self.stall_s:
            return f"no progress for {self.stall_s:g} s"
        return None


async def wait_progressing(
    poll_once: Callable[[], Awaitable[tuple[pb.StatusReply | None, list[str], Progress]]],
    rule: WaitRule,
    *,
    check_exited: Callable[[], None] = lambda: None,
    on_progress: Callable[[str], None] | None = None,
) -> tuple[pb.StatusReply | None, list[str], str]:
    """Poll (``await poll_once()``: a status or None, what is missing, how far the cluster got)
    every :data:`POLL_INTERVAL_S` until nothing is missing or ``rule`` gives up (a poll running
    at its deadline is cancelled); ``check_exited`` runs before each poll and may raise.

    Returns:
        the last status, what is still missing (empty: ready) and, when not ready, why the
        wait gave up and how far the cluster got.
    """
    status: pb.StatusReply | None = None
    missing = ["no control plane answered a status call yet"]
    progress: Progress | None = None
    last_line, last_said = "", -math.inf
    while True:
        check_exited()
        with trio.move_on_at(rule.deadline()):
            status, missing, progress = await poll_once()
        now = trio.current_time()
        line = last_line
        if progress is not None:
            rule.observe(progress, now)
            line = progress.line()
            if on_progress is not None and line != last_line and now - last_said >= PROGRESS_EVERY_S:
                on_progress(line)
                last_line, last_said = line, now
        if not missing:
            if on_progress is not None and last_said > -math.inf and line != last_line:
                on_progress(line)  # the last line said is where it got, not a poll before
            return status, [], ""
        why = rule.why_give_up(now)
        if why is not None:
            got = progress.line() if progress is not None else "no status call ended"
            return status, missing, f"{why}; got to: {got}"
        await trio.sleep(POLL_INTERVAL_S)


def wait_ready(
    state: StateDir,
    config: ClusterConfig,
    *,
    restarted: Mapping[str, int],
    timeout_s: float,
    check_exited: Callable[[], None],
    started_at: Mapping[str, float] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> pb.StatusReply:
    """Poll until every control plane answers, one leads, and every worker is alive.

    A worker counts once the status shows it alive with a fresh heartbeat, and, for a worker
    in ``restarted``, once its log has a ``register`` line written since its new process
    started, where ``started_at`` says when, else under a new incarnation: an agent that took
    over its predecessor's jobs keeps its incarnation, and a killed predecessor's heartbeat
    may commit late.

    Args:
        restarted: id -> incarnation before the restart, of the workers just started again.
        timeout_s: how long to wait without progress, in seconds; the whole wait is capped at
            this plus :data:`CAP_PER_WORKER_S` per worker, plus :data:`OVERRUN_GRACE_S` for a
            call that does not end.
        check_exited: called before each poll; raises ClusterError when a process exited.
        started_at: id -> when the restarted worker's process was started (``time.time()``:
            on one machine, the database's clock its log's lines carry).
        on_progress: called with :meth:`Progress.line` when that changed, at most every
            :data:`PROGRESS_EVERY_S`.

    Raises:
        ClusterError: a process exited, or the wait gave up; says why, how far the cluster got,
            what is missing and the log files to read.
        KeyboardInterrupt: Ctrl-C (or SIGTERM) while waiting.
    """
    cap_s = WaitRule.for_cluster(timeout_s=timeout_s, workers=len(config.workers), now=0.0).cap_s

    async def poll(_client: ControlPlaneClient) -> tuple[pb.StatusReply | None, list[str], str]:
        limits = {spec.id: STATUS_TIMEOUT_S for spec in config.control_planes}

        def poll_once() -> Awaitable[tuple[pb.StatusReply | None, list[str], Progress]]:
            return readiness_progress(state, config, restarted, started_at or {}, limits=limits)

        rule = WaitRule.for_cluster(timeout_s=timeout_s, workers=len(config.workers), now=trio.current_time())
        return await wait_progressing(poll_once, rule, check_exited=check_exited, on_progress=on_progress)

    try:
        status, missing, why = rpc.with_client(
            config.control_plane_addresses, poll, tls=config.client_tls, limit_s=cap_s + OVERRUN_GRACE_S
        )
    except rpc.RunOverran as exc:
        raise ClusterError(
            f"cluster not ready after {cap_s:g} s: a status call did not end ({exc}); read "
            + ", ".join(str(state.log_path(p.id)) for p in config.control_planes)
        ) from exc
    if missing or status is None:
        shown = missing or ["no control plane answered"]
        more = f" (and {len(shown) - MISSING_SHOWN} more)" if len(shown) > MISSING_SHOWN else ""
        raise ClusterError(f"cluster not ready: {why}; missing: " + "; ".join(shown[:MISSING_SHOWN]) + more)
    return status


MISSING_SHOWN = 20
"""How many missing things a "not ready" error names."""


async def readiness_progress(
    state: StateDir,
    config: ClusterConfig,
    restarted: Mapping[str, int],
    started_at: Mapping[str, float],
    *,
    limits: dict[str, float] | None = None,
) -> tuple[pb.StatusReply | None, list[str], Progress]:
    """A status (the first control plane's that answered, or None), what is not ready yet (see
    :func:`wait_ready`) and how far the cluster got.

    ``limits`` (control plane id -> the deadline of its status call, in seconds; default
    :data:`STATUS_TIMEOUT_S`) is updated: doubled, up to :data:`STATUS_TIMEOUT_MAX_S`, for one
    that did not answer in time, back to :data:`STATUS_TIMEOUT_S` for one that answered.
    """
    limits = {} if limits is None else limits
    missing: list[str] = []
    answered: list[str] = []
    status: pb.StatusReply | None = None
    replies: dict[str, pb.StatusReply | str] = {}
    busy: list[str] = []

    async def ask(spec: ProcessSpec) -> None:
        limit_s = limits.get(spec.id, STATUS_TIMEOUT_S)
        client = ControlPlaneClient(
            [spec.address], timeout_s=limit_s, busy_retry_s=0.0, tls=config.client_tls
        )
        try:
            with trio.fail_after(limit_s * 2 + 1):  # its own deadline, and one more bound
                replies[spec.id] = await client.call("status", pb.StatusRequest())
            limits[spec.id] = STATUS_TIMEOUT_S
        except (Unavailable, trio.TooSlowError) as exc:
            if isinstance(exc, ClusterBusy):
                busy.append(spec.id)
            limits[spec.id] = min(STATUS_TIMEOUT_MAX_S, limit_s * 2)
            replies[spec.id] = (
                f"{spec.id} did not answer a status call at {spec.address} within "
                f"{limit_s:g} s ({exc or 'no answer'}; read {state.log_path(spec.id)})"
            )
        finally:
            client.close()

    async with trio.open_nursery() as nursery:  # every control plane at once
        for spec in config.control_planes:
            nursery.start_soon(ask, spec)
    for spec in config.control_planes:
        reply = replies[spec.id]
        if isinstance(reply, str):
            missing.append(reply)
            continue
        answered.append(spec.id)
        status = status or reply

    def progress(leader: str = "", registered: int = 0, live: int = 0) -> Progress:
        return Progress(
            answered=tuple(answered), control_planes=len(config.control_planes), leader=leader,
            registered=registered, live=live, workers=len(config.workers), busy=tuple(busy),
        )  # fmt: skip

    if status is None:
        return None, missing, progress()
    if not status.leader:
        logs = ", ".join(str(state.log_path(p.id)) for p in config.control_planes)
        missing.append(f"no leader elected (read {logs})")
    by_id = {w.id: w for w in status.workers}
    fresh_s = fresh_heartbeat_s(config)
    if status.heartbeat_interval_ms:
        # The interval the cluster tells its workers now (docs/design.md, "Heartbeat interval"):
        # 500 workers beat every few seconds, so a fixed 2 s would count most as not live.
        fresh_s = max(fresh_s, 2 * status.heartbeat_interval_ms / 1000)
    registered = live = 0
    for worker_spec in config.workers:
        worker = by_id.get(worker_spec.id)
        log_hint = f"(read {state.log_path(worker_spec.process_id)})"
        if worker is None:
            missing.append(f"{worker_spec.id} not registered {log_hint}")
            continue
        registered += 1
        back = worker_spec.id not in restarted or (
            registered_since(state.work_dir(worker_spec.id) / "agent.jsonl", started_at[worker_spec.id])
            if worker_spec.id in started_at
            else worker.incarnation != restarted[worker_spec.id]
        )
        if worker.state != "alive" or worker.last_heartbeat_age_s > fresh_s or not back:
            missing.append(f"{worker_spec.id} not registered alive yet {log_hint}")
        else:
            live += 1
    return status, missing, progress(status.leader, registered, live)


def registered_since(log_path: Path, since_unix_s: float) -> bool:
    """Whether the worker log ``log_path`` (``agent.jsonl``) has a ``register`` line written at
    or after ``since_unix_s`` (the database's clock, as the lines'), among its last 200 lines."""
    if not log_path.exists():
        return False
    for line in reversed(tail_lines(log_path, max_lines=200).lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "register":
            return float(record.get("time", 0.0)) >= since_unix_s
    return False
