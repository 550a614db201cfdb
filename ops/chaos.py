"""``stockade chaos``: leader-failover torture on a fresh local cluster, then the checker.

The harness starts a fresh cluster (the database, 3 control planes, 10 workers) in its own
state folder, keeps submitting sleep jobs at a steady rate, and injects leader failovers,
alternating:

- kill: SIGKILL the leader, time until a new leader with a higher epoch shows in the status,
  then start the killed replica again (it returns as a standby);
- freeze: SIGSTOP the leader for ``freeze_s`` (longer than the lease), time the takeover,
  SIGCONT it (it steps down on waking; anything it tries to commit is refused). Every
  ``mid_transaction_every``-th freeze parks the leader inside an open fenced transaction
  first (fault point ``ledger.after_epoch_check``: the reconciler's dead-worker declaration,
  which runs every pass; placements are single fenced statements with no such moment), so the
  database's refusal of an old leader's write is provoked, not left to luck.

``worker_kills`` SIGKILLs and restarts workers along the way (a restarted agent back within the
fence time takes its predecessor's jobs over); ``worker_restarts`` restarts workers the planned way
(SIGHUP, then start again: the jobs are kept); ``partitions`` cuts one worker
off from every control plane; ``mass_partitions`` cuts every worker off at once (the leader must
hold its declarations, and the paused jobs resume: DESIGN.md, "Outages"); ``db_restarts``
stops the database (fast shutdown and SIGKILL, alternating) for a random 2-12 s and starts it
again, with nothing running killed. Every fault is recorded in ``events.jsonl``, so the checker
ends a killed worker's runs at the kill and does not count the deaths it caused as false, and
counts runs the cluster ended during an outage (``jobs_killed_by_outage``). The harness keeps
every job id a submission was acknowledged with, and the checker looks for each in the
database (``acknowledged_submissions_lost``). When the injections are done the harness stops submitting,
waits for every job to finish, runs :func:`ops.checker.check`, and returns the results
(:mod:`ops.chaosresult`: the settings, the result, its JSON and table).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil
import trio

from ops import checker
from ops.chaosresult import FAILING_MAX_ATTEMPTS, ChaosResult, ChaosSettings, Failover, chaos_table
from ops.cluster import ClusterError, DockerCluster, LocalCluster, StateDir
from ops.launcher.hadb_members import HaDatabaseError
from ops.netfault import Link, serve_proxy
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError

__all__ = [
    "FAULT_POINT",
    "ChaosResult",
    "ChaosSettings",
    "Failover",
    "Harness",
    "chaos_table",
    "fault_environment",
]

FAULT_POINT = "ledger.after_epoch_check"


def fault_environment(fault_dir: Path) -> dict[str, str]:
    """Environment that arms the one-shot park at the fenced transaction's epoch check."""
    return {"STOCKADE_ENABLE_FAULTS": "1", "STOCKADE_FAULTS": f"{FAULT_POINT}=park:{fault_dir}"}


