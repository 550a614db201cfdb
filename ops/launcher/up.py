"""``up``, written once for every driver (:class:`ops.launcher.driver.ClusterDriver`): :class:`Launcher`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from ops import rpc
from ops.launcher import ready
from ops.launcher.driver import ClusterDriver, UpResult
from ops.launcher.plan import check_counts, plan
from ops.launcher.state import ClusterConfig, ClusterError, ProcessSpec
from runtime.errors import StockadeError

__all__ = ["READY_TIMEOUT_S", "Launcher", "tls_mode"]

READY_TIMEOUT_S = 60.0
"""How long ``up`` waits for a leader and every worker, in seconds."""

TLS_OPTIONS = {"--insecure": 0, "--certs-dir": 1}
"""The process options that choose plaintext or mutual TLS -> how many values each takes."""


class Launcher:
    """What every driver shares: ``up``, and the addresses of what it runs."""

    def metrics_addresses(self: ClusterDriver) -> dict[str, str]:
        """Process id -> host:port of its Prometheus /metrics; ClusterError where nothing is recorded."""
        return self.config().metrics_addresses()

    def up(
        self: ClusterDriver,
        *,
        control_planes: int | None = None,
        workers: int | None = None,
        timeout_s: float = READY_TIMEOUT_S,
        on_progress: Callable[[str], None] | None = None,
    ) -> UpResult:
        """Bring the cluster to the asked size, start what is not running, and wait until there
        is a leader and every worker is alive. Surplus control planes and workers are stopped
        with SIGTERM and dropped from cluster.json (:func:`ops.launcher.plan.plan`).

        Args:
            control_planes: how many control planes (cp-1..cp-N); None keeps the recorded
                count (3 for a new cluster; 1..9 in containers).
            workers: how many workers (w-1..w-M); None keeps the recorded count (5 for a new
                cluster; 0..200 in containers).
            timeout_s: how long to wait without progress, in seconds
                (:func:`ops.launcher.ready.wait_ready`).
            on_progress: told how far the cluster got while it is waited for (one line).

        Raises:
            ClusterError: a count is out of range or would split a fleet (nothing was
                changed), the folder holds the other kind of cluster, the database or a
                process could not be started, a process exited, or the cluster was not ready
                in time; the message names the log to read.
        """
        self.check_request(control_planes=control_planes, workers=workers)
        with self.state.locked():
            return _up(
                self,
                control_planes=control_planes,
                workers=workers,
                timeout_s=timeout_s,
                on_progress=on_progress,
            )


def _up(
    driver: ClusterDriver,
    *,
    control_planes: int | None,
    workers: int | None,
    timeout_s: float,
    on_progress: Callable[[str], None] | None,
) -> UpResult:
    told = False

    def starting() -> None:
        nonlocal told
        if driver.on_start is not None and not told:
            told = True
            driver.on_start()

    state = driver.state
    state.create()
    previous = state.load()
    driver.check_record(previous)
    live_before = driver.pids(previous) if previous is not None else {}
    cert_dir = None if driver.insecure else str(state.cert_dir)
    previous, tls_args = tls_mode(previous, cert_dir, running=bool(live_before), root=state.root)
    driver.prepare(previous, live_before)
    # Refuse an impossible count before anything (the database included) is started.
    check_counts(previous, control_planes=control_planes, workers=workers)
    database = driver.start_database(previous, live_before, starting)
    the_plan = plan(
        previous,
        state=state,
        database_url=database.url,
        pg_port=database.pg_port,
        control_planes=control_planes,
        workers=workers,
        running=live_before,
        options=driver.launch_options(tls_args),
        free_port=driver.port_source(),
    )
    config = driver.recorded(attrs.evolve(the_plan.config, cert_dir=cert_dir))
    if cert_dir is not None:
        driver.issue_certificates(config)
    # Recorded before the surplus is stopped, so an interrupted up does not start them again
    # (down still finds them by the state folder in their environment).
    state.save(config)
    stopped = driver.stop(the_plan.stop, previous)
    driver.forget(the_plan.removed)

    incarnations_before: dict[str, int] = {}
    if live_before:
        with contextlib.suppress(StockadeError):
            before = rpc.status(
                config.control_plane_addresses,
                timeout_s=1.0,
                tls=config.client_tls,
                limit_s=ready.OVERRUN_GRACE_S,
            )
            incarnations_before = {w.id: w.incarnation for w in before.workers}
    started = []
    started_at: dict[str, float] = {}
    for spec in driver.to_start(config, live_before):
        starting()
        started_at[spec.id] = time.time()
        driver.start(spec, config)
        started.append(spec.id)
    restarted = {w.id: p for p in started for w in config.workers_in(p)}
    status = ready.wait_ready(
        state,
        config,
        restarted={w: incarnations_before.get(w, 0) for w in restarted},
        timeout_s=timeout_s,
        check_exited=lambda: driver.check_exited(config),
        started_at={w: started_at[p] for w, p in restarted.items()},
        on_progress=on_progress,
    )
    return UpResult(
        config=config,
        started=tuple(started),
        database_started=database.started,
        status=status,
        pids=driver.pids(config),
        stopped=tuple(p.id for p in the_plan.stop),
        killed=tuple(stopped.killed),
        stop_deadlines_s=stopped.deadlines_s,
        removed=the_plan.removed,
    )


def tls_mode(
    previous: ClusterConfig | None, cert_dir: str | None, *, running: bool, root: Path
) -> tuple[ClusterConfig | None, tuple[str, ...]]:
    """``previous`` (its processes' TLS options rewritten when the mode changes) and the TLS
    options of new processes, ``("--certs-dir", cert_dir)`` or ``("--insecure",)`` for a None
    ``cert_dir``. ClusterError where the mode changes while processes of the record run."""
    tls_args = ("--insecure",) if cert_dir is None else ("--certs-dir", cert_dir)
    if previous is not None and previous.cert_dir != cert_dir:
        if running:
            mode = "with --insecure" if previous.cert_dir is None else "with TLS"
            raise ClusterError(f"the cluster of {root} runs {mode}; run `stockade down` first to change that")
        previous = _with_tls_args(previous, cert_dir, tls_args)
    return previous, tls_args


def _with_tls_args(config: ClusterConfig, cert_dir: str | None, tls_args: tuple[str, ...]) -> ClusterConfig:
    def replaced(spec: ProcessSpec) -> ProcessSpec:
        kept: list[str] = []
        skip = 0
        for arg in spec.args:
            if skip:
                skip -= 1
            elif arg in TLS_OPTIONS:
                skip = TLS_OPTIONS[arg]
            else:
                kept.append(arg)
        return attrs.evolve(spec, args=(*kept, *tls_args))

    return attrs.evolve(
        config,
        processes=[replaced(p) for p in config.processes],
        retired_control_planes=[replaced(p) for p in config.retired_control_planes],
        cert_dir=cert_dir,
    )
