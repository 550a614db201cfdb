"""The local cluster: control planes and worker agents as background processes on this machine.

``stockade up`` / ``stockade down`` and the end-to-end tests drive a :class:`LocalCluster`.
Everything it knows lives in one state folder (``.stockade/`` in the current directory, or
``$STOCKADE_STATE_DIR``)::

    cluster.json    the database URL, every process's id, kind, address and arguments, and
                    the workers hosted in fleets (id, address, capacity, fleet)
    pg/             the embedded PostgreSQL server (ops.pg), unless DATABASE_URL is given
    logs/<id>.log   each process's stdout and stderr
    pids/<id>.pid   each process's pid
    fleets/<id>.json  each fleet's spec file (the workers it hosts; see agent.fleet)
    workers/<id>/   each worker's work dir (agent.jsonl, jobs/<job>-<assignment>/std*.log)

Each process is ``python -m ops.cli cp|agent|fleet ...`` in its own session, so closing the
terminal does not stop the cluster. Workers run one per ``agent`` process, or, with
``fleet_size`` K > 0, K per ``fleet`` process (fleet-1, fleet-2, ...): each still has its own
id, port, registration, heartbeats and work dir, but a fleet lives and dies as one process.
A pid file counts only while it names a live process whose command line is that process's
(pids are reused). Every process carries the state
folder in its environment (``STOCKADE_CLUSTER_DIR``), so ``down`` can find and stop
stragglers whose pid file was lost, including the agents' job processes.

``up`` is idempotent: the first run picks free ports and records them; later runs reuse
them, leave live processes alone and start dead ones again (a killed leader comes back as a
standby, a killed worker registers a new incarnation).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil
import trio

from ops import rpc
from ops.config import (
    CONTROL_PLANES_ENV,
    STATE_DIR_ENV,
    ClusterError,
    default_state_dir,
    parse_addresses,
    resolve_addresses,
)
from ops.pg import (
    EmbeddedPostgres,
    EmbeddedPostgresError,
    PostgresStartError,
    database_url_from_env,
    free_port,
)
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import StockadeError, Unavailable
from runtime.text import tail_lines

__all__ = [
    "CONTROL_PLANES_ENV",
    "MARKER_ENV",
    "READY_TIMEOUT_S",
    "STATE_DIR_ENV",
    "STOP_TIMEOUT_S",
    "WORKER_CAPACITIES",
    "ClusterConfig",
    "ClusterError",
    "DownReport",
    "LocalCluster",
    "ProcessSpec",
    "StateDir",
    "UpResult",
    "WorkerSpec",
    "default_state_dir",
    "parse_addresses",
    "resolve_addresses",
]

MARKER_ENV = "STOCKADE_CLUSTER_DIR"
"""Set in every process the launcher starts, to the absolute state folder."""

LISTEN_HOST = "127.0.0.1"
"""Every process of the local cluster listens here."""

WORKER_CAPACITIES: tuple[tuple[int, int], ...] = (
    (4000, 8192),
    (8000, 16384),
    (8000, 16384),
    (12000, 24576),
    (16000, 32768),
)
"""(cpu_millis, memory_mb) of w-1, w-2, ...; cycles for more workers."""

READY_TIMEOUT_S = 60.0
"""How long ``up`` waits for a leader and every worker, in seconds."""

STOP_TIMEOUT_S = 10.0
"""How long ``down`` waits after SIGTERM before it sends SIGKILL, in seconds."""

_POLL_INTERVAL_S = 0.2
_FRESH_HEARTBEAT_S = 2.0
_LOG_TAIL_LINES = 20
_CONFIG_VERSION = 1
_PORT_ATTEMPTS = 3


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class ProcessSpec:
    """One process of the cluster, as recorded in cluster.json."""

    id: str
    """``cp-1``..., ``w-1``..., ``fleet-1``..."""
    kind: str
    """``cp``, ``agent`` or ``fleet``: the ops.cli subcommand it runs."""
    address: str
    """host:port of its gRPC service; empty for a fleet (its workers have one each)."""
    args: tuple[str, ...] = attrs.field(converter=_str_tuple)
    """The arguments after ``python -m ops.cli``."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "address": self.address, "args": list(self.args)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessSpec:
        return cls(id=data["id"], kind=data["kind"], address=data["address"], args=data["args"])

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


def _spec_tuple(items: Iterable[ProcessSpec]) -> tuple[ProcessSpec, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class WorkerSpec:
    """One worker of the cluster, whether it runs as an agent process or in a fleet."""

    id: str
    """``w-1``..."""
    address: str
    """host:port its Worker service listens on."""
    cpu_millis: int
    """CPU it offers, in millicores."""
    memory_mb: int
    """Memory it offers, in MiB."""
    process_id: str
    """The process that runs it: its own id for an agent process, else its fleet's id."""
    advertise_address: str = ""
    """host:port the leader should call, when not ``address`` (recorded for fleet workers;
    an agent process has it on its command line)."""
    control_planes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Control-plane addresses of its own, when not the cluster's (as ``advertise_address``)."""

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def fleet(self) -> str | None:
        """The id of the fleet that hosts it, or None when it is an agent process of its own."""
        return None if self.process_id == self.id else self.process_id

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "address": self.address,
            "cpu_millis": self.cpu_millis,
            "memory_mb": self.memory_mb,
            "process_id": self.process_id,
            "advertise_address": self.advertise_address,
            "control_planes": list(self.control_planes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerSpec:
        return cls(
            id=data["id"],
            address=data["address"],
            cpu_millis=int(data["cpu_millis"]),
            memory_mb=int(data["memory_mb"]),
            process_id=data["process_id"],
            advertise_address=data.get("advertise_address", ""),
            control_planes=data.get("control_planes", ()),
        )

    @classmethod
    def of_agent(cls, spec: ProcessSpec) -> WorkerSpec:
        """The worker an ``agent`` process runs, read from its arguments."""
        return cls(
            id=spec.id,
            address=spec.address,
            cpu_millis=int(_option(spec.args, "--cpu-millis") or 0),
            memory_mb=int(_option(spec.args, "--memory-mb") or 0),
            process_id=spec.id,
        )


def _option(args: Sequence[str], name: str) -> str | None:
    """The value after the last ``name`` in ``args`` (or of ``name=value``), or None."""
    found = None
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(name + "="):
            found = arg.partition("=")[2]
    return found


def _worker_tuple(items: Iterable[WorkerSpec]) -> tuple[WorkerSpec, ...]:
    return tuple(items)


def _worker_order(worker_id: str) -> tuple[int, str]:
    """``w-10`` after ``w-9``: by number, then by text."""
    number = worker_id.rpartition("-")[2]
    return (int(number) if number.isdigit() else 0, worker_id)


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """What cluster.json holds."""

    database_url: str
    embedded_pg_port: int | None
    """Port of the embedded server under ``pg/``; None when the database is DATABASE_URL's."""
    processes: tuple[ProcessSpec, ...] = attrs.field(converter=_spec_tuple)
    """The operating-system processes: control planes, agents and fleets."""
    hosted_workers: tuple[WorkerSpec, ...] = attrs.field(default=(), converter=_worker_tuple)
    """The workers that run in fleets (those in agent processes are in ``processes``)."""

    @property
    def control_planes(self) -> list[ProcessSpec]:
        return [p for p in self.processes if p.kind == "cp"]

    @property
    def workers(self) -> list[WorkerSpec]:
        """Every worker, one entry per worker id, in agent processes or in fleets, by number."""
        lone = [WorkerSpec.of_agent(p) for p in self.processes if p.kind == "agent"]
        return sorted([*lone, *self.hosted_workers], key=lambda w: _worker_order(w.id))

    @property
    def fleets(self) -> list[ProcessSpec]:
        """The fleet processes, each hosting several workers (:meth:`workers_in`)."""
        return [p for p in self.processes if p.kind == "fleet"]

    @property
    def control_plane_addresses(self) -> list[str]:
        return [p.address for p in self.control_planes]

    def workers_in(self, process_id: str) -> list[WorkerSpec]:
        """The workers the process ``process_id`` runs: its own for an agent, a fleet's, or none."""
        return [w for w in self.workers if w.process_id == process_id]

    def worker(self, worker_id: str) -> WorkerSpec:
        """The worker ``worker_id``, wherever it runs.

        Raises:
            ClusterError: no such worker in this cluster.
        """
        for worker in self.workers:
            if worker.id == worker_id:
                return worker
        known = ", ".join(w.id for w in self.workers) or "none"
        raise ClusterError(f"{worker_id} is not a worker of this cluster (it has {known})")

    def address_of(self, process_or_worker_id: str) -> str:
        """host:port of a control plane or a worker (also one in a fleet).

        Raises:
            ClusterError: neither a control plane nor a worker of this cluster.
        """
        for spec in self.control_planes:
            if spec.id == process_or_worker_id:
                return spec.address
        return self.worker(process_or_worker_id).address

    def process(self, process_id: str) -> ProcessSpec:
        """The process named ``process_id``.

        Raises:
            ClusterError: no such process in this cluster; for a worker hosted in a fleet,
                the message names the fleet (signal the fleet, which stops all its workers).
        """
        for spec in self.processes:
            if spec.id == process_id:
                return spec
        for worker in self.hosted_workers:
            if worker.id == process_id:
                together = [w.id for w in self.workers_in(worker.process_id)]
                raise ClusterError(
                    f"{process_id} runs in {worker.process_id} (with {len(together) - 1} other workers: "
                    f"{', '.join(together)}); it has no process of its own: kill the fleet, which "
                    "stops all of them"
                )
        known = ", ".join(p.id for p in self.processes)
        raise ClusterError(f"{process_id} is not a process of this cluster (it has {known})")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _CONFIG_VERSION,
            "database_url": self.database_url,
            "embedded_pg_port": self.embedded_pg_port,
            "processes": [p.to_json() for p in self.processes],
            "hosted_workers": [w.to_json() for w in self.hosted_workers],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterConfig:
        return cls(
            database_url=data["database_url"],
            embedded_pg_port=data.get("embedded_pg_port"),
            processes=[ProcessSpec.from_json(p) for p in data["processes"]],
            hosted_workers=[WorkerSpec.from_json(w) for w in data.get("hosted_workers", [])],
        )


@attrs.frozen
class StateDir:
    """The paths inside one state folder."""

    root: Path = attrs.field(converter=lambda p: Path(p).absolute())

    @property
    def config_path(self) -> Path:
        return self.root / "cluster.json"

    @property
    def pg_dir(self) -> Path:
        return self.root / "pg"

    def log_path(self, process_id: str) -> Path:
        return self.root / "logs" / f"{process_id}.log"

    @property
    def events_path(self) -> Path:
        """The fault record (``events.jsonl``) the checker reads: kills, freezes, partitions."""
        return self.root / "events.jsonl"

    def record_fault(self, kind: str, target: str, at: float, until: float | None = None) -> None:
        """Append one fault (``kind`` kill, freeze or partition of process ``target``; Unix
        seconds) to :attr:`events_path`."""
        line = {"kind": kind, "target": target, "at": at, "until": at if until is None else until}
        with self.events_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def pid_path(self, process_id: str) -> Path:
        return self.root / "pids" / f"{process_id}.pid"

    def work_dir(self, worker_id: str) -> Path:
        return self.root / "workers" / worker_id

    def fleet_spec_path(self, fleet_id: str) -> Path:
        """The spec file (``agent.fleet``) listing the workers fleet ``fleet_id`` hosts."""
        return self.root / "fleets" / f"{fleet_id}.json"

    def create(self) -> None:
        for sub in ("logs", "pids", "workers", "fleets"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive flock on ``.lock``, so two ``up``/``down`` never interleave."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".lock").open("a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def load(self) -> ClusterConfig | None:
        """The recorded cluster, or None when there is none.

        Raises:
            ClusterError: cluster.json exists but cannot be read.
        """
        try:
            text = self.config_path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ClusterError(f"cannot read {self.config_path}: {exc.strerror}") from exc
        try:
            return ClusterConfig.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise ClusterError(
                f"{self.config_path} is not a Stockade cluster file ({exc}); remove it and run up again"
            ) from exc

    def save(self, config: ClusterConfig) -> None:
        """Write cluster.json atomically, readable by this user only (the URL may hold a password)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_name(self.config_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(config.to_json(), out, indent=2)
            out.write("\n")
        os.replace(tmp, self.config_path)


@attrs.frozen(kw_only=True)
class UpResult:
    """What ``up`` did."""

    config: ClusterConfig
    started: tuple[str, ...]
    """Ids of the processes this call started (the others were already running)."""
    database_started: bool
    """True when this call started the embedded PostgreSQL server."""
    status: pb.StatusReply
    """The status that showed the cluster ready."""
    pids: dict[str, int]


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
    """

    state: StateDir = attrs.field(converter=lambda s: s if isinstance(s, StateDir) else StateDir(s))
    database_url: str | None = None
    cp_args: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    agent_args: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    fleet_size: int = 0
    worker_capacities: tuple[tuple[int, int], ...] | None = None
    launcher: tuple[str, ...] = attrs.field(default=("-m", "ops.cli"), converter=_str_tuple)
    extra_env: dict[str, str] = attrs.field(factory=dict)
    worker_network: Callable[[str], tuple[str, list[str]]] | None = None
    metrics: bool = False
    """Give every new control plane a ``--metrics-port`` (see :func:`metrics_address`)."""
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
        try:
            pid = int(self.state.pid_path(spec.id).read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                self._reap(spec.id)
                return None
            cmdline = process.cmdline()
        except psutil.Error:
            return None
        if _matches(cmdline, spec):
            return process
        return None

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
        self, *, control_planes: int = 3, workers: int = 5, timeout_s: float = READY_TIMEOUT_S
    ) -> UpResult:
        """Start what is not running and wait until there is a leader and every worker is alive.

        Args:
            control_planes: how many control planes (cp-1..cp-N) the cluster has at least.
            workers: how many workers (w-1..w-M) the cluster has at least.
            timeout_s: how long to wait for the cluster to be ready, in seconds.

        Returns:
            what was started and the status that showed the cluster ready.

        Raises:
            ClusterError: the database or a process could not be started, a process exited,
                or the cluster was not ready in time; the message names the log to read.
        """
        if control_planes < 1:
            raise ClusterError(f"control_planes must be >= 1, got {control_planes}")
        if workers < 0:
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
            return self._up(control_planes=control_planes, workers=workers, timeout_s=timeout_s)

    def _up(self, *, control_planes: int, workers: int, timeout_s: float) -> UpResult:
        self.state.create()
        previous = self.state.load()
        live_before = self.pids(previous) if previous is not None else {}
        database_url, pg_port, database_started = self._start_database(previous, live_before)
        config = self._plan(previous, database_url, pg_port, control_planes, workers)
        self.state.save(config)

        incarnations_before: dict[str, int] = {}
        if live_before:
            with contextlib.suppress(StockadeError):
                before = rpc.status(config.control_plane_addresses, timeout_s=1.0)
                incarnations_before = {w.id: w.incarnation for w in before.workers}
        started = []
        for spec in config.processes:
            if self.live_process(spec) is None:
                self._start(spec, config)
                started.append(spec.id)
        restarted = [w.id for p in started for w in config.workers_in(p)]
        status = self.wait_ready(
            config,
            restarted_workers={w: incarnations_before.get(w, 0) for w in restarted},
            timeout_s=timeout_s,
        )
        return UpResult(
            config=config,
            started=tuple(started),
            database_started=database_started,
            status=status,
            pids=self.pids(config),
        )

    def _start_database(
        self, previous: ClusterConfig | None, live_before: dict[str, int]
    ) -> tuple[str, int | None, bool]:
        """The database URL, the embedded server's port (None if external), whether it was started."""
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
            port = recorded_port or free_port()
            server = EmbeddedPostgres(data_dir=self.state.pg_dir, port=port, fast_unsafe=False)
            was_running = server.is_running()
            try:
                url = server.start()
            except PostgresStartError as exc:
                # A port picked now may be taken before the server binds it: pick another.
                if recorded_port is None and "already in use" in str(exc) and attempt < _PORT_ATTEMPTS:
                    continue
                raise ClusterError(f"embedded PostgreSQL did not start: {exc}") from exc
            return url, port, not was_running
        raise AssertionError("unreachable")

    def _plan(
        self,
        previous: ClusterConfig | None,
        database_url: str,
        pg_port: int | None,
        control_planes: int,
        workers: int,
    ) -> ClusterConfig:
        """The recorded processes, plus new ones up to the asked counts, on fresh ports."""
        recorded = {p.id: p for p in previous.processes} if previous is not None else {}
        hosted = {w.id: w for w in previous.hosted_workers} if previous is not None else {}
        used_ports = {p.port for p in recorded.values() if p.address} | {w.port for w in hosted.values()}
        if pg_port:
            used_ports.add(pg_port)
        capacities = self.worker_capacities or WORKER_CAPACITIES

        def new_port() -> int:
            while True:
                port = free_port()
                if port not in used_ports:
                    used_ports.add(port)
                    return port

        cps = [recorded.get(f"cp-{i}") for i in range(1, control_planes + 1)]
        cp_specs: list[ProcessSpec] = []
        for i, spec in enumerate(cps, start=1):
            if spec is None:
                cp_id = f"cp-{i}"
                port = new_port()
                spec = ProcessSpec(
                    id=cp_id,
                    kind="cp",
                    address=f"{LISTEN_HOST}:{port}",
                    args=("cp", "--id", cp_id, "--host", LISTEN_HOST, "--port", str(port), *self.cp_args),
                )
                if self.metrics:
                    spec = attrs.evolve(spec, args=(*spec.args, "--metrics-port", str(new_port())))
            cp_specs.append(spec)
        extra_cps = [p for p in recorded.values() if p.kind == "cp" and p not in cp_specs]
        cp_specs += extra_cps
        addresses = ",".join(p.address for p in cp_specs)

        def rotated(index: int) -> list[str]:
            # Each worker heartbeats to the first control plane that answers; rotating the
            # list spreads the heartbeats instead of sending them all to cp-1.
            shift = index % len(cp_specs)
            return [p.address for p in cp_specs[shift:] + cp_specs[:shift]]

        worker_specs: list[ProcessSpec] = []
        new_hosted: list[WorkerSpec] = []
        routed: list[str]
        for i in range(1, workers + 1):
            worker_id = f"w-{i}"
            if worker_id in hosted:
                continue
            spec = recorded.get(worker_id)
            if spec is None and self.fleet_size > 0:
                cpu_millis, memory_mb = capacities[(i - 1) % len(capacities)]
                advertise, routed = "", rotated(i)
                if self.worker_network is not None:
                    advertise, routed = self.worker_network(worker_id)
                new_hosted.append(
                    WorkerSpec(
                        id=worker_id,
                        address=f"{LISTEN_HOST}:{new_port()}",
                        cpu_millis=cpu_millis,
                        memory_mb=memory_mb,
                        process_id="",  # its fleet, assigned below
                        advertise_address=advertise,
                        control_planes=routed,
                    )
                )
                continue
            if spec is None:
                port = new_port()
                cpu_millis, memory_mb = capacities[(i - 1) % len(capacities)]
                spec = ProcessSpec(
                    id=worker_id,
                    kind="agent",
                    address=f"{LISTEN_HOST}:{port}",
                    args=(
                        "agent",
                        "--id",
                        worker_id,
                        "--host",
                        LISTEN_HOST,
                        "--port",
                        str(port),
                        "--cpu-millis",
                        str(cpu_millis),
                        "--memory-mb",
                        str(memory_mb),
                        "--control-planes",
                        ",".join(rotated(i)),
                        "--work-dir",
                        str(self.state.work_dir(worker_id)),
                        *self.agent_args,
                    ),
                )
                if self.worker_network is not None:
                    advertise, routed = self.worker_network(worker_id)
                    args = list(spec.args)
                    args[args.index("--control-planes") + 1] = ",".join(routed)
                    spec = attrs.evolve(spec, args=(*args, "--advertise-address", advertise))
            worker_specs.append(spec)
        worker_specs += [p for p in recorded.values() if p.kind == "agent" and p not in worker_specs]

        # Fleets: the recorded ones as they are (a running fleet is never changed), then new
        # workers K per new fleet, numbered after the highest recorded one.
        fleet_specs = [p for p in recorded.values() if p.kind == "fleet"]
        numbers = [int(n) for p in fleet_specs if (n := p.id.rpartition("-")[2]).isdigit()]
        next_number = max(numbers, default=0) + 1
        hosted_specs = list(hosted.values())
        for start in range(0, len(new_hosted), max(1, self.fleet_size)):
            fleet_id = f"fleet-{next_number}"
            next_number += 1
            members = [
                attrs.evolve(w, process_id=fleet_id) for w in new_hosted[start : start + self.fleet_size]
            ]
            hosted_specs += members
            fleet_specs.append(
                ProcessSpec(
                    id=fleet_id,
                    kind="fleet",
                    address="",
                    args=(
                        "fleet",
                        "--id",
                        fleet_id,
                        "--spec",
                        str(self.state.fleet_spec_path(fleet_id)),
                        "--host",
                        LISTEN_HOST,
                        "--control-planes",
                        addresses,
                        *self.agent_args,
                    ),
                )
            )
        return ClusterConfig(
            database_url=database_url,
            embedded_pg_port=pg_port,
            processes=[*cp_specs, *worker_specs, *fleet_specs],
            hosted_workers=hosted_specs,
        )

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
        for port, owner in ports:
            if not _port_free(port):
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
        self.state.pid_path(spec.id).write_text(f"{process.pid}\n")

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
        timeout_s: float = READY_TIMEOUT_S,
    ) -> pb.StatusReply:
        """Poll until every control plane answers, one leads, and every worker is alive.

        A worker counts once the status shows it alive with a fresh heartbeat, and, for a
        worker in ``restarted_workers`` (id -> incarnation before the restart), under a new
        incarnation.

        Raises:
            ClusterError: a process exited, or ``timeout_s`` passed; names what is missing
                and the log files to read.
        """
        restarted = restarted_workers or {}

        async def poll() -> tuple[pb.StatusReply | None, list[str]]:
            deadline = trio.current_time() + timeout_s
            missing: list[str] = ["no control plane answered"]
            while True:
                self._check_exited(config)
                status, missing = await self._readiness(config, restarted)
                if not missing:
                    return status, []
                if trio.current_time() >= deadline:
                    return status, missing
                await trio.sleep(_POLL_INTERVAL_S)

        async def body(_client: ControlPlaneClient) -> tuple[pb.StatusReply | None, list[str]]:
            return await poll()

        status, missing = rpc.with_client(config.control_plane_addresses, body)
        if missing or status is None:
            raise ClusterError(
                f"cluster not ready after {timeout_s:g} s: "
                + "; ".join(missing)
                + " (the processes keep running: `stockade down` stops them)"
            )
        return status

    async def _readiness(
        self, config: ClusterConfig, restarted: dict[str, int]
    ) -> tuple[pb.StatusReply | None, list[str]]:
        missing: list[str] = []
        status: pb.StatusReply | None = None
        for spec in config.control_planes:
            client = ControlPlaneClient([spec.address], timeout_s=1.0)
            try:
                reply = await client.call("status", pb.StatusRequest())
            except Unavailable:
                missing.append(
                    f"{spec.id} does not answer at {spec.address} (read {self.state.log_path(spec.id)})"
                )
                continue
            finally:
                client.close()
            status = status or reply
        if status is None:
            return None, missing
        if not status.leader:
            logs = ", ".join(str(self.state.log_path(p.id)) for p in config.control_planes)
            missing.append(f"no leader elected (read {logs})")
        by_id = {w.id: w for w in status.workers}
        for worker_spec in config.workers:
            worker = by_id.get(worker_spec.id)
            log_hint = f"(read {self.state.log_path(worker_spec.process_id)})"
            if worker is None:
                missing.append(f"{worker_spec.id} not registered {log_hint}")
            elif (
                worker.state != "alive"
                or worker.last_heartbeat_age_s > _FRESH_HEARTBEAT_S
                or (worker_spec.id in restarted and worker.incarnation == restarted[worker_spec.id])
            ):
                missing.append(f"{worker_spec.id} not registered alive yet {log_hint}")
        return status, missing

    def _check_exited(self, config: ClusterConfig) -> None:
        """Raise ClusterError naming the first process this object started that has exited."""
        for spec in config.processes:
            process = self._children.get(spec.id)
            if process is not None and process.poll() is not None:
                log_path = self.state.log_path(spec.id)
                raise ClusterError(
                    f"{spec.id} exited with code {process.returncode}; last lines of {log_path}:\n"
                    + _tail(log_path, _LOG_TAIL_LINES)
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

    def down(self, *, timeout_s: float = STOP_TIMEOUT_S) -> DownReport:
        """SIGTERM every process, SIGKILL those still alive after ``timeout_s``, stop the database.

        The workers' processes (agents, fleets) go first, and the control planes only once
        those have exited: a worker stopped cleanly stops its jobs and then tells a control
        plane that it left, so the cluster does not count it as dead later. Each group gets
        ``timeout_s``. Safe when nothing runs. Afterwards no process carrying this state
        folder's marker is left (checked with psutil).

        Raises:
            ClusterError: a process or the database survived every attempt to stop it.
        """
        if not self.state.root.is_dir():
            return DownReport(terminated=(), killed=(), stragglers=(), database_stopped=False)
        with self.state.locked():
            return self._down(timeout_s=timeout_s)

    def _down(self, *, timeout_s: float) -> DownReport:
        config = self.state.load()
        workers: dict[str, psutil.Process] = {}
        control_planes: dict[str, psutil.Process] = {}
        if config is not None:
            for spec in config.processes:
                process = self.live_process(spec)
                if process is not None:
                    (control_planes if spec.kind == "cp" else workers)[spec.id] = process
        running = {**workers, **control_planes}
        killed: list[str] = []
        for group in (workers, control_planes):
            for process in group.values():
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.terminate()
            _, alive = psutil.wait_procs(list(group.values()), timeout=timeout_s)
            killed += [pid_id for pid_id, p in group.items() if p in alive]
            for process in alive:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
            psutil.wait_procs(alive, timeout=5.0)
        for process_id in running:
            self._reap(process_id)
        stragglers = self._kill_marked()
        for pid_file in (self.state.root / "pids").glob("*.pid"):
            pid_file.unlink(missing_ok=True)

        database_stopped = False
        port = config.embedded_pg_port if config is not None else _postmaster_port(self.state.pg_dir)
        if port is not None and self.state.pg_dir.is_dir():
            server = EmbeddedPostgres(data_dir=self.state.pg_dir, port=port)
            if server.is_running():
                try:
                    server.stop()
                except EmbeddedPostgresError as exc:
                    raise ClusterError(f"embedded PostgreSQL did not stop: {exc}") from exc
                database_stopped = True
        left = self._marked_processes()
        if left:
            raise ClusterError(
                "processes still running after down: "
                + ", ".join(f"{p.pid} ({' '.join(_cmdline(p))})" for p in left)
            )
        return DownReport(
            terminated=tuple(i for i in running if i not in killed),
            killed=tuple(killed),
            stragglers=tuple(stragglers),
            database_stopped=database_stopped,
        )

    def _reap(self, process_id: str) -> None:
        child = self._children.pop(process_id, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=1.0)

    def _marked_processes(self) -> list[psutil.Process]:
        """Live processes (not zombies) whose environment names this state folder."""
        marker = str(self.state.root)
        found = []
        me = os.getpid()
        for process in psutil.process_iter():
            if process.pid == me:
                continue
            try:
                if process.environ().get(MARKER_ENV) != marker:
                    continue
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            found.append(process)
        return found

    def _kill_marked(self) -> list[int]:
        left = self._marked_processes()
        for process in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(left, timeout=5.0)
        return [p.pid for p in left]


def _matches(cmdline: Sequence[str], spec: ProcessSpec) -> bool:
    """Whether ``cmdline`` is ``python -m ops.cli <kind> --id <id> ...``."""
    try:
        start = list(cmdline).index("ops.cli")
    except ValueError:
        return False
    rest = list(cmdline[start + 1 :])
    if not rest or rest[0] != spec.kind:
        return False
    return any(a == "--id" and b == spec.id for a, b in itertools.pairwise(rest))


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return ["?"]


def _port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (connections in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LISTEN_HOST, port))
        except OSError:
            return False
    return True


def _postmaster_port(pg_dir: Path) -> int | None:
    """The port in ``pg/data/postmaster.pid``, if there is one."""
    try:
        return int((pg_dir / "data" / "postmaster.pid").read_text().splitlines()[3])
    except (OSError, ValueError, IndexError):
        return None


def _tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a process's log, read in bounded memory (a log may be large)."""
    try:
        return "\n".join(tail_lines(path, max_lines=lines).lines)
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"


def metrics_address(spec: ProcessSpec) -> str | None:
    """host:port of a control plane's /metrics, when it was started with ``--metrics-port``."""
    args = list(spec.args)
    if "--metrics-port" not in args:
        return None
    return f"{LISTEN_HOST}:{args[args.index('--metrics-port') + 1]}"


def iter_worker_logs(state: StateDir, worker_ids: Iterable[str]) -> dict[str, Path]:
    """worker id -> path of its agent.jsonl (whether or not it exists yet)."""
    return {w: state.work_dir(w) / "agent.jsonl" for w in worker_ids}
