"""The faults a cluster suffers, each with one rule for what it did (docs/design.md, "Faults and
their rules"): a leader killed, frozen or stopped (timed to :func:`new_leader`), the busiest
worker killed (timed to :func:`jobs_moved`), a worker cut off, the database restarted. The CLI's
``kill-*``, chaos and the failover benchmark inject them here, on any
:class:`~ops.launcher.driver.ClusterDriver`.
"""

from __future__ import annotations

import functools
import signal
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import psutil
import trio

from ops.config import ClusterError
from ops.launcher.control import LocalCluster
from ops.launcher.docker import DockerCluster
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError
from runtime.text import read_jsonl

if TYPE_CHECKING:
    from ops.launcher.driver import ClusterDriver
    from ops.launcher.state import StateDir
    from ops.netfault import Link
    from runtime.tls import TlsFiles

FAULT_POINT = "ledger.after_epoch_check"
"""Where a leader parks inside an open fenced transaction (the reconciler's dead-worker
declaration, which runs every pass) for :func:`freeze_leader`'s ``fault_dir``."""

ENDED = ("succeeded", "failed", "cancelled")


class FaultError(ClusterError):
    """A fault could not be injected (a process not running, no leader to kill), or what it
    should cause did not show in time; the message says which."""


@attrs.frozen(kw_only=True)
class Failover:
    """One leader failure and the time until a new leader showed in the status."""

    kind: str
    """kill, freeze, freeze_in_transaction or stop."""
    leader: str
    epoch_before: int
    epoch_after: int
    seconds: float


@attrs.frozen(kw_only=True)
class Moved:
    """A killed worker's jobs, all running (or done) elsewhere: :func:`jobs_moved`."""

    seconds: float
    """From the kill to the last start elsewhere (the workers' logs)."""
    jobs: list[pb.JobInfo]


def fault_environment(folder: Path) -> dict[str, str]:
    """Environment that arms the one-shot park at :data:`FAULT_POINT` in ``folder``."""
    return {"STOCKADE_ENABLE_FAULTS": "1", "STOCKADE_FAULTS": f"{FAULT_POINT}=park:{folder}"}


def park_dir(cluster: ClusterDriver, fault_dir: Path, process_id: str) -> Path:
    """Where ``process_id`` parks at the fault point: ``fault_dir`` for processes, a folder of
    its own in it for a container (process ids inside containers are not unique)."""
    return fault_dir / process_id if isinstance(cluster, DockerCluster) else fault_dir


def pid_of(cluster: ClusterDriver, process_id: str) -> int:
    """The machine's pid of ``process_id``.

    Raises:
        FaultError: it does not run.
    """
    process = cluster.live_process(cluster.config().process(process_id))
    if process is None:
        raise FaultError(f"{process_id} is not running")
    return process.pid