@attrs.define
class Harness:
    """Runs one chaos scenario against a :class:`LocalCluster`, or a :class:`DockerCluster`
    (``--docker``): there a freeze is ``docker pause`` of the leader's container (the cgroup
    freezer stops all of it), a partition takes the worker's container off the cluster's
    network (``docker network disconnect``, then ``connect`` at its own address), a database
    restart stops (``docker stop``: a fast shutdown) or kills (``docker kill``) the database's
    container and starts it again, and a kill SIGKILLs the container's process 1, which ends
    the whole container (as ``docker kill``). Each control plane's container parks at the
    fault point through a folder of its own (``faults/<cp-id>/``): process ids inside
    containers are not unique."""

    settings: ChaosSettings
    cluster: LocalCluster | DockerCluster
    progress: Callable[[str], None] = print
    result: ChaosResult = attrs.field(factory=ChaosResult)
    _rng: random.Random = attrs.field(init=False)
    _links: dict[str, Link] = attrs.field(factory=dict)
    """Each worker's proxies (a cluster of processes); the workers, for one in containers."""
    _submitted: int = 0
    _acknowledged: list[int] = attrs.field(factory=list)
    _expected: dict[int, str] = attrs.field(factory=dict)
    """Job id -> the final state it must reach (jobs made to fail: failed; others: succeeded)."""
    """Job ids the control planes acknowledged submissions with."""

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.settings.seed)

    @property
    def state(self) -> StateDir:
        return self.cluster.state

    @property
    def fault_dir(self) -> Path:
        return self.state.root / "faults"

    @property
    def docker(self) -> DockerCluster | None:
        return self.cluster if isinstance(self.cluster, DockerCluster) else None

    def park_dir(self, process_id: str) -> Path:
        """Where ``process_id`` parks at the fault point: the one folder for processes, one per
        control plane for containers."""
        return self.fault_dir / process_id if self.docker is not None else self.fault_dir

    # ------------------------------------------------------------ the run

    async def run(self) -> ChaosResult:
        """Start a fresh cluster, inject, wait, check. Always leaves the cluster running for
        inspection; the caller stops it (``cluster.down()``)."""
        started = time.monotonic()
        s = self.settings
        async with asyncio_bridge(), trio.open_nursery() as network:
            if self.docker is not None:
                self._links = {f"w-{i}": Link(name=f"w-{i}") for i in range(1, s.workers + 1)}
            elif s.partitions > 0 or s.mass_partitions > 0:
                await self._start_proxies(network)
            await trio.to_thread.run_sync(self.fresh_cluster)
            await self._inject_and_wait()
            network.cancel_scope.cancel()
        config = self.cluster.config()
        async with asyncio_bridge():
            history = await checker.load_history(config.database_url)
        faults = checker.load_events(self.state.events_path)
        self.result.report = checker.check_logs(
            history,
            [self.state.work_dir(w.id) for w in config.workers],
            faults,
            acknowledged_job_ids=self._acknowledged,
            expected_final_states=self._expected,
        )
        self.result.jobs_made_to_fail = sum(1 for state in self._expected.values() if state == "failed")
        self.result.placement_recoveries_s = checker.placement_recoveries_s(history.assignments, faults)
        self.result.failover_placements_s = checker.placement_recoveries_s(
            history.assignments, faults, kind="db_failover"
        )
        self.result.partitions_rejoined, self.result.partitions_worked_again = self._rejoined(config)
        self.result.duration_s = time.monotonic() - started
        return self.result

    async def _inject_and_wait(self) -> None:
        """Submit jobs while injecting the failovers (and worker kills and partitions), then
        wait for every job to finish. A run that cannot go on is recorded as an error."""
        s = self.settings
        addresses = self.cluster.config().control_plane_addresses
        client = ControlPlaneClient(addresses, timeout_s=1.0, tls=self.cluster.config().client_tls)
        try:
            with recording_aborts(self.result.errors):
                async with trio.open_nursery() as nursery:
                    stop_submitting = trio.Event()
                    nursery.start_soon(self._submit, addresses, stop_submitting)
                    kill_worker_at = self._spread(s.worker_kills)
                    restart_worker_at = self._spread(s.worker_restarts, offset=1)
                    partition_at = self._spread(s.partitions)
                    mass_partition_at = self._spread(s.mass_partitions, offset=1)
                    db_restart_at = self._spread(s.db_restarts, offset=2)
                    db_failover_at = self._spread(s.db_failovers, offset=2)
                    freezes = 0
                    for i in range(self._steps()):
                        if i >= s.failovers:
                            await trio.sleep(1.0)  # a step with no failover: faults only
                        elif i % 2 == 0:
                            await self.kill_leader(client, self.state)
                        else:
                            freezes += 1
                            in_tx = s.mid_transaction_every > 0 and freezes % s.mid_transaction_every == 2
                            await self.freeze_leader(client, self.state, in_transaction=in_tx)
                        if i in kill_worker_at:
                            await self.kill_worker(client, self.state)
                        if i in restart_worker_at:
                            await self.restart_worker(client)
                        if i in partition_at:
                            nursery.start_soon(self.partition_worker)
                        if i in mass_partition_at:
                            await self.partition_every_worker()
                        if i in db_restart_at:
                            await self.restart_database(
                                client, how=("fast", "kill")[len(self.result.db_outages) % 2]
                            )
                        if i in db_failover_at:
                            await self.fail_over_database(client)
                        self.progress(self._line(i + 1))
                        await trio.sleep(s.settle_s)
                    if s.partitions or s.mass_partitions:
                        # Keep the jobs coming until every partition healed and its worker had
                        # time to register again and get work.
                        while any(link.cut for link in self._links.values()):  # noqa: ASYNC110
                            await trio.sleep(0.1)
                        await trio.sleep(3.0)
                    stop_submitting.set()
                await self._wait_finished(client)
        finally:
            client.close()

    def _line(self, done: int) -> str:
        last = self.result.failovers[-1] if self.result.failovers else None
        what = f"{last.kind} of {last.leader}: new leader in {last.seconds:.2f} s" if last else ""
        return f"step {done}/{self._steps()}  {what}  jobs submitted {self._submitted}"

    def fresh_cluster(self) -> None:
        self.cluster.down()
        if self.state.root.exists():
            shutil.rmtree(self.state.root)
        self.state.create()
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        if isinstance(self.cluster, DockerCluster):
            self.cluster.extra_env = lambda process_id: (
                fault_environment(self.park_dir(process_id)) if process_id.startswith("cp-") else {}
            )
            self.cluster.extra_binds = lambda process_id: (
                [self.park_dir(process_id)] if process_id.startswith("cp-") else []
            )
        else:
            self.cluster.extra_env.update(fault_environment(self.fault_dir))
        self.cluster.up(control_planes=self.settings.control_planes, workers=self.settings.workers)

    def _steps(self) -> int:
        """Steps of the run: one per failover, and at least two per fault of any kind (a run
        of fewer failovers than faults injects them in steps of their own)."""
        s = self.settings
        faults = max(
            s.worker_kills, s.worker_restarts, s.partitions, s.mass_partitions, s.db_restarts, s.db_failovers
        )
        return max(s.failovers, 2 * faults + 3 if faults else 0)

    def _spread(self, count: int, offset: int = 0) -> set[int]:
        """``count`` distinct step indices spread evenly over the run (shifted by ``offset``,
        so that faults of different kinds do not all follow the same step)."""
        steps = self._steps()
        if count <= 0 or steps <= 0:
            return set()
        step = max(1, steps // (count + 1))
        return {min(steps - 1, step * (k + 1) - 1 + offset) for k in range(count)}

    # ------------------------------------------------------------ partitions

    async def _start_proxies(self, nursery: trio.Nursery) -> None:
        """Route every worker through proxies of its own (see :mod:`ops.netfault`)."""
        s = self.settings
        cp_ids = [f"cp-{i}" for i in range(1, s.control_planes + 1)]
        routes: dict[str, tuple[str, list[str]]] = {}

        def address_of(process_id: str) -> Callable[[], str]:
            return lambda: self.cluster.config().address_of(process_id)

        for index in range(1, s.workers + 1):
            worker_id = f"w-{index}"
            link = self._links[worker_id] = Link(name=worker_id)
            inbound = await nursery.start(serve_proxy, 0, address_of(worker_id), link)
            outbound = [await nursery.start(serve_proxy, 0, address_of(cp), link) for cp in cp_ids]
            shift = index % len(outbound)  # spread the heartbeats over the control planes
            outbound = outbound[shift:] + outbound[:shift]
            routes[worker_id] = (f"127.0.0.1:{inbound}", [f"127.0.0.1:{port}" for port in outbound])
        assert isinstance(self.cluster, LocalCluster)
        self.cluster.worker_network = routes.__getitem__

    async def partition_worker(self, worker_id: str | None = None) -> None:
        """Cut ``worker_id`` (default: the busiest worker not already cut, so that jobs must
        move) off from every control plane for ``partition_s``, then heal it."""
        if worker_id is None:
            with trio.move_on_after(self.settings.mass_partition_s + 5.0):
                while all(link.cut for link in self._links.values()):  # noqa: ASYNC110
                    await trio.sleep(0.1)  # every worker is cut off (a mass partition): wait
            candidates = sorted(w for w, link in self._links.items() if not link.cut)
            if not candidates:
                self.result.errors.append("a partition found no worker to cut off")
                return
            worker_id = self._rng.choice(candidates)
            config = self.cluster.config()
            client = ControlPlaneClient(config.control_plane_addresses, timeout_s=1.0, tls=config.client_tls)
            try:
                status = await client.call("status", pb.StatusRequest())
                busy = [w for w in status.workers if w.id in candidates and w.job_ids]
                if busy:
                    worker_id = max(busy, key=lambda w: (len(w.job_ids), w.id)).id
            except StockadeError:
                pass  # no replica answered: the random pick stands
            finally:
                client.close()
        cut_at = time.time()
        await self._sever(worker_id)
        try:
            await trio.sleep(self.settings.partition_s)
        finally:
            await self._heal(worker_id)
            healed_at = time.time()
            self.state.record_fault("partition", worker_id, cut_at, healed_at)
            self.result.partitions.append((worker_id, cut_at, healed_at))

    async def partition_every_worker(self) -> None:
        """Cut every worker off from every control plane for ``mass_partition_s``, then heal
        them all (one fault of the whole cluster, target ``workers``)."""
        cut_at = time.time()
        for worker_id in self._links:
            await self._sever(worker_id)
        try:
            await trio.sleep(self.settings.mass_partition_s)
        finally:
            for worker_id in self._links:
                await self._heal(worker_id)
            healed_at = time.time()
            self.state.record_fault("mass_partition", "workers", cut_at, healed_at)
            self.result.mass_partitions.append((cut_at, healed_at))

    async def _sever(self, worker_id: str) -> None:
        """Cut ``worker_id`` off: its proxies drop every connection, or its container leaves the
        network. The link records the cut either way."""
        link = self._links[worker_id]
        if self.docker is not None and not link.cut:  # cuts overlap (one worker's, everyone's)
            link.sever()
            await trio.to_thread.run_sync(self.docker.disconnect, worker_id)
        link.sever()

    async def _heal(self, worker_id: str) -> None:
        link = self._links[worker_id]
        if self.docker is not None and link.cut:
            link.heal()
            await trio.to_thread.run_sync(self.docker.connect, worker_id)
        link.heal()

    async def restart_database(self, client: ControlPlaneClient, *, how: str) -> None:
        """Stop the embedded database (``fast``: a fast shutdown; ``kill``: SIGKILL of the
        server), keep it down for a random time in ``db_down_s``, start it again, and wait for
        a leader. A fault of the whole cluster, target ``database``."""
        stop, start = self._database_controls(how)
        down_s = self._rng.uniform(*self.settings.db_down_s)
        down_at = time.time()
        await trio.to_thread.run_sync(stop)
        await trio.sleep(max(0.0, down_at + down_s - time.time()))
        try:
            await trio.to_thread.run_sync(start)
        finally:
            up_at = time.time()
            self.state.record_fault("db_outage", "database", down_at, up_at)
            self.result.db_outages.append((how, down_at, up_at))
        await self.leader(client)

    def _database_controls(self, how: str) -> tuple[Callable[[], object], Callable[[], object]]:
        """How to stop the database (``fast`` or ``kill``) and start it again."""
        if isinstance(self.cluster, DockerCluster):
            docker = self.cluster
            if how == "kill":
                return functools.partial(docker.kill, "pg"), functools.partial(docker.start_container, "pg")
            return functools.partial(docker.stop_container, "pg"), functools.partial(
                docker.start_container, "pg"
            )
        config = self.cluster.config()
        if config.embedded_pg_port is None:
            raise _Abort("--db-restarts needs the embedded database (DATABASE_URL is set)")
        server = self.cluster.embedded_database(config.embedded_pg_port)
        return (server.kill if how == "kill" else server.stop), server.start

    async def fail_over_database(self, client: ControlPlaneClient) -> None:
        """SIGKILL the HA database's primary (its Patroni and PostgreSQL: the host dies), wait
        for Patroni to promote the standby, then start the old primary again (it rejoins as the
        standby) and wait for a leader. A fault of the whole cluster (``db_failover``, target
        ``database``) from the kill to the promotion."""
        if not self.settings.ha_db or isinstance(self.cluster, DockerCluster):
            raise _Abort("--db-failovers needs --ha-db (and processes, not containers)")
        ha = self.cluster.ha_database()
        killed_at = time.time()
        killed = await trio.to_thread.run_sync(ha.kill_primary)
        try:
            promoted = await trio.to_thread.run_sync(
                functools.partial(ha.wait_for_new_primary, killed, timeout_s=120.0)
            )
        except HaDatabaseError as exc:
            raise _Abort(f"database failover: {exc}") from exc
        promoted_at = killed_at + promoted.after_s
        self.state.record_fault("db_failover", "database", killed_at, promoted_at)
        self.result.db_failovers.append((killed.name, killed_at, promoted_at))
        self.progress(
            f"database failover: {killed.name} killed, {promoted.name} primary in {promoted.after_s:.1f} s"
        )
        await self.leader(client)
        try:
            await trio.to_thread.run_sync(functools.partial(ha.restart_member, killed.name, timeout_s=180.0))
        except HaDatabaseError as exc:
            raise _Abort(f"database failover: {killed.name} did not rejoin: {exc}") from exc

    def _rejoined(self, config: Any) -> tuple[int, int]:
        """Partitions after which the worker came back (registered again, or, when it was not
        declared dead meanwhile, resumed its paused jobs in the same incarnation), and after
        which it also started a job again."""
        rejoined = 0
        count = 0
        for worker_id, _, healed_at in self.result.partitions:
            records = checker.read_jsonl(self.state.work_dir(worker_id) / "agent.jsonl")
            back = [
                r["time"]
                for r in records
                if r.get("event") in ("register", "resume") and r["time"] >= healed_at
            ]
            if back:
                rejoined += 1
                if any(r.get("event") == "start" and r["time"] >= back[0] for r in records):
                    count += 1
        return rejoined, count

    # ------------------------------------------------------------ jobs

    async def _submit(self, addresses: Sequence[str], stop: trio.Event) -> None:
        s = self.settings
        client = ControlPlaneClient(addresses, timeout_s=2.0, tls=self.cluster.config().client_tls)
        interval = 1.0 / s.submit_rate_per_s
        next_at = trio.current_time()
        try:
            while not stop.is_set():
                low, high = s.job_duration_s
                duration_s = self._rng.uniform(low, high)
                fails = self._rng.random() < s.failing_share
                spec = pb.JobSpec(
                    name=f"chaos-{self._submitted + 1}",
                    cpu_millis=self._rng.choice([100, 250, 500, 1000]),
                    memory_mb=self._rng.choice([64, 128, 256, 512]),
                )
                if fails:
                    # A job made to fail: retried once, it must end failed, both runs spent.
                    spec.command = pb.CommandRuntime(argv=["sh", "-c", f"sleep {duration_s:.2f}; exit 3"])
                    spec.max_attempts = FAILING_MAX_ATTEMPTS
                    spec.retry_backoff_ms = 200
                else:
                    spec.sleep = pb.SleepRuntime(duration_ms=int(1000 * duration_s))
                try:
                    reply = await client.call("submit_job", pb.SubmitJobRequest(spec=spec))
                    self._submitted += 1
                    self._acknowledged.append(int(reply.job_id))
                    self._expected[int(reply.job_id)] = "failed" if fails else "succeeded"
                except StockadeError:
                    pass  # no replica answered this once (one may be frozen): try the next
                next_at += interval
                await trio.sleep_until(max(next_at, trio.current_time()))
        finally:
            client.close()

    async def _wait_finished(self, client: ControlPlaneClient) -> None:
        self.progress("injections done; waiting for every job to finish")
        with trio.move_on_after(self.settings.finish_timeout_s):
            while True:
                try:
                    status = await client.call("status", pb.StatusRequest())
                except StockadeError:
                    await trio.sleep(0.5)
                    continue
                counts = {c.state: c.count for c in status.jobs}
                if not any(counts.get(k, 0) for k in ("pending", "assigned", "running")):
                    return
                await trio.sleep(0.5)

    # ------------------------------------------------------------ leaders

    async def leader(self, client: ControlPlaneClient) -> tuple[str, int]:
        with trio.move_on_after(self.settings.new_leader_timeout_s):
            while True:
                try:
                    status = await client.call("status", pb.StatusRequest())
                    if status.leader:
                        return status.leader, status.epoch
                except StockadeError:
                    pass
                await trio.sleep(0.05)
        raise _Abort(f"no leader within {self.settings.new_leader_timeout_s:g} s")

    async def new_leader(self, old: str, epoch: int, since: float) -> tuple[str, int, float]:
        addresses = [p.address for p in self.cluster.config().control_planes if p.id != old]
        probe = ControlPlaneClient(addresses, timeout_s=0.5, tls=self.cluster.config().client_tls)
        try:
            with trio.move_on_after(self.settings.new_leader_timeout_s):
                while True:
                    try:
                        status = await probe.call("status", pb.StatusRequest())
                        if status.leader and status.leader != old and status.epoch > epoch:
                            return status.leader, status.epoch, time.monotonic() - since
                    except StockadeError:
                        pass
                    await trio.sleep(0.02)
        finally:
            probe.close()
        raise _Abort(f"no new leader within {self.settings.new_leader_timeout_s:g} s after {old} failed")

    def _pid(self, process_id: str) -> int:
        spec = self.cluster.config().process(process_id)
        process = self.cluster.live_process(spec)
        if process is None:
            raise _Abort(f"{process_id} is not running")
        return process.pid

    async def kill_leader(self, client: ControlPlaneClient, events: StateDir) -> None:
        leader, epoch = await self.leader(client)
        pid = self._pid(leader)
        since = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        events.record_fault("kill", leader, time.time())
        _, new_epoch, seconds = await self.new_leader(leader, epoch, since)
        self.result.failovers.append(
            Failover(kind="kill", leader=leader, epoch_before=epoch, epoch_after=new_epoch, seconds=seconds)
        )
        await trio.to_thread.run_sync(self._restart)

    async def freeze_leader(
        self, client: ControlPlaneClient, events: StateDir, *, in_transaction: bool
    ) -> None:
        s = self.settings
        leader, epoch = await self.leader(client)
        pid = self._pid(leader)
        parked: Path | None = None
        if in_transaction:
            parked = await self._park_leader(leader, pid)
        since = time.monotonic()
        frozen_at = time.time()
        await self._freeze(leader, pid)
        try:
            _, new_epoch, seconds = await self.new_leader(leader, epoch, since)
            remaining = (s.mid_transaction_freeze_s if in_transaction else s.freeze_s) - (
                time.monotonic() - since
            )
            await trio.sleep(max(0.0, remaining))
        finally:
            if parked is not None:
                parked.unlink(missing_ok=True)
            await self._thaw(leader, pid)
            events.record_fault("freeze", leader, frozen_at, time.time())
        kind = "freeze_in_transaction" if in_transaction else "freeze"
        self.result.failovers.append(
            Failover(kind=kind, leader=leader, epoch_before=epoch, epoch_after=new_epoch, seconds=seconds)
        )

    async def _freeze(self, process_id: str, pid: int) -> None:
        """SIGSTOP the process, or ``docker pause`` its container."""
        if self.docker is not None:
            try:
                await trio.to_thread.run_sync(self.docker.pause, process_id)
            except ClusterError as exc:
                raise _Abort(str(exc)) from exc
        else:
            os.kill(pid, signal.SIGSTOP)

    async def _thaw(self, process_id: str, pid: int) -> None:
        if self.docker is not None:
            await trio.to_thread.run_sync(self.docker.unpause, process_id)
        else:
            os.kill(pid, signal.SIGCONT)

    async def stop_leader(self, client: ControlPlaneClient) -> None:
        """SIGTERM the leader (a clean stop: it releases its lease), time the takeover,
        start it again."""
        leader, epoch = await self.leader(client)
        pid = self._pid(leader)
        since = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        _, new_epoch, seconds = await self.new_leader(leader, epoch, since)
        self.result.failovers.append(
            Failover(kind="stop", leader=leader, epoch_before=epoch, epoch_after=new_epoch, seconds=seconds)
        )
        with trio.fail_after(15):
            while not _gone(pid):  # noqa: ASYNC110 (another process's exit: nothing to wait on)
                await trio.sleep(0.01)
        await trio.to_thread.run_sync(self._restart)

    async def kill_busiest_worker(self, client: ControlPlaneClient, events: StateDir) -> float:
        """SIGKILL the live worker with the most CPU allocated and return the seconds until every
        job it ran was running (or done) on another worker; then start it again.

        Raises:
            _Abort: no worker has jobs, or its jobs did not move within ``new_leader_timeout_s``
                plus a minute.
        """
        status = await client.call("status", pb.StatusRequest())
        live = self.cluster.pids()
        candidates = [w for w in status.workers if w.state == "alive" and w.id in live and w.job_ids]
        if not candidates:
            raise _Abort("no live worker has jobs to move")
        victim = max(candidates, key=lambda w: (w.cpu_allocated_millis, w.id))
        job_ids = [int(j) for j in victim.job_ids]
        pid = self._pid(victim.id)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        events.record_fault("kill", victim.id, killed_at)
        # A job runs elsewhere when another worker starts it: its own log's start record says
        # when (the database learns it only with that worker's next heartbeat).
        moved: float | None = None
        with trio.move_on_after(self.settings.new_leader_timeout_s + 60):
            while moved is None:
                jobs = [await client.call("get_job", pb.GetJobRequest(job_id=j)) for j in job_ids]
                # Jobs that ended on the victim before the kill need not run anywhere again.
                to_move = [
                    j for j in jobs if not (j.worker_id == victim.id and j.state in ("succeeded", "failed"))
                ]
                if all(j.worker_id != victim.id and j.state != "pending" for j in to_move):
                    starts = self._starts_after(
                        killed_at, {j.job_id for j in to_move}, {j.worker_id for j in to_move}
                    )
                    if len(starts) == len(to_move):
                        moved = max(starts.values(), default=killed_at) - killed_at
                        break
                await trio.sleep(0.05)
        if moved is None:
            raise _Abort(f"the jobs of {victim.id} did not run elsewhere in time")
        with trio.fail_after(10):
            while not _gone(pid):  # noqa: ASYNC110 (another process's exit: nothing to wait on)
                await trio.sleep(0.01)
        self.result.worker_kills += 1
        await trio.to_thread.run_sync(self._restart)
        return moved

    def _starts_after(self, since: float, job_ids: set[int], worker_ids: set[str]) -> dict[int, float]:
        """job id -> the first start record time at or after ``since`` on these workers."""
        starts: dict[int, float] = {}
        for worker_id in worker_ids:
            log_path = self.state.work_dir(worker_id) / "agent.jsonl"
            if not log_path.exists():
                continue
            for record in checker.read_jsonl(log_path):
                if (
                    record.get("event") == "start"
                    and record.get("job_id") in job_ids
                    and record["time"] >= since
                ):
                    starts.setdefault(int(record["job_id"]), float(record["time"]))
        return starts

    async def _park_leader(self, leader: str, pid: int) -> Path:
        """Arm the one-shot park and wait until the leader (``pid``, or the only process of its
        container's park folder) sits in it (inside an open fenced transaction, after its epoch
        check). Returns the file that holds it there."""
        folder = self.park_dir(leader)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "arm").touch()
        with trio.move_on_after(10.0):
            while True:
                found = list(folder.glob("parked.*"))
                if self.docker is not None and found:
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
        raise _Abort("the leader did not reach the fenced-transaction fault point within 10 s")

    def _restart(self) -> None:
        self.cluster.up(control_planes=self.settings.control_planes, workers=self.settings.workers)

    async def kill_worker(self, client: ControlPlaneClient, events: StateDir) -> None:
        """SIGKILL a worker's agent and start it again at once; counts whether the new agent
        continued its incarnation (took its jobs over, back within the fence time)."""
        workers = [p.id for p in self.cluster.config().workers]
        victim = self._rng.choice(workers)
        before = await self._incarnation(client, victim)
        pid = self._pid(victim)
        os.kill(pid, signal.SIGKILL)
        events.record_fault("kill", victim, time.time())
        with trio.fail_after(10):
            while not _gone(pid):  # noqa: ASYNC110 (another process's exit: nothing to wait on)
                await trio.sleep(0.01)
        self.result.worker_kills += 1
        await trio.to_thread.run_sync(self._restart)
        if before is not None and await self._incarnation(client, victim) == before:
            self.result.worker_kills_continued += 1

    async def restart_worker(self, client: ControlPlaneClient) -> None:
        """A planned restart of a worker that runs jobs (any worker when none does): SIGHUP its
        agent (it asks for its restart hold and exits leaving its jobs running), wait for its
        exit, start it again; counts whether the new agent continued its incarnation. Not a
        fault: no event is recorded."""
        if self.docker is not None:
            raise _Abort("planned restarts keep no job in containers: a container's processes end with it")
        workers = [p.id for p in self.cluster.config().workers]
        try:
            status = await client.call("status", pb.StatusRequest())
            busy = sorted(
                w.id for w in status.workers if w.id in workers and w.state == "alive" and w.job_ids
            )
        except StockadeError:
            busy = []
        victim = self._rng.choice(busy or workers)  # one with jobs, if any: what a restart must keep
        before = await self._incarnation(client, victim)
        pid = self._pid(victim)
        os.kill(pid, signal.SIGHUP)
        with trio.fail_after(15):
            while not _gone(pid):  # noqa: ASYNC110 (another process's exit: nothing to wait on)
                await trio.sleep(0.01)
        self.result.worker_restarts += 1
        await trio.to_thread.run_sync(self._restart)
        if before is not None and await self._incarnation(client, victim) == before:
            self.result.worker_restarts_continued += 1

    async def _incarnation(self, client: ControlPlaneClient, worker_id: str) -> int | None:
        """``worker_id``'s incarnation as the status shows it; None when no replica answered."""
        try:
            status = await client.call("status", pb.StatusRequest())
        except StockadeError:
            return None
        return next((int(w.incarnation) for w in status.workers if w.id == worker_id), None)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class _Abort(Exception):
    """The run cannot go on (no leader, a process missing); recorded as an error."""


@contextlib.contextmanager
def recording_aborts(errors: list[str]) -> Iterator[None]:
    """Record every :class:`_Abort` raised in the block, bare or from inside nurseries
    (which wrap it in an exception group), as a line of ``errors``, and end the block; any
    other exception propagates."""
    try:
        yield
    except* _Abort as group:
        errors.extend(str(abort) for abort in _leaves(group))


def _leaves(group: BaseExceptionGroup[_Abort]) -> list[BaseException]:
    """The exceptions of ``group``, nested groups flattened."""
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves
