"""What a chaos run puts on the cluster and reads from it beside its faults: the jobs it submits
(:class:`Workload`, with what the control planes acknowledged and the final state each job must
reach) and the samplers of the database during the run (:func:`sample_devices`,
:func:`sample_partial_gangs`). The run itself: :class:`ops.chaos.Harness`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from ops import checker
from ops.chaos_settings import (
    DEVICE_JOB_DURATION_S,
    DEVICE_JOB_GPUS,
    FAILING_MAX_ATTEMPTS,
    GANG_EVERY,
    GANG_MAX_ATTEMPTS,
    GANG_SAMPLE_EVERY_S,
    HIGH_PRIORITY,
    HIGH_PRIORITY_EVERY,
    PREEMPTION_JOB_DURATION_S,
    ChaosSettings,
)
from ops.chaosresult import ChaosResult
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError
from runtime.tls import TlsFiles

GANG_DEVICE_SHARE = 0.5
"""With ``devices``, the share of chaos gangs whose tasks ask gpu."""
GANG_TASK_GPUS = (1, 2)
"""The gpu each task of such a gang asks: uniform, inclusive."""


@attrs.define
class Workload:
    """The jobs of one chaos run, drawn from ``rng`` (the run's seed); gangs submitted are
    counted in ``result``."""

    settings: ChaosSettings
    result: ChaosResult
    rng: random.Random
    submitted: int = 0
    """Jobs the control planes acknowledged."""
    acknowledged: list[int] = attrs.field(factory=list)
    """Job ids the control planes acknowledged submissions with."""
    expected: dict[int, str] = attrs.field(factory=dict)
    """Job id -> the final state it must reach (jobs made to fail: failed; others: succeeded)."""

    def account_names(self) -> list[str]:
        """The accounts the run submits as (chaos-1, chaos-2, ...: ``accounts`` of them)."""
        return [f"chaos-{k}" for k in range(1, self.settings.accounts + 1)]

    async def submit(
        self, addresses: Sequence[str], tls: TlsFiles | None, cert_dir: Path, stop: trio.Event
    ) -> None:
        """Submit jobs at ``submit_rate_per_s`` to the control planes at ``addresses`` until
        ``stop``: with ``accounts`` > 1 and TLS, as each account in turn (its certificate in
        ``cert_dir``, its weight and top priority set first); a submission no replica answers
        is skipped."""
        s = self.settings
        if s.accounts > 1 and tls is not None:
            operator = ControlPlaneClient(addresses, timeout_s=2.0, tls=tls)
            try:
                for k, name in enumerate(self.account_names()):
                    with contextlib.suppress(StockadeError):
                        await operator.call(
                            "set_account",
                            pb.SetAccountRequest(
                                name=name,
                                has_weight=True,
                                weight=float(1 + k % 3),
                                has_max_priority=True,
                                max_priority=HIGH_PRIORITY,
                            ),
                        )
            finally:
                operator.close()
            clients = [
                ControlPlaneClient(addresses, timeout_s=2.0, tls=TlsFiles.in_dir(cert_dir, name))
                for name in self.account_names()
            ]
        else:
            clients = [ControlPlaneClient(addresses, timeout_s=2.0, tls=tls)]
        try:
            await self._submit_as(clients, stop)
        finally:
            for client in clients:
                client.close()

    async def _submit_as(self, clients: Sequence[ControlPlaneClient], stop: trio.Event) -> None:
        s = self.settings
        interval = 1.0 / s.submit_rate_per_s
        next_at = trio.current_time()
        while not stop.is_set():
            # With preemption, larger and longer jobs keep the cluster full, so the jobs of
            # priority 10 often fit nowhere.
            low, high = PREEMPTION_JOB_DURATION_S if s.preemption else s.job_duration_s
            duration_s = self.rng.uniform(low, high)
            fails = self.rng.random() < s.failing_share
            gang = s.gangs and (self.submitted + 1) % GANG_EVERY == 0
            spec = pb.JobSpec(
                name=f"chaos-{self.submitted + 1}",
                cpu_millis=self.rng.choice([1000, 2000, 4000] if s.preemption else [100, 250, 500, 1000]),
                memory_mb=self.rng.choice([64, 128, 256, 512]),
            )
            if s.devices and self.rng.random() < s.device_share:
                # A device job: 1 to 4 of a worker's 8 fake gpu, running longer.
                spec.resources = [pb.ResourceCount(name="gpu", count=self.rng.randint(*DEVICE_JOB_GPUS))]
                duration_s = self.rng.uniform(*DEVICE_JOB_DURATION_S)
            if s.preemption and (self.submitted + 1) % HIGH_PRIORITY_EVERY == 0:
                spec.cpu_millis, spec.priority = 4000, HIGH_PRIORITY
            client = clients[self.submitted % len(clients)]
            if fails:
                # A job made to fail: retried once, it must end failed, both runs spent.
                spec.command = pb.CommandRuntime(argv=["sh", "-c", f"sleep {duration_s:.2f}; exit 3"])
                spec.max_attempts = FAILING_MAX_ATTEMPTS
                spec.retry_backoff_ms = 200
            else:
                spec.sleep = pb.SleepRuntime(duration_ms=int(1000 * duration_s))
            if gang:
                # A gang of sleep tasks that may meet worker kills: its final state is not judged
                # by the submitter (a kill breaks its attempt; with count_lost off it spends none).
                fails = False
                spec.sleep = pb.SleepRuntime(duration_ms=int(1000 * duration_s))
                spec.command = None
                spec.tasks = self.rng.randint(2, 8)
                # Spread only where the workers left after a kill hold it (else it waits for the
                # killed worker's return, which a run with few workers may outlast).
                spec.spread = self.result.gangs_submitted % 2 == 0 and spec.tasks < s.workers
                spec.max_attempts = GANG_MAX_ATTEMPTS
                # With devices, some gangs ask 1 or 2 gpu for each task (docs/gangs.md, "Devices").
                asks_gpu = s.devices and self.rng.random() < GANG_DEVICE_SHARE
                gpus = self.rng.randint(*GANG_TASK_GPUS) if asks_gpu else 0
                spec.resources = [pb.ResourceCount(name="gpu", count=gpus)] if gpus else []
            try:
                reply = await client.call("submit_job", pb.SubmitJobRequest(spec=spec))
                self.submitted += 1
                self.acknowledged.append(int(reply.job_id))
                if gang:
                    self.result.gangs_submitted += 1
                else:
                    self.expected[int(reply.job_id)] = "failed" if fails else "succeeded"
            except StockadeError:
                pass  # no replica answered this once (one may be frozen): try the next
            next_at += interval
            await trio.sleep_until(max(next_at, trio.current_time()))


async def sample_devices(database_url: str, result: ChaosResult, stop: trio.Event) -> None:
    """Every half second until ``stop`` (every job finished): the gpu in use and offered by the
    alive workers and the gpu jobs waiting, from the database in one snapshot
    (:func:`ops.checker.device_use`; a read the database does not answer is skipped)."""
    while not stop.is_set():
        with contextlib.suppress(StockadeError):
            result.device_samples.append(await checker.device_use(database_url))
        with trio.move_on_after(0.5):
            await stop.wait()


async def sample_partial_gangs(database_url: str, result: ChaosResult, stop: trio.Event) -> None:
    """Read the view ``partial_gangs`` every :data:`ops.chaos_settings.GANG_SAMPLE_EVERY_S` until ``stop``,
    counting the reads and those that found a partial gang (docs/gangs.md); a read the
    database does not answer (it may be restarting) is skipped."""
    while not stop.is_set():
        with contextlib.suppress(StockadeError):
            found = await checker.partial_gangs(database_url)
            result.gang_samples += 1
            result.samples_with_partial_gangs += found > 0
        with trio.move_on_after(GANG_SAMPLE_EVERY_S):
            await stop.wait()
