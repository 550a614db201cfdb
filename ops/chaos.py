"""``stockade chaos``: a fresh local cluster under a steady job stream and injected faults
(:mod:`ops.faults`, recorded in ``events.jsonl``), then the checker. What a run does and what
each fault means: docs/design.md, "Chaos".
"""

from __future__ import annotations

import contextlib
import functools
import random
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from ops import certs as certs_module
from ops import checker, faults
from ops.chaos_settings import (
    CHAOS_GPUS_PER_WORKER,
    CHAOS_PREEMPT_COOLDOWN_S,
    CHAOS_PREEMPT_GRACE_S,
    CHAOS_SCHEDULE_DEADLINE_S,
    CHAOS_SCHEDULE_NAME,
    FINISH_PROGRESS_EVERY_S,
    ChaosSettings,
)
from ops.chaos_workload import Workload, sample_devices, sample_partial_gangs
from ops.chaosresult import ChaosResult
from ops.faults import FaultError, fault_environment
from ops.launcher.control import LocalCluster
from ops.launcher.docker import DockerCluster
from ops.launcher.driver import ClusterDriver
from ops.launcher.hadb_members import HaDatabaseError
from ops.launcher.state import StateDir
from ops.netfault import Link, serve_proxy
from protocol import pb
from runtime.aio import asyncio_bridge
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError
from runtime.text import read_jsonl


