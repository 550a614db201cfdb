"""Waiting for a started cluster: every control plane answers, one leads, every worker is alive.

The wait goes on for as long as the cluster makes progress (:class:`WaitRule`): a large cluster
takes a while to register every worker, and gives up only when nothing has improved for
``timeout_s`` or when a cap that grows with the number of workers has passed.
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
"""How often readiness is asked again, in seconds."""
STATUS_TIMEOUT_S = 1.0
"""Deadline of a readiness status call to a control plane that answered the last one, in
seconds."""
STATUS_TIMEOUT_MAX_S = 8.0
"""The longest deadline of a readiness status call, in seconds: a control plane that did not
answer in time is given twice as long at the next poll, up to this (a status of 500 workers
from a replica busy registering them takes longer than a second, and asking again with the
same short deadline would never see it)."""
CAP_PER_WORKER_S = 1.0
"""How much each worker adds to the overall cap of a wait, in seconds (:class:`WaitRule`)."""
PROGRESS_EVERY_S = 2.0
"""The shortest time between two progress lines, in seconds."""
OVERRUN_GRACE_S = 10.0
"""How long past its cap a wait may run before its caller gives up on it whatever it is doing
(:func:`ops.rpc.with_client`'s ``limit_s``), in seconds: a poll in progress when the cap passes
ends within a few status calls' deadlines."""
FRESH_HEARTBEAT_S = 2.0
"""A worker counts as alive only with a heartbeat younger than this, in seconds, or than two of
its heartbeat intervals where the cluster's workers beat less often (:func:`fresh_heartbeat_s`,
and the interval the cluster tells, which a status answer carries)."""


def fresh_heartbeat_s(config: ClusterConfig) -> float:
    """How young a worker's last heartbeat must be for readiness, in seconds.

    ``FRESH_HEARTBEAT_S``, or twice the longest ``--heartbeat-interval-s`` among the cluster's
    agent and fleet processes when that is longer (a worker beating every 3 s is never seen
    with a heartbeat younger than 2 s for long).
    """
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
    """How many control planes the cluster has."""
    leader: str
    """The leader's id; empty: none elected (or no control plane answered)."""
    registered: int
    """Workers of the cluster that have a row, in any state."""
    live: int
    """Workers alive with a fresh heartbeat (and back, when restarted)."""
    workers: int
    """How many workers the cluster has."""
    busy: tuple[str, ...] = ()
    """The ids of the control planes that answered the status call 'busy' (alive, shedding
    work under load, as in a registration storm)."""

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
    """When a wait for a starting cluster gives up: after ``stall_s`` without progress, or
    ``cap_s`` after it began, whichever comes first.

    Progress is a new high of any of the counts of :meth:`Progress.counts` (control planes
    answering, a leader, workers registered, workers live): a count that falls and rises again
    to where it was is not progress, so a cluster whose workers churn does not hold the wait
    for ever. A poll that every control plane answered 'busy' counts as neither: they are alive
    and working through a load (a large cluster's registrations), so the time without progress
    stops running while they are all busy, and the cap still ends the wait. Pure: the caller
    passes the time (trio seconds).

    Args:
        stall_s: how long without progress before giving up, in seconds.
        cap_s: how long in all before giving up, in seconds.
        started_at: when the wait began.
    """

    stall_s: float
    cap_s: float
    started_at: float
    progress_at: float = attrs.field(default=attrs.Factory(lambda self: self.started_at, takes_self=True))
    """When the last progress was seen."""
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
    every :data:`POLL_INTERVAL_S` until nothing is missing or ``rule`` gives up; a poll still
    running when ``rule``'s deadline comes is cancelled.

    Returns:
        the last status, what is still missing (empty: ready) and, when not ready, why the
        wait gave up and how far the cluster got.

    Raises:
        ClusterError: from ``check_exited``, called before each poll.
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
    in ``restarted`` (id -> incarnation before the restart), once its log has a ``register``
    line written since its new process started, when ``started_at`` says when that was (an
    agent that took over its predecessor's jobs continues its incarnation, and a heartbeat of
    a predecessor killed just before may commit late), else under a new incarnation.

    Args:
        state: the state folder (its logs are named in the error).
        config: the cluster to wait for.
        restarted: id -> incarnation before the restart, of the workers just started again.
        timeout_s: how long to wait without progress, in seconds; the whole wait is capped at
            this plus :data:`CAP_PER_WORKER_S` per worker (:meth:`WaitRule.for_cluster`).
        check_exited: called before each poll; raises ClusterError when a process exited.
        started_at: id -> when the restarted worker's process was started (``time.time()``,
            which on a local cluster's one machine is the database's clock: its log's lines
            carry the database's clock, :mod:`agent.dbclock`).
        on_progress: called with a line saying how far the cluster got (:meth:`Progress.line`)
            when that changed, at most every :data:`PROGRESS_EVERY_S`; None: silent.

    Every wait is bounded: each status call by its control plane's deadline (from
    :data:`STATUS_TIMEOUT_S`, doubled after each call it did not answer in time, up to
    :data:`STATUS_TIMEOUT_MAX_S`), each poll by the wait's deadline, and the whole wait,
    whatever a call does, by its cap plus :data:`OVERRUN_GRACE_S`; the waiting happens in a
    thread of its own, so Ctrl-C and SIGTERM end it at once (:func:`ops.rpc.with_client`,
    ``limit_s``).

    Raises:
        ClusterError: a process exited, or the wait gave up (:class:`WaitRule`); says why, how
            far the cluster got (which control planes answered, how many workers are live of
            how many), what is missing and the log files to read.
        KeyboardInterrupt: Ctrl-C (or SIGTERM, turned into it by the command) while waiting.
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
"""How many missing things a "not ready" error names (a cluster of 500 workers could list 500)."""


