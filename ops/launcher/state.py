"""The local cluster's state folder and what ``cluster.json`` records.

Pure data and files, with light imports (no trio, psutil or protocol), so a command that only
reads the record pays for none of them. The folder's layout: :mod:`ops.cluster`.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import attrs

from ops.config import STATE_DIR_ENV, ClusterError, read_cluster_file
from ops.paths import PathBelow
from runtime.settings.fields import str_tuple
from runtime.tls import TlsFiles

__all__ = [
    "LISTEN_HOST",
    "MARKER_ENV",
    "STATE_DIR_ENV",
    "WORKER_CAPACITIES",
    "ClusterConfig",
    "ClusterError",
    "DockerSpec",
    "ProcessSpec",
    "StateDir",
    "WorkerSpec",
    "console_url",
    "iter_worker_logs",
    "metrics_address",
    "open_log",
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

CONFIG_VERSION = 1

PASS_THROUGH_MODE = 0o711
"""The state folder and its ``workers/``: another user (a job's uid, the database's user) may
pass through to a folder of its own there, never list them."""
PRIVATE_DIR_MODE = 0o700
"""``logs/``, ``pids/`` and ``fleets/``: the launcher's user's alone."""
PRIVATE_FILE_MODE = 0o600
"""Every process's log (``logs/*.log``) and ``events.jsonl``: they name every account's jobs
and commands, so they are the launcher's user's alone."""
_SUBDIR_MODES = {
    "logs": PRIVATE_DIR_MODE,
    "pids": PRIVATE_DIR_MODE,
    "workers": PASS_THROUGH_MODE,
    "fleets": PRIVATE_DIR_MODE,
}


def _set_mode(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` (not a symlink's target), unless it is so already."""
    if (path.lstat().st_mode & 0o7777) != mode:
        path.chmod(mode)


def open_log(path: Path) -> IO[bytes]:
    """``path`` opened for appending bytes, created mode :data:`PRIVATE_FILE_MODE` whatever the
    umask (and made so if it was not), its folder created as needed; the caller closes it.

    Raises:
        OSError: it cannot be opened or its mode set.
    """
    path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if (os.fstat(fd).st_mode & 0o7777) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def _specs(items: Iterable[ProcessSpec]) -> tuple[ProcessSpec, ...]:
    return tuple(items)


def _workers(items: Iterable[WorkerSpec]) -> tuple[WorkerSpec, ...]:
    return tuple(items)


_Record = TypeVar("_Record", bound=attrs.AttrsInstance)

LOCK_WAIT_S = 300.0
"""How long ``up`` or ``down`` waits for another one holding the state folder's lock, in seconds."""
LOCK_POLL_S = 0.1


@attrs.frozen(kw_only=True)
class ProcessSpec:
    """One process of the cluster, as recorded in cluster.json."""

    id: str
    """``cp-1``..., ``w-1``..., ``fleet-1``..."""
    kind: str
    """``cp``, ``agent`` or ``fleet``: the ops.cli subcommand it runs."""
    address: str
    """host:port of its gRPC service; empty for a fleet (its workers have one each)."""
    args: tuple[str, ...] = attrs.field(converter=str_tuple)
    """The arguments after ``python -m ops.cli``."""
    metrics_address: str = ""
    """host:port of its Prometheus /metrics (its ``--metrics-port``); empty when it serves none."""
    console_address: str = ""
    """host:port of a control plane's web console (its ``--http-port``); empty when it serves none."""

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


DOCKER_MAX_CONTROL_PLANES = 9
DOCKER_MAX_WORKERS = 200
"""Most workers of a cluster in containers: its /24 network holds the database, the control
planes and the workers, each at an address of its own."""


