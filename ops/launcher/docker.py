"""The local cluster in containers (``stockade up --docker``): :class:`DockerCluster`.

Each process of one state folder runs in a container of ``stockade:<version>`` at a fixed address
of a private network, with the local cluster's record and folder layout, so every client command
works on it unchanged (docs/containers.md). Faults: :meth:`DockerCluster.pause`,
:meth:`~DockerCluster.disconnect`/:meth:`~DockerCluster.connect` (a network cut),
:meth:`~DockerCluster.stop_container`/:meth:`~DockerCluster.start_container`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import psutil

from ops import pidfile
from ops.launcher import procs
from ops.launcher.docker_engine import CLUSTER_LABEL, PROCESS_LABEL, cluster_network, image_id, in_parallel
from ops.launcher.driver import DatabaseStarted, DownReport, Stopped
from ops.launcher.pg import EmbeddedPostgres
from ops.launcher.plan import LaunchOptions
from ops.launcher.procs import STOP_TIMEOUT_S, stop_deadline_s
from ops.launcher.state import (
    DOCKER_MAX_WORKERS,
    ClusterConfig,
    ClusterError,
    DockerSpec,
    ProcessSpec,
    StateDir,
    open_log,
)
from ops.launcher.up import Launcher

if TYPE_CHECKING:
    import docker
    import docker.models.containers


__all__ = ["DockerCluster"]

PG_PORT = 5432
FIRST_PORT = 7001
"""Ports of the processes in their containers (each has its own address)."""

DATABASE_CPU_SHARES = 4096
CONTROL_PLANE_CPU_SHARES = 3072
WORKER_CPU_SHARES = 40
"""CPU weights of the containers (``--cpu-shares``; the engine's default is 1024). The kernel
shares CPU between cgroups first: with equal weights 100 agent containers would starve the
control planes mid-transaction. So the workers together weigh about 4 fleet processes, a control
plane what nice -5 gives (``--nice`` has no effect across cgroups), the database more."""
DATABASE_READY_TIMEOUT_S = 60.0
PAUSE_ATTEMPTS = 10
PAUSE_RETRY_S = 0.1


def cpu_shares_of(process_id: str) -> int:
    if process_id == "pg":
        return DATABASE_CPU_SHARES
    return CONTROL_PLANE_CPU_SHARES if process_id.startswith("cp-") else WORKER_CPU_SHARES


@attrs.define
class DockerCluster(Launcher):
    """Starts, finds and stops the containers of one state folder's cluster.

    Args:
        state: the state folder.
        insecure, cp_args, agent_args, worker_capacities, on_start: as
            :class:`ops.launcher.LocalCluster`'s.
        image: the image to run; None: ``stockade:<version>`` of this installation.
        extra_env: process id -> environment added to its container (fault points).
        extra_binds: process id -> folders of the state folder its container also gets
            read-write, at the same path (created when missing).
    """

    state: StateDir
    insecure: bool = False
    cp_args: Sequence[str] = ()
    agent_args: Sequence[str] = ()
    worker_capacities: tuple[tuple[int, int], ...] | None = None
    image: str | None = None
    extra_env: Callable[[str], dict[str, str]] | None = None
    extra_binds: Callable[[str], Sequence[Path]] | None = None
    on_start: Callable[[], None] | None = None
    _spec: DockerSpec | None = attrs.field(default=None, init=False)
    _client: docker.DockerClient | None = attrs.field(default=None, alias="client")

    @property
    def client(self) -> docker.DockerClient:
        """The docker SDK client (made on first use); ClusterError where no engine answers."""
        if self._client is None:
            from ops.image import engine_client

            self._client = engine_client(timeout_s=120, error=ClusterError)
        return self._client

    def config(self) -> ClusterConfig:
        """The recorded cluster; ClusterError where none is, or not one in containers."""
        config = self.state.load()
        if config is None:
            raise ClusterError(f"no cluster recorded in {self.state.config_path}; run `stockade up --docker`")
        if config.docker is None:
            raise ClusterError(f"the cluster of {self.state.root} runs as processes, not in containers")
        return config

    def _containers(self, **labels: str) -> list[docker.models.containers.Container]:
        filters = [f"{CLUSTER_LABEL}={self.state.root}", *(f"{k}={v}" for k, v in labels.items())]
        return list(self.client.containers.list(all=True, filters={"label": filters}))

    def _container(self, process_id: str) -> docker.models.containers.Container | None:
        found = self._containers(**{PROCESS_LABEL: process_id})
        return found[0] if found else None

    def pids(self, config: ClusterConfig | None = None) -> dict[str, int]:
        """Process id (``pg``, ``cp-N``, ``w-N``) -> the machine's pid of its running container's
        process 1."""
        found = {}
        for container in self._containers():
            state = container.attrs.get("State", {})
            if state.get("Running") and state.get("Pid"):
                found[container.labels[PROCESS_LABEL]] = int(state["Pid"])
        return found

    def live_process(self, spec: ProcessSpec) -> psutil.Process | None:
        return pidfile.process(self.pids().get(spec.id))

    def check_request(self, *, control_planes: int | None, workers: int | None) -> None:
        if workers is not None and workers > DOCKER_MAX_WORKERS:
            raise ClusterError(f"workers must be <= {DOCKER_MAX_WORKERS} in containers, got {workers}")

    def check_record(self, previous: ClusterConfig | None) -> None:
        if previous is not None and previous.docker is None:
            # Its database's files in pg/ belong to this machine's server (the container's must
            # never open them), and its addresses are 127.0.0.1's.
            raise ClusterError(
                f"{self.state.root} holds a cluster of processes: run it without --docker, or "
                "`stockade down` and use another state folder (STOCKADE_STATE_DIR) for the cluster in "
                f"containers, or remove {self.state.root} to start afresh there"
            )

    def prepare(self, previous: ClusterConfig | None, live_before: dict[str, int]) -> None:
        recorded = previous.docker if previous is not None else None
        image = image_id(
            self.client, self.image, recorded.image if recorded is not None and live_before else None
        )
        network = cluster_network(self.client, self.state.root, recorded)
        self._spec = DockerSpec(
            network=network.name,
            subnet=network.attrs["IPAM"]["Config"][0]["Subnet"],
            image=image,
            prefix=DockerSpec.prefix_for(self.state.root),
        )

    def launch_options(self, tls_args: Sequence[str]) -> LaunchOptions:
        return LaunchOptions(
            cp_args=(*self.cp_args, *tls_args),
            # No container jobs from an agent in a container: its job containers would be
            # siblings on the engine that outlive a killed agent, so a requeued job could run twice.
            agent_args=(*self.agent_args, "--no-containers", *tls_args),
            worker_capacities=self.worker_capacities,
            metrics=True,
            host_of=self._docker_spec().address_of,
        )

    def port_source(self) -> Callable[[], int]:
        return iter(range(FIRST_PORT, FIRST_PORT + 10_000)).__next__

    def recorded(self, config: ClusterConfig) -> ClusterConfig:
        return attrs.evolve(config, docker=self._docker_spec())

    def forget(self, process_ids: Sequence[str]) -> None:
        containers = [c for p in process_ids if (c := self._container(p)) is not None]
        in_parallel(lambda c: c.remove(force=True), containers)

    def to_start(self, config: ClusterConfig, live_before: dict[str, int]) -> list[ProcessSpec]:
        return [p for p in config.processes if p.id not in live_before]

    def _docker_spec(self) -> DockerSpec:
        assert self._spec is not None, "prepare() comes first"
        return self._spec

    def issue_certificates(self, config: ClusterConfig) -> None:
        """Certificates for every control plane and worker naming its container address (one
        without it is issued again), and the operator and viewer clients'."""
        from ops.certs import CertDir, describe, ensure_issued, issue
        from runtime.errors import StockadeError

        assert config.docker is not None
        cert_dir = self.state.cert_dir
        try:
            ensure_issued(cert_dir, [("operator", "operator"), ("viewer", "viewer")])
            where = CertDir(cert_dir)
            for role, process_id in [
                *(("control-plane", p.id) for p in config.control_planes),
                *(("worker", w.id) for w in config.workers),
            ]:
                address = config.docker.address_of(process_id)
                if where.cert(process_id).exists() and where.key(process_id).exists():
                    if address in describe(where.cert(process_id)).ip_addresses:
                        continue
                    where.cert(process_id).unlink()
                    where.key(process_id).unlink()
                issue(cert_dir, role=role, id=process_id, hosts=[address])
        except StockadeError as exc:
            raise ClusterError(f"cannot make the cluster's certificates: {exc}") from exc

    def start_database(
        self, previous: ClusterConfig | None, live_before: dict[str, int], starting: Callable[[], None]
    ) -> DatabaseStarted:
        """Start the database container unless it runs, and wait until it takes connections."""
        spec = self._docker_spec()
        address = spec.address_of("pg")
        self.state.pg_dir.mkdir(parents=True, exist_ok=True)
        existing = self._container("pg")
        started = existing is None or existing.status != "running"
        if started:
            command = ["database", "--data-dir", str(self.state.pg_dir), "--port", str(PG_PORT)]
            command += ["--listen-host", address]
            starting()
            self._run_container(spec, "pg", command, binds={self.state.pg_dir: "rw"})
        server = EmbeddedPostgres(data_dir=self.state.pg_dir, port=PG_PORT, listen_host=address)
        deadline = time.monotonic() + DATABASE_READY_TIMEOUT_S
        while True:
            if server.password_file.exists() and _accepts(address, PG_PORT):
                return DatabaseStarted(url=server.url(), pg_port=None, started=started)
            container = self._container("pg")
            if container is None or container.status == "exited":
                raise procs.exited("the database container exited", self.state.log_path("pg"))
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the database at {address}:{PG_PORT} took no connection in "
                    f"{DATABASE_READY_TIMEOUT_S:g} s "
                    f"(read {self.state.log_path('pg')})"
                )
            time.sleep(0.2)

    def start(self, process: ProcessSpec, config: ClusterConfig) -> None:
        assert config.docker is not None
        binds: dict[Path, str] = {}
        if config.cert_dir is not None:
            cert_dir = Path(config.cert_dir)
            for name in ("ca.crt", f"{process.id}.crt", f"{process.id}.key"):
                binds[cert_dir / name] = "ro"
        environment = {}
        if process.kind == "cp":
            binds[self.state.pg_dir / "pgpass"] = "ro"
            environment["DATABASE_URL"] = config.database_url
        else:
            work_dir = self.state.work_dir(process.id)
            work_dir.mkdir(parents=True, exist_ok=True)
            binds[work_dir] = "rw"
        if self.extra_env is not None:
            environment |= self.extra_env(process.id)
        for folder in self.extra_binds(process.id) if self.extra_binds is not None else ():
            folder.mkdir(parents=True, exist_ok=True)
            binds[folder] = "rw"
        self._run_container(
            config.docker, process.id, list(process.args), binds=binds, environment=environment
        )

    def _run_container(
        self,
        spec: DockerSpec,
        process_id: str,
        command: list[str],
        *,
        binds: dict[Path, str],
        environment: dict[str, str] | None = None,
    ) -> None:
        """(Re)make and start the container of ``process_id`` running ``stockade COMMAND``."""
        old = self._container(process_id)
        if old is not None:
            old.remove(force=True)
        log_path = self.state.log_path(process_id)
        open_log(log_path).close()  # the container's shell appends to it: made private first
        mounts = {**{str(path): {"bind": str(path), "mode": mode} for path, mode in binds.items()}}
        mounts[str(log_path.parent)] = {"bind": str(log_path.parent), "mode": "rw"}
        api = self.client.api
        host_config = api.create_host_config(binds=mounts, init=True, cpu_shares=cpu_shares_of(process_id))
        endpoint = api.create_endpoint_config(ipv4_address=spec.address_of(process_id), aliases=[process_id])
        created = api.create_container(
            spec.image,
            # The process's output goes to its log file as on the machine (sh's $0 is the path).
            command=["/bin/sh", "-c", 'exec "$@" >>"$0" 2>&1', str(log_path), "stockade", *command],
            name=spec.container_name(process_id),
            hostname=process_id,
            labels={CLUSTER_LABEL: str(self.state.root), PROCESS_LABEL: process_id},
            environment=environment or {},
            host_config=host_config,
            networking_config=api.create_networking_config({spec.network: endpoint}),
        )
        api.start(created["Id"])

    def check_exited(self, config: ClusterConfig) -> None:
        for process in config.processes:
            container = self._container(process.id)
            if container is None or container.status == "exited":
                code = container.attrs["State"].get("ExitCode") if container is not None else "?"
                raise procs.exited(
                    f"{process.id}'s container exited with code {code}", self.state.log_path(process.id)
                )

    def agent_memory_mb(self) -> tuple[float, float, float] | None:
        """The memory the workers' containers use now, MiB, as (min, median, max); None when
        none runs. Usage less page cache, as ``docker stats`` shows it."""
        import statistics

        def used_mb(container: Any) -> float | None:
            stats = container.stats(stream=False).get("memory_stats") or {}
            if "usage" not in stats:
                return None
            inner = stats.get("stats") or {}
            cache = inner.get("cache", inner.get("inactive_file", 0))
            return float(stats["usage"] - cache) / 2**20

        workers = [c for c in self._containers() if c.labels.get(PROCESS_LABEL, "").startswith("w-")]
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            found = [m for m in pool.map(used_mb, workers) if m is not None]
        if not found:
            return None
        return round(min(found), 1), round(statistics.median(found), 1), round(max(found), 1)

    def kill(self, process_id: str, sig: int = signal.SIGKILL) -> int:
        """``docker kill --signal SIG``; returns the machine's pid of its process 1. SIGKILL is
        recorded as a kill. ClusterError where it does not run."""
        container = self._running(process_id)
        pid = int(container.attrs["State"]["Pid"])
        container.kill(signal=int(sig))
        if sig == signal.SIGKILL:
            self.state.record_fault("kill", process_id, time.time())
            with contextlib.suppress(Exception):
                container.wait(timeout=STOP_TIMEOUT_S)
        return pid

    def pause(self, process_id: str, *, attempts: int = PAUSE_ATTEMPTS) -> None:
        """``docker pause``, tried ``attempts`` times: the freezer fails for a moment ("unable to
        freeze") on a process mid-fork or mid-exit. ClusterError where it does not run, or
        every attempt failed."""
        import docker.errors

        container = self._running(process_id)
        for attempt in range(1, attempts + 1):
            try:
                container.pause()
                return
            except docker.errors.APIError as exc:
                if attempt == attempts or "freeze" not in str(exc):
                    raise ClusterError(f"cannot pause {process_id} ({attempt} attempts): {exc}") from exc
                time.sleep(PAUSE_RETRY_S)

    def unpause(self, process_id: str) -> None:
        container = self._container(process_id)
        if container is not None and container.status == "paused":
            container.unpause()

    def disconnect(self, process_id: str) -> None:
        """Cut the container off the cluster's network (``docker network disconnect``); one
        already off it, or not running, stays as it is."""
        import docker.errors

        config = self.config()
        assert config.docker is not None
        container = self._container(process_id)
        if container is None:
            return
        try:
            self.client.networks.get(config.docker.network).disconnect(container, force=True)
        except docker.errors.APIError as exc:
            if "not connected" not in str(exc):
                raise ClusterError(f"cannot cut {process_id} off the network: {exc}") from exc

    def connect(self, process_id: str) -> None:
        """Put the container back on the network, at its own address; one on it already stays
        as it is. ClusterError where it has no container, or the engine refused."""
        import docker.errors

        config = self.config()
        assert config.docker is not None
        container = self._container(process_id)
        if container is None:
            raise ClusterError(f"{process_id} has no container")
        try:
            self.client.networks.get(config.docker.network).connect(
                container, ipv4_address=config.docker.address_of(process_id), aliases=[process_id]
            )
        except docker.errors.APIError as exc:
            if "already exists" not in str(exc):
                raise ClusterError(f"cannot put {process_id} back on the network: {exc}") from exc

    def stop_container(self, process_id: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """``docker stop``: SIGTERM, SIGKILL after ``timeout_s``; the container stays, stopped."""
        self._running(process_id).stop(timeout=int(timeout_s))

    def start_container(self, process_id: str) -> None:
        """``docker start`` of a stopped container; ClusterError where it has none."""
        container = self._container(process_id)
        if container is None:
            raise ClusterError(f"{process_id} has no container")
        container.start()

    def _running(self, process_id: str) -> docker.models.containers.Container:
        container = self._container(process_id)
        if container is None or container.status not in ("running", "paused"):
            raise ClusterError(f"{process_id} is not running (no running container of it)")
        return container

    def down(self, *, timeout_s: float | None = None) -> DownReport:
        """``docker stop`` every container of this folder (workers, then control planes, then
        the database; SIGKILL after ``timeout_s``, or with None each one's own deadline), then
        remove them and the network. ClusterError where no engine answers."""
        if not self.state.root.is_dir():
            return DownReport(terminated=(), killed=(), stragglers=(), database_stopped=False)
        with self.state.locked():
            containers = self._containers()
            for container in containers:
                if container.status == "paused":
                    container.unpause()
            groups: dict[str, list[Any]] = {"w": [], "cp": [], "pg": []}
            for container in containers:
                kind = container.labels.get(PROCESS_LABEL, "").rpartition("-")[0] or "pg"
                groups.get(kind, groups["w"]).append(container)
            terminated: list[str] = []
            database_stopped = False

            def deadline_s(container: Any) -> float:
                if timeout_s is not None:
                    return timeout_s
                return self._stop_deadline_s(container.labels.get(PROCESS_LABEL, ""))

            for kind in ("w", "cp", "pg"):
                running = [c for c in groups[kind] if c.status == "running"]
                in_parallel(lambda c: c.stop(timeout=math.ceil(deadline_s(c))), running)
                names = [c.labels[PROCESS_LABEL] for c in running]
                if kind == "pg":
                    database_stopped = bool(names)
                else:
                    terminated += names
            in_parallel(lambda c: c.remove(force=True), containers)
            removed = [c.labels.get(PROCESS_LABEL, c.name) for c in containers]
            for network in self.client.networks.list(filters={"label": f"{CLUSTER_LABEL}={self.state.root}"}):
                network.remove()
                removed.append(f"network {network.name}")
        return DownReport(
            terminated=tuple(terminated),
            killed=(),
            stragglers=(),
            database_stopped=database_stopped,
            removed=tuple(removed),
        )

    def stop(self, specs: Sequence[ProcessSpec], config: ClusterConfig | None) -> Stopped:
        """``docker stop`` the containers of ``specs``, each given its deadline
        (:meth:`_stop_deadline_s`); what it did is not reported."""
        containers = [(spec, c) for spec in specs if (c := self._container(spec.id)) is not None]
        in_parallel(lambda pair: pair[1].stop(timeout=math.ceil(stop_deadline_s(pair[0], 1))), containers)
        return Stopped()

    def _stop_deadline_s(self, process_id: str) -> float:
        """:func:`ops.launcher.procs.stop_deadline_s` of a recorded process, else :data:`STOP_TIMEOUT_S`."""
        config = self.state.load()
        with contextlib.suppress(ClusterError):
            if config is not None:
                return stop_deadline_s(config.process(process_id), 1)
        return STOP_TIMEOUT_S


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