@attrs.define
class Harness:
    """Runs one chaos scenario against any :class:`ClusterDriver`: a :class:`LocalCluster`, or a
    :class:`DockerCluster` (``--docker``: its faults are the containers', :mod:`ops.faults`)."""

    settings: ChaosSettings
    cluster: ClusterDriver
    progress: Callable[[str], None] = print
    result: ChaosResult = attrs.field(factory=ChaosResult)
    _rng: random.Random = attrs.field(init=False)
    _links: dict[str, Link] = attrs.field(factory=dict)
    """Each worker's proxies (a cluster of processes); the workers, for one in containers."""
    _workload: Workload = attrs.field(init=False)
    """The jobs it submits (drawing from the same ``_rng``)."""

    def __attrs_post_init__(self) -> None:
        self._rng = random.Random(self.settings.seed)
        self._workload = Workload(settings=self.settings, result=self.result, rng=self._rng)

    @property
    def state(self) -> StateDir:
        return self.cluster.state

    @property
    def fault_dir(self) -> Path:
        return self.state.root / "faults"

    @property
    def timeout_s(self) -> float:
        return self.settings.new_leader_timeout_s

    # ------------------------------------------------------------ the run

    async def run(self) -> ChaosResult:
        """Start a fresh cluster, inject, wait, check. Always leaves the cluster running for
        inspection; the caller stops it (``cluster.down()``)."""
        started = time.monotonic()
        s = self.settings
        async with asyncio_bridge(), trio.open_nursery() as network:
            if isinstance(self.cluster, DockerCluster):
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
            acknowledged_job_ids=self._workload.acknowledged,
            expected_final_states=self._workload.expected,
        )
        expected = self._workload.expected
        self.result.jobs_made_to_fail = sum(1 for state in expected.values() if state == "failed")
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
        finished = trio.Event()
        try:
            async with trio.open_nursery() as sampling:
                if s.devices:
                    sampling.start_soon(
                        sample_devices, self.cluster.config().database_url, self.result, finished
                    )
                await self._inject_then_wait(client, addresses)
                finished.set()
        finally:
            client.close()

    async def _inject_then_wait(self, client: ControlPlaneClient, addresses: Sequence[str]) -> None:
        """:meth:`_inject_and_wait`'s injections and wait, on ``client``."""
        s = self.settings
        with recording_aborts(self.result.errors):
            await self._add_schedule(client)
            async with trio.open_nursery() as nursery:
                stop_submitting = trio.Event()
                config = self.cluster.config()
                nursery.start_soon(
                    self._workload.submit, addresses, config.client_tls, self.state.cert_dir, stop_submitting
                )
                if s.gangs:
                    nursery.start_soon(
                        sample_partial_gangs, config.database_url, self.result, stop_submitting
                    )
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
                        await self.kill_leader(client)
                    else:
                        freezes += 1
                        in_tx = s.mid_transaction_every > 0 and freezes % s.mid_transaction_every == 2
                        await self.freeze_leader(client, in_transaction=in_tx)
                    if i in kill_worker_at:
                        await self.kill_worker(client)
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
            await self._pause_schedule(client)
            await self._wait_finished(client)

    def _line(self, done: int) -> str:
        last = self.result.failovers[-1] if self.result.failovers else None
        what = f"{last.kind} of {last.leader}: new leader in {last.seconds:.2f} s" if last else ""
        return f"step {done}/{self._steps()}  {what}  jobs submitted {self._workload.submitted}"

    def fresh_cluster(self) -> None:
        self.cluster.down()
        if self.state.root.exists():
            shutil.rmtree(self.state.root)
        self.state.create()
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        if isinstance(self.cluster, DockerCluster):
            park_dir = functools.partial(faults.park_dir, self.cluster, self.fault_dir)
            self.cluster.extra_env = lambda process_id: (
                fault_environment(park_dir(process_id)) if process_id.startswith("cp-") else {}
            )
            self.cluster.extra_binds = lambda process_id: (
                [park_dir(process_id)] if process_id.startswith("cp-") else []
            )
        elif isinstance(self.cluster, LocalCluster):
            self.cluster.extra_env.update(fault_environment(self.fault_dir))
        if self.settings.preemption and isinstance(self.cluster, LocalCluster):
            self.cluster.cp_args = (
                *self.cluster.cp_args,
                "--preemption",
                "--preempt-grace-s",
                str(CHAOS_PREEMPT_GRACE_S),
                "--preempt-cooldown-s",
                str(CHAOS_PREEMPT_COOLDOWN_S),
            )
        if self.settings.devices and isinstance(self.cluster, LocalCluster | DockerCluster):
            units = ",".join(str(k) for k in range(CHAOS_GPUS_PER_WORKER))
            self.cluster.agent_args = (*self.cluster.agent_args, "--resource", f"gpu={units}")
        self.cluster.up(control_planes=self.settings.control_planes, workers=self.settings.workers)
        self._issue_accounts()

    def _issue_accounts(self) -> None:
        """With ``accounts`` > 1: a user certificate for each account (chaos-1, chaos-2, ...),
        unless the cluster runs without TLS."""
        config = self.cluster.config()
        if self.settings.accounts < 2 or config.client_tls is None:
            return
        for name in self._workload.account_names():
            certs_module.issue(self.state.cert_dir, role="user", id=name)

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
        await faults.sever(self.cluster, self._links[worker_id])

    async def _heal(self, worker_id: str) -> None:
        await faults.heal(self.cluster, self._links[worker_id])

    async def restart_database(self, client: ControlPlaneClient, *, how: str) -> None:
        """Stop the database (``fast`` or ``kill``: :func:`ops.faults.restart_database`), keep it
        down for a random time in ``db_down_s``, start it again, and wait for a leader."""
        down_s = self._rng.uniform(*self.settings.db_down_s)
        down_at, up_at = await faults.restart_database(self.cluster, how=how, down_s=down_s)
        self.result.db_outages.append((how, down_at, up_at))
        await self.leader(client)

    async def fail_over_database(self, client: ControlPlaneClient) -> None:
        """SIGKILL the HA database's primary host, wait for the standby's promotion, start the old
        primary again (as the standby) and wait for a leader; recorded as ``db_failover`` from
        the kill to the promotion."""
        if not self.settings.ha_db or not isinstance(self.cluster, LocalCluster):
            raise FaultError("--db-failovers needs --ha-db (and processes, not containers)")
        ha = self.cluster.ha_database()
        killed_at = time.time()
        killed = await trio.to_thread.run_sync(ha.kill_primary)
        try:
            promoted = await trio.to_thread.run_sync(
                functools.partial(ha.wait_for_new_primary, killed, timeout_s=120.0)
            )
        except HaDatabaseError as exc:
            raise FaultError(f"database failover: {exc}") from exc
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
            raise FaultError(f"database failover: {killed.name} did not rejoin: {exc}") from exc

    def _rejoined(self, config: Any) -> tuple[int, int]:
        """Partitions after which the worker came back (registered again, or resumed its paused
        jobs), and after which it also started a job again."""
        rejoined = 0
        count = 0
        for worker_id, _, healed_at in self.result.partitions:
            records = read_jsonl(self.state.work_dir(worker_id) / "agent.jsonl")
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

    async def _add_schedule(self, client: ControlPlaneClient) -> None:
        """Add the run's schedule (``schedule_every_s``), unless 0."""
        every_s = self.settings.schedule_every_s
        if every_s <= 0:
            return
        job = pb.JobSpec(
            name=CHAOS_SCHEDULE_NAME, cpu_millis=100, memory_mb=64, sleep=pb.SleepRuntime(duration_ms=300)
        )
        spec = pb.ScheduleSpec(
            name=CHAOS_SCHEDULE_NAME,
            cron=f"*/{every_s} * * * * *",
            tz="Europe/Berlin",
            job=job,
            starting_deadline_s=CHAOS_SCHEDULE_DEADLINE_S,
        )
        key = f"chaos-schedule-{self.settings.seed}"
        try:
            await client.call("add_schedule", pb.AddScheduleRequest(spec=spec, idempotency_key=key))
        except StockadeError as exc:
            raise FaultError(f"the chaos schedule could not be added: {exc}") from exc

    async def _pause_schedule(self, client: ControlPlaneClient) -> None:
        """Pause the run's schedule once a leader has had time to catch its slots up (the
        checker judges its slots up to the pause), so that its jobs end too."""
        if self.settings.schedule_every_s <= 0:
            return
        await self.leader(client)
        await trio.sleep(2.0 + self.settings.schedule_every_s)
        request = pb.ScheduleNameRequest(
            name=CHAOS_SCHEDULE_NAME, idempotency_key=f"chaos-pause-{self.settings.seed}"
        )
        for _ in range(20):
            try:
                await client.call("pause_schedule", request)
                return
            except StockadeError:
                await trio.sleep(0.5)  # no replica answered (one may be frozen): again
        raise FaultError("the chaos schedule could not be paused")

    async def _wait_finished(self, client: ControlPlaneClient) -> None:
        """Wait until no job is pending, assigned or running, for as long as jobs keep ending:
        the wait gives up once none has ended for ``finish_timeout_s`` (a stall, not a backlog
        the cluster is still working through: a loaded machine stretches the injections, and
        the jobs submitted meanwhile, device jobs above all, may outnumber what the devices run
        in a fixed time)."""
        self.progress("injections done; waiting for every job to finish")
        ended, last_change = -1, trio.current_time()
        told = trio.current_time()
        while trio.current_time() - last_change < self.settings.finish_timeout_s:
            with contextlib.suppress(StockadeError):
                status = await client.call("status", pb.StatusRequest())
                left = sum(c.count for c in status.jobs if c.state in ("pending", "assigned", "running"))
                if not left:
                    return
                done = sum(c.count for c in status.jobs if c.state in ("succeeded", "failed", "cancelled"))
                if done != ended:
                    ended, last_change = done, trio.current_time()
                if trio.current_time() - told >= FINISH_PROGRESS_EVERY_S:
                    self.progress(f"{left} jobs still to finish ({ended} ended)")
                    told = trio.current_time()
            await trio.sleep(0.5)

    # ------------------------------------------------------------ leaders and workers

    async def leader(self, client: ControlPlaneClient) -> tuple[str, int]:
        return await faults.leader(client, timeout_s=self.timeout_s)

    async def kill_leader(self, client: ControlPlaneClient) -> None:
        """SIGKILL the leader, time the takeover, start it again (it returns as a standby)."""
        tls = self.cluster.config().client_tls
        self.result.failovers.append(
            await faults.kill_leader(self.cluster, client, timeout_s=self.timeout_s, tls=tls)
        )
        await trio.to_thread.run_sync(self.restart)

    async def freeze_leader(self, client: ControlPlaneClient, *, in_transaction: bool) -> None:
        """Freeze the leader for ``freeze_s`` (``mid_transaction_freeze_s`` parked inside a
        fenced transaction) and time the takeover."""
        s = self.settings
        failover = await faults.freeze_leader(
            self.cluster,
            client,
            freeze_s=s.mid_transaction_freeze_s if in_transaction else s.freeze_s,
            timeout_s=self.timeout_s,
            tls=self.cluster.config().client_tls,
            fault_dir=self.fault_dir if in_transaction else None,
        )
        self.result.failovers.append(failover)

    def restart(self) -> None:
        """Start again whatever of the cluster does not run (``up``)."""
        self.cluster.up(control_planes=self.settings.control_planes, workers=self.settings.workers)

    async def kill_worker(self, client: ControlPlaneClient) -> None:
        """SIGKILL a worker's agent and start it again at once; counts whether the new agent
        continued its incarnation (took its jobs over, back within the fence time)."""
        await self._restart_worker(client, self._rng.choice([p.id for p in self.cluster.config().workers]))

    async def restart_worker(self, client: ControlPlaneClient) -> None:
        """A planned restart of a worker that runs jobs (any worker when none does): SIGHUP its
        agent (it exits leaving its jobs running), start it again; counts whether the new agent
        continued its incarnation. Not a fault: no event is recorded."""
        if isinstance(self.cluster, DockerCluster):
            raise FaultError(
                "planned restarts keep no job in containers: a container's processes end with it"
            )
        workers = [p.id for p in self.cluster.config().workers]
        try:
            status = await client.call("status", pb.StatusRequest())
            busy = sorted(
                w.id for w in status.workers if w.id in workers and w.state == "alive" and w.job_ids
            )
        except StockadeError:
            busy = []
        victim = self._rng.choice(busy or workers)  # one with jobs, if any: what a restart must keep
        await self._restart_worker(client, victim, signal.SIGHUP)

    async def _restart_worker(
        self, client: ControlPlaneClient, victim: str, sig: signal.Signals = signal.SIGKILL
    ) -> None:
        """Send ``sig`` to ``victim``'s agent, wait for its exit, start it again, and count the
        kill (SIGKILL) or the planned restart (SIGHUP), and whether it continued."""
        before = await self._incarnation(client, victim)
        await faults.wait_gone(
            await faults.send(self.cluster, victim, sig), 10 if sig == signal.SIGKILL else 15
        )
        kill = sig == signal.SIGKILL
        if kill:
            self.result.worker_kills += 1
        else:
            self.result.worker_restarts += 1
        await trio.to_thread.run_sync(self.restart)
        if before is not None and await self._incarnation(client, victim) == before:
            if kill:
                self.result.worker_kills_continued += 1
            else:
                self.result.worker_restarts_continued += 1

    async def _incarnation(self, client: ControlPlaneClient, worker_id: str) -> int | None:
        """``worker_id``'s incarnation as the status shows it; None when no replica answered."""
        try:
            status = await client.call("status", pb.StatusRequest())
        except StockadeError:
            return None
        return next((int(w.incarnation) for w in status.workers if w.id == worker_id), None)


@contextlib.contextmanager
def recording_aborts(errors: list[str]) -> Iterator[None]:
    """Record every :class:`ops.faults.FaultError` raised in the block, bare or in exception
    groups, as a line of ``errors``, and end the block; any other exception propagates."""
    try:
        yield
    except* FaultError as group:
        errors.extend(str(abort) for abort in _leaves(group))


def _leaves(group: BaseExceptionGroup[FaultError]) -> list[BaseException]:
    """The exceptions of ``group``, nested groups flattened."""
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        leaves.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return leaves