async def send(cluster: ClusterDriver, process_id: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to ``process_id`` (a SIGKILL is recorded as a kill); returns the pid.

    Raises:
        FaultError: it does not run.
    """
    try:
        return await trio.to_thread.run_sync(cluster.kill, process_id, sig)
    except ClusterError as exc:
        raise FaultError(str(exc)) from exc


async def wait_gone(pid: int, timeout_s: float) -> None:
    """Return once process ``pid`` has exited (a zombie counts as gone).

    Raises:
        trio.TooSlowError: it still ran after ``timeout_s`` seconds.
    """
    with trio.fail_after(timeout_s):
        while not _gone(pid):  # noqa: ASYNC110 (another process's exit: nothing to wait on)
            await trio.sleep(0.01)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------- leaders


async def leader(client: ControlPlaneClient, *, timeout_s: float) -> tuple[str, int]:
    """The leader and epoch a control plane names, asked every 50 ms.

    Raises:
        FaultError: none named one within ``timeout_s`` seconds.
    """
    status = await _status_until(client, lambda s: bool(s.leader), timeout_s=timeout_s, every_s=0.05)
    if status is None:
        raise FaultError(f"no leader within {timeout_s:g} s")
    return status.leader, status.epoch


async def _status_until(
    client: ControlPlaneClient, accept: Callable[[pb.StatusReply], bool], *, timeout_s: float, every_s: float
) -> pb.StatusReply | None:
    """The first status ``accept`` takes, asked every ``every_s``; None after ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        while True:
            try:
                status = await client.call("status", pb.StatusRequest())
                if accept(status):
                    return status
            except StockadeError:
                pass
            await trio.sleep(every_s)
    return None


async def new_leader(
    cluster: ClusterDriver, old: str, epoch: int, *, since: float, timeout_s: float, tls: TlsFiles | None
) -> tuple[str, int, float]:
    """The rule of a failover: a control plane other than ``old`` names a leader other than
    ``old`` at an epoch above ``epoch``. Only the others are asked (a frozen replica would hold
    each call to its deadline), every 20 ms.

    Returns:
        The new leader, its epoch, and the seconds since ``since`` (``time.monotonic()``).

    Raises:
        FaultError: none within ``timeout_s`` seconds, or at once when no other control plane
            runs (none could follow).
    """
    others = [p for p in cluster.config().control_planes if p.id != old]
    if not any(cluster.live_process(p) is not None for p in others):
        running = ", ".join(p.id for p in others) + " not running" if others else "there is no other"
        raise FaultError(f"no new leader can follow {old}: no other control plane runs ({running})")
    addresses = [p.address for p in others]
    probe = ControlPlaneClient(addresses, timeout_s=0.5, tls=tls)
    try:
        status = await _status_until(
            probe,
            lambda s: bool(s.leader) and s.leader != old and s.epoch > epoch,
            timeout_s=timeout_s,
            every_s=0.02,
        )
    finally:
        probe.close()
    if status is None:
        raise FaultError(f"no new leader within {timeout_s:g} s after {old} failed")
    return status.leader, status.epoch, time.monotonic() - since


async def kill_leader(
    cluster: ClusterDriver,
    client: ControlPlaneClient,
    *,
    timeout_s: float,
    tls: TlsFiles | None,
    clean: bool = False,
) -> Failover:
    """SIGKILL the leader, or with ``clean`` SIGTERM it (a clean stop: it releases its lease;
    its exit is waited for, 15 s at most), and time the takeover (:func:`new_leader`); the
    caller starts it again.

    Raises:
        FaultError: no leader, or no new one, within ``timeout_s`` seconds.
        trio.TooSlowError: a stopped leader still ran 15 s later.
    """
    old, epoch = await leader(client, timeout_s=timeout_s)
    pid = pid_of(cluster, old)
    since = time.monotonic()
    async with trio.open_nursery() as nursery:
        # A launcher waits for its own child's exit: the takeover is timed meanwhile.
        nursery.start_soon(send, cluster, old, signal.SIGTERM if clean else signal.SIGKILL)
        _, new_epoch, seconds = await new_leader(
            cluster, old, epoch, since=since, timeout_s=timeout_s, tls=tls
        )
    if clean:
        await wait_gone(pid, 15)
    kind = "stop" if clean else "kill"
    return Failover(kind=kind, leader=old, epoch_before=epoch, epoch_after=new_epoch, seconds=seconds)


async def freeze_leader(
    cluster: ClusterDriver,
    client: ControlPlaneClient,
    *,
    freeze_s: float,
    timeout_s: float,
    tls: TlsFiles | None,
    fault_dir: Path | None = None,
) -> Failover:
    """Freeze the leader for ``freeze_s`` seconds (SIGSTOP, or ``docker pause``), time the
    takeover, thaw it (it steps down on waking); the freeze is recorded. With ``fault_dir``
    (:func:`park_dir`), the leader is first parked inside an open fenced transaction, so the
    database's refusal of an old leader's write is provoked, not left to luck.

    Raises:
        FaultError: no leader, no new one within ``timeout_s`` seconds, or it did not park.
    """
    old, epoch = await leader(client, timeout_s=timeout_s)
    pid = pid_of(cluster, old)
    parked = None if fault_dir is None else await _park(cluster, park_dir(cluster, fault_dir, old), pid)
    frozen_at = time.time()
    try:
        await trio.to_thread.run_sync(cluster.pause, old)
    except ClusterError as exc:
        raise FaultError(str(exc)) from exc
    # Timed from the freeze, not from asking for it: the driver's own work (finding the
    # process, the engine's call) is not the takeover's.
    since = time.monotonic()
    try:
        _, new_epoch, seconds = await new_leader(
            cluster, old, epoch, since=since, timeout_s=timeout_s, tls=tls
        )
        await trio.sleep(max(0.0, freeze_s - (time.monotonic() - since)))
    finally:
        if parked is not None:
            parked.unlink(missing_ok=True)
        await trio.to_thread.run_sync(cluster.unpause, old)
        cluster.state.record_fault("freeze", old, frozen_at, time.time())
    kind = "freeze" if fault_dir is None else "freeze_in_transaction"
    return Failover(kind=kind, leader=old, epoch_before=epoch, epoch_after=new_epoch, seconds=seconds)


async def _park(cluster: ClusterDriver, folder: Path, pid: int) -> Path:
    """Arm the one-shot park and wait until the leader (``pid``, or the only process of its
    container's park folder) sits in it (inside an open fenced transaction, after its epoch
    check). Returns the file that holds it there."""
    # A few files of a local folder, looked at every 5 ms: no thread for each.
    folder.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240
    (folder / "arm").touch()
    with trio.move_on_after(10.0):
        while True:
            found = list(folder.glob("parked.*"))  # noqa: ASYNC240
            if isinstance(cluster, DockerCluster) and found:
                return found[0]
            parked = folder / f"parked.{pid}"
            if parked in found:
                return parked
            if found:  # a deposed replica's late write took it: release it and re-arm
                for other in found:
                    other.unlink(missing_ok=True)
                (folder / "arm").touch()
            await trio.sleep(0.005)
    (folder / "arm").unlink(missing_ok=True)
    raise FaultError("the leader did not reach the fenced-transaction fault point within 10 s")


# ---------------------------------------------------------------- workers


def busiest_worker(status: pb.StatusReply, live: Collection[str]) -> pb.WorkerInfo | None:
    """The alive worker with a process of its own (its id among ``live``) with the most CPU
    allocated (ties: the higher id); None when there is none."""
    candidates = [w for w in status.workers if w.state == "alive" and w.id in live]
    return max(candidates, key=lambda w: (w.cpu_allocated_millis, w.id), default=None)


async def jobs_moved(
    client: ControlPlaneClient,
    state: StateDir,
    victim: str,
    job_ids: Sequence[int],
    killed_at: float,
    *,
    timeout_s: float,
) -> Moved:
    """The rule of a worker's recovery: every job of ``job_ids`` but those that ended on
    ``victim`` is on another worker, past pending, and that worker's log records its start at or
    after ``killed_at`` (Unix seconds; the database learns of a start only with the next
    heartbeat). Asked every 50 ms.

    Raises:
        FaultError: they did not all run elsewhere within ``timeout_s`` seconds.
    """
    jobs: list[Any] = []
    with trio.move_on_after(timeout_s):
        while True:
            jobs = []
            try:
                for job_id in job_ids:
                    jobs.append(await client.call("get_job", pb.GetJobRequest(job_id=job_id)))
            except StockadeError:
                pass  # a replica dying mid-call: ask again
            else:
                to_move = [j for j in jobs if not (j.worker_id == victim and j.state in ENDED)]
                if all(j.worker_id != victim and j.state != "pending" for j in to_move):
                    starts = _starts_after(
                        state, killed_at, {j.job_id for j in to_move}, {j.worker_id for j in to_move}
                    )
                    if len(starts) == len(to_move):
                        return Moved(seconds=max(starts.values(), default=killed_at) - killed_at, jobs=jobs)
            await trio.sleep(0.05)
    # The jobs still on the victim or pending, as last read: what held the wait up.
    left = [j for j in jobs if (j.worker_id == victim and j.state not in ENDED) or j.state == "pending"]
    why = "; ".join(f"job {j.job_id} {j.state}{': ' + j.reason if j.reason else ''}" for j in left[:5])
    raise FaultError(
        f"the jobs of {victim} did not run elsewhere within {timeout_s:g} s of the kill"
        + (f" ({why}{'; ...' if len(left) > 5 else ''})" if why else "")
    )


def _starts_after(state: StateDir, since: float, job_ids: set[int], worker_ids: set[str]) -> dict[int, float]:
    """job id -> the first start record time at or after ``since`` on these workers."""
    starts: dict[int, float] = {}
    for worker_id in worker_ids:
        log_path = state.work_dir(worker_id) / "agent.jsonl"
        if not log_path.exists():
            continue
        for record in read_jsonl(log_path):
            if record.get("event") == "start" and record.get("job_id") in job_ids and record["time"] >= since:
                starts.setdefault(int(record["job_id"]), float(record["time"]))
    return starts


async def kill_busiest_worker(
    cluster: ClusterDriver, client: ControlPlaneClient, *, timeout_s: float
) -> float:
    """SIGKILL the busiest worker (:func:`busiest_worker`) and return the seconds until its
    jobs moved (:func:`jobs_moved`), once it has exited; the caller starts it again.

    Raises:
        FaultError: no live worker has jobs, or they did not move within ``timeout_s`` seconds.
    """
    status = await client.call("status", pb.StatusRequest())
    victim = busiest_worker(status, cluster.pids())
    if victim is None or not victim.job_ids:
        raise FaultError("no live worker has jobs to move")
    killed_at = time.time()
    pid = await send(cluster, victim.id)
    job_ids = [int(j) for j in victim.job_ids]
    moved = await jobs_moved(client, cluster.state, victim.id, job_ids, killed_at, timeout_s=timeout_s)
    await wait_gone(pid, 10)
    return moved.seconds


# ---------------------------------------------------------------- partitions and the database


async def sever(cluster: ClusterDriver, link: Link) -> None:
    """Cut ``link``'s worker off every control plane: its proxies (:mod:`ops.netfault`) stall
    every connection, or its container leaves the network (``docker network disconnect``).
    The link records the cut either way; cuts may overlap (one worker's, everyone's)."""
    if isinstance(cluster, DockerCluster) and not link.cut:
        link.sever()
        await trio.to_thread.run_sync(cluster.disconnect, link.name)
    link.sever()


async def heal(cluster: ClusterDriver, link: Link) -> None:
    """Undo :func:`sever` (a container back on the network at its own address)."""
    if isinstance(cluster, DockerCluster) and link.cut:
        link.heal()
        await trio.to_thread.run_sync(cluster.connect, link.name)
    link.heal()


async def restart_database(cluster: ClusterDriver, *, how: str, down_s: float) -> tuple[float, float]:
    """Stop the database (``fast``: a fast shutdown, ``docker stop``; ``kill``: SIGKILL of the
    server, ``docker kill``), keep it down ``down_s`` seconds, start it again; the outage is
    recorded (a fault of the whole cluster, target ``database``).

    Returns:
        When it went down and when it was started again, Unix seconds.

    Raises:
        FaultError: a cluster of processes on a database of its own (``DATABASE_URL``).
    """
    stop, start = _database_controls(cluster, how)
    down_at = time.time()
    await trio.to_thread.run_sync(stop)
    await trio.sleep(max(0.0, down_at + down_s - time.time()))
    try:
        await trio.to_thread.run_sync(start)
    finally:
        up_at = time.time()
        cluster.state.record_fault("db_outage", "database", down_at, up_at)
    return down_at, up_at


def _database_controls(cluster: ClusterDriver, how: str) -> tuple[Callable[[], object], Callable[[], object]]:
    if isinstance(cluster, DockerCluster):
        stop = functools.partial(cluster.kill if how == "kill" else cluster.stop_container, "pg")
        return stop, functools.partial(cluster.start_container, "pg")
    port = cluster.config().embedded_pg_port
    if port is None or not isinstance(cluster, LocalCluster):
        raise FaultError("--db-restarts needs the embedded database (DATABASE_URL is set)")
    server = cluster.embedded_database(port)
    return (server.kill if how == "kill" else server.stop), server.start