async def readiness(
    state: StateDir,
    config: ClusterConfig,
    restarted: Mapping[str, int],
    started_at: Mapping[str, float] | None = None,
) -> tuple[pb.StatusReply | None, list[str]]:
    """A status (the first control plane's that answered, or None) and what is not ready yet
    (see :func:`wait_ready`)."""
    status, missing, _ = await readiness_progress(state, config, restarted, started_at or {})
    return status, missing


async def readiness_progress(
    state: StateDir,
    config: ClusterConfig,
    restarted: Mapping[str, int],
    started_at: Mapping[str, float],
    *,
    limits: dict[str, float] | None = None,
) -> tuple[pb.StatusReply | None, list[str], Progress]:
    """As :func:`readiness`, and how far the cluster got.

    ``limits`` (control plane id -> the deadline of its status call, in seconds; missing ids
    get :data:`STATUS_TIMEOUT_S`) is updated: doubled, up to :data:`STATUS_TIMEOUT_MAX_S`, for
    a control plane that did not answer in time; back to :data:`STATUS_TIMEOUT_S` for one that
    answered.
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
    if status is None:
        nothing = Progress(
            answered=(), control_planes=len(config.control_planes), leader="", registered=0, live=0,
            workers=len(config.workers), busy=tuple(busy),
        )  # fmt: skip
        return None, missing, nothing
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
        if (
            worker.state != "alive"
            or worker.last_heartbeat_age_s > fresh_s
            or (
                worker_spec.id in restarted
                and not _back(
                    worker, restarted[worker_spec.id], _registered(state, worker_spec.id, started_at)
                )
            )
        ):
            missing.append(f"{worker_spec.id} not registered alive yet {log_hint}")
        else:
            live += 1
    progress = Progress(
        answered=tuple(answered),
        control_planes=len(config.control_planes),
        leader=status.leader,
        registered=registered,
        live=live,
        workers=len(config.workers),
        busy=tuple(busy),
    )
    return status, missing, progress


def _registered(state: StateDir, worker_id: str, started_at: Mapping[str, float]) -> bool | None:
    """Whether ``worker_id``'s new process registered since it was started; None when its start
    time is not known."""
    if worker_id not in started_at:
        return None
    return registered_since(state.work_dir(worker_id) / "agent.jsonl", started_at[worker_id])


def _back(worker: pb.WorkerInfo, incarnation_before: int, registered: bool | None) -> bool:
    """Whether a restarted worker's new process is back: ``registered`` (its log has a
    ``register`` line since it was started: a new incarnation, or its predecessor's continued),
    or, where that is not known (None), another incarnation than before
    (``incarnation_before``; 0: unknown, taken as back). Not its row's heartbeat alone: a
    heartbeat its killed predecessor sent may commit after the new process started."""
    if registered is not None:
        return registered
    return worker.incarnation != incarnation_before


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