@attrs.frozen(kw_only=True)
class DockerSpec:
    """Where a cluster in containers (``stockade up --docker``) lives. Each process has a
    container at a fixed address of the network's /24 subnet (the database at host 2, ``cp-N``
    at 10+N, ``w-N`` at 20+N), reached through the bridge: nothing is published."""

    network: str
    subnet: str
    """A /24 (``172.29.N.0/24``)."""
    image: str
    """``stockade:<version>``."""
    prefix: str
    """Container names are ``<prefix>-<process id>``."""

    def address_of(self, process_id: str) -> str:
        """The container address of ``pg``, ``cp-N`` or ``w-N``; ClusterError for another id."""
        kind, _, number = process_id.rpartition("-")
        if process_id == "pg":
            host = 2
        elif kind == "cp" and number.isdigit() and 1 <= int(number) <= DOCKER_MAX_CONTROL_PLANES:
            host = 10 + int(number)
        elif kind == "w" and number.isdigit() and 1 <= int(number) <= DOCKER_MAX_WORKERS:
            host = 20 + int(number)
        else:
            raise ClusterError(
                f"{process_id} has no address in a cluster in containers (it holds pg, "
                f"cp-1..cp-{DOCKER_MAX_CONTROL_PLANES} and w-1..w-{DOCKER_MAX_WORKERS})"
            )
        return str(ipaddress.ip_network(self.subnet)[host])

    def container_name(self, process_id: str) -> str:
        return f"{self.prefix}-{process_id}"

    @staticmethod
    def prefix_for(state_root: Path) -> str:
        """``stockade-<8 hex digits of the state folder's path>``: one cluster per folder."""
        import hashlib  # here: client commands read the record without it

        return "stockade-" + hashlib.sha256(str(state_root.absolute()).encode()).hexdigest()[:8]


@attrs.frozen(kw_only=True)
class WorkerSpec:
    """One worker of the cluster, whether it runs as an agent process or in a fleet."""

    id: str
    address: str
    """host:port its Worker service listens on."""
    cpu_millis: int = attrs.field(converter=int)
    """CPU it offers, in millicores."""
    memory_mb: int = attrs.field(converter=int)
    """Memory it offers, in MiB."""
    process_id: str
    """The process that runs it: its own id for an agent process, else its fleet's id."""
    advertise_address: str = ""
    """host:port the leader should call, when not ``address`` (fleet workers only)."""
    control_planes: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    """Control-plane addresses of its own, when not the cluster's (as ``advertise_address``)."""

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    @property
    def fleet(self) -> str | None:
        """The id of the fleet that hosts it, or None when it is an agent process of its own."""
        return None if self.process_id == self.id else self.process_id

    @classmethod
    def of_agent(cls, spec: ProcessSpec) -> WorkerSpec:
        """The worker an ``agent`` process runs, read from its arguments."""
        return cls(
            id=spec.id,
            address=spec.address,
            cpu_millis=int(option_value(spec.args, "--cpu-millis") or 0),
            memory_mb=int(option_value(spec.args, "--memory-mb") or 0),
            process_id=spec.id,
        )


def option_value(args: Sequence[str], name: str) -> str | None:
    """The value after the last ``name`` in ``args`` (or of ``name=value``), or None."""
    found = None
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith(name + "="):
            found = arg.partition("=")[2]
    return found


def _record(cls: type[_Record], data: dict[str, Any]) -> _Record:
    """A record from its ``attrs.asdict`` JSON; missing fields take their defaults (KeyError
    where there is none)."""
    fields = attrs.fields(cls)
    return cls(**{f.name: data[f.name] for f in fields if f.name in data or f.default is attrs.NOTHING})


def worker_order(worker_id: str) -> tuple[int, str]:
    """``w-10`` after ``w-9``: by number, then by text."""
    number = worker_id.rpartition("-")[2]
    return (int(number) if number.isdigit() else 0, worker_id)


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """What cluster.json holds."""

    database_url: str
    embedded_pg_port: int | None
    """Port of the embedded server under ``pg/``; None when the database is DATABASE_URL's."""
    processes: tuple[ProcessSpec, ...] = attrs.field(converter=_specs)
    """The operating-system processes: control planes, agents and fleets."""
    hosted_workers: tuple[WorkerSpec, ...] = attrs.field(default=(), converter=_workers)
    """The workers that run in fleets (those in agent processes are in ``processes``)."""
    retired_control_planes: tuple[ProcessSpec, ...] = attrs.field(default=(), converter=_specs)
    """Control planes an ``up`` with fewer of them stopped: their ports stay theirs, so one that
    comes back listens where running workers (which keep their list) look for it."""
    cert_dir: str | None = None
    """The cluster CA's and certificates' folder (mutual TLS); None: ``--insecure``."""
    ha_db: bool = False
    """The database is the HA pair under ``hadb/`` (``up --ha-db``): ``database_url`` is its
    multi-host URL."""
    docker: DockerSpec | None = None
    """The cluster, database too, runs in containers (``up --docker``)."""

    @property
    def client_tls(self) -> TlsFiles | None:
        """The operator's client certificate files (None: plaintext)."""
        return None if self.cert_dir is None else TlsFiles.in_dir(Path(self.cert_dir), "operator")

    @property
    def control_planes(self) -> list[ProcessSpec]:
        return [p for p in self.processes if p.kind == "cp"]

    @property
    def workers(self) -> list[WorkerSpec]:
        """Every worker, one entry per worker id, in agent processes or in fleets, by number."""
        lone = [WorkerSpec.of_agent(p) for p in self.processes if p.kind == "agent"]
        return sorted([*lone, *self.hosted_workers], key=lambda w: worker_order(w.id))

    @property
    def fleets(self) -> list[ProcessSpec]:
        return [p for p in self.processes if p.kind == "fleet"]

    @property
    def control_plane_addresses(self) -> list[str]:
        return [p.address for p in self.control_planes]

    def metrics_addresses(self) -> dict[str, str]:
        """Process id -> host:port of its Prometheus /metrics, for each that serves them."""
        return {spec.id: spec.metrics_address for spec in self.processes if spec.metrics_address}

    def console_urls(self) -> dict[str, str]:
        """Control plane id -> the origin of its web console, for each that serves one."""
        urls = {spec.id: console_url(spec, tls=self.cert_dir is not None) for spec in self.control_planes}
        return {process_id: url for process_id, url in urls.items() if url is not None}

    def workers_in(self, process_id: str) -> list[WorkerSpec]:
        """The workers the process ``process_id`` runs: its own for an agent, a fleet's, or none."""
        return [w for w in self.workers if w.process_id == process_id]

    def worker(self, worker_id: str) -> WorkerSpec:
        """The worker ``worker_id``, wherever it runs; ClusterError where there is none."""
        for worker in self.workers:
            if worker.id == worker_id:
                return worker
        known = ", ".join(w.id for w in self.workers) or "none"
        raise ClusterError(f"{worker_id} is not a worker of this cluster (it has {known})")

    def address_of(self, process_or_worker_id: str) -> str:
        """host:port of a control plane or a worker; ClusterError for neither."""
        for spec in self.control_planes:
            if spec.id == process_or_worker_id:
                return spec.address
        return self.worker(process_or_worker_id).address

    def process(self, process_id: str) -> ProcessSpec:
        """The process named ``process_id``; ClusterError where there is none (for a worker in a
        fleet, naming the fleet)."""
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
            "version": CONFIG_VERSION,
            "database_url": self.database_url,
            "embedded_pg_port": self.embedded_pg_port,
            "processes": [attrs.asdict(p) for p in self.processes],
            "hosted_workers": [attrs.asdict(w) for w in self.hosted_workers],
            "retired_control_planes": [attrs.asdict(p) for p in self.retired_control_planes],
            "cert_dir": self.cert_dir,
            "ha_db": self.ha_db,
            **({"docker": attrs.asdict(self.docker)} if self.docker is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterConfig:
        return cls(
            database_url=data["database_url"],
            embedded_pg_port=data.get("embedded_pg_port"),
            processes=[_record(ProcessSpec, p) for p in data["processes"]],
            hosted_workers=[_record(WorkerSpec, w) for w in data.get("hosted_workers", [])],
            retired_control_planes=[_record(ProcessSpec, p) for p in data.get("retired_control_planes", [])],
            cert_dir=data.get("cert_dir"),
            ha_db=bool(data.get("ha_db", False)),
            docker=_record(DockerSpec, data["docker"]) if data.get("docker") else None,
        )


@attrs.frozen
class StateDir:
    """The paths inside one state folder."""

    root: Path = attrs.field(converter=lambda p: Path(p).absolute())

    config_path = PathBelow("root", "cluster.json")
    cert_dir = PathBelow("root", "certs")
    pg_dir = PathBelow("root", "pg")
    hadb_dir = PathBelow("root", "hadb")

    def log_path(self, process_id: str) -> Path:
        return self.root / "logs" / f"{process_id}.log"

    events_path = PathBelow("root", "events.jsonl")
    """The fault record (``events.jsonl``) the checker reads: kills, freezes, partitions."""

    def record_fault(self, kind: str, target: str, at: float, until: float | None = None) -> None:
        """Append one fault (``kind`` of :data:`ops.checker_records.FAULT_KINDS`; Unix seconds) to
        :attr:`events_path`."""
        line = {"kind": kind, "target": target, "at": at, "until": at if until is None else until}
        with open_log(self.events_path) as out:
            out.write(json.dumps(line).encode() + b"\n")

    def pid_path(self, process_id: str) -> Path:
        return self.root / "pids" / f"{process_id}.pid"

    def work_dir(self, worker_id: str) -> Path:
        return self.root / "workers" / worker_id

    def worker_dirs(self) -> list[Path]:
        """Every worker's folder under ``workers/``, also of workers dropped since, by id."""
        try:
            found = [path for path in (self.root / "workers").iterdir() if path.is_dir()]
        except FileNotFoundError:
            return []
        return sorted(found, key=lambda path: worker_order(path.name))

    def fleet_spec_path(self, fleet_id: str) -> Path:
        return self.root / "fleets" / f"{fleet_id}.json"

    def create(self) -> None:
        """Create the folder and its parts with their modes (:data:`PASS_THROUGH_MODE` for it
        and ``workers/``, :data:`PRIVATE_DIR_MODE` for the others), and close what an earlier
        release left open: its logs and ``events.jsonl`` become :data:`PRIVATE_FILE_MODE`.

        Raises:
            OSError: a folder cannot be created or its mode set.
        """
        self.root.mkdir(mode=PASS_THROUGH_MODE, parents=True, exist_ok=True)
        _set_mode(self.root, PASS_THROUGH_MODE)
        for sub, mode in _SUBDIR_MODES.items():
            (self.root / sub).mkdir(mode=mode, exist_ok=True)
            _set_mode(self.root / sub, mode)
        for path in [*(self.root / "logs").glob("*.log"), self.events_path]:
            with contextlib.suppress(FileNotFoundError):
                _set_mode(path, PRIVATE_FILE_MODE)

    @contextlib.contextmanager
    def locked(self, *, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """Hold an exclusive flock on ``.lock`` (with the holder's pid in it), so two
        ``up``/``down`` never interleave. ClusterError, naming the holder's pid, when another
        still holds it after ``wait_s`` seconds (polled, so Ctrl-C ends the wait)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".lock"
        with path.open("a+") as lock_file:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        lock_file.seek(0)
                        holder = lock_file.read().strip() or "unknown"
                        raise ClusterError(
                            f"another stockade up or down (pid {holder}) has held {path} for "
                            f"{wait_s:g} s; wait for it to end, or stop it, and run this again"
                        ) from None
                    time.sleep(LOCK_POLL_S)
            lock_file.truncate(0)
            lock_file.write(f"{os.getpid()}\n")
            lock_file.flush()
            try:
                yield
            finally:
                lock_file.truncate(0)
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def load(self) -> ClusterConfig | None:
        """The recorded cluster, or None; ClusterError where cluster.json cannot be read."""
        return read_cluster_file(self.config_path, ClusterConfig.from_json)

    def save(self, config: ClusterConfig) -> None:
        """Write cluster.json atomically, readable by this user only (the URL may hold a password)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_name(self.config_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(config.to_json(), out, indent=2)
            out.write("\n")
        os.replace(tmp, self.config_path)


def metrics_address(spec: ProcessSpec) -> str | None:
    """host:port of a process's Prometheus /metrics, or None when it serves none."""
    return spec.metrics_address or None


def iter_worker_logs(state: StateDir, worker_ids: Iterable[str]) -> dict[str, Path]:
    """worker id -> path of its agent.jsonl (whether or not it exists yet)."""
    return {w: state.work_dir(w) / "agent.jsonl" for w in worker_ids}


def console_url(spec: ProcessSpec, *, tls: bool) -> str | None:
    """The origin of a control plane's web console, or None: ``https://`` its address with TLS,
    ``http://127.0.0.1:<port>`` without (where such a console listens)."""
    address = spec.console_address
    if not address:
        return None
    if not tls:
        return f"http://127.0.0.1:{address.rpartition(':')[2]}"
    return f"https://{address}"
