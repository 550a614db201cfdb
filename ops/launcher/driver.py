"""The one face of a cluster's launcher: :class:`ClusterDriver`, and what its ``up`` and ``down``
report (:class:`UpResult`, :class:`DownReport`). Processes on this machine
(:class:`ops.launcher.control.LocalCluster`) and containers (:class:`ops.launcher.docker.DockerCluster`)
are driven the same way; only what differs stays in the drivers.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    import psutil

    from ops.launcher.plan import LaunchOptions
    from ops.launcher.state import ClusterConfig, ProcessSpec, StateDir
    from protocol import pb

__all__ = ["ClusterDriver", "DatabaseStarted", "DownReport", "Stopped", "UpResult"]


@attrs.frozen(kw_only=True)
class UpResult:
    """What ``up`` did."""

    config: ClusterConfig
    started: tuple[str, ...]
    """Ids of the processes this call started (the others were already running)."""
    database_started: bool
    """True when this call started the database (or some process of it)."""
    status: pb.StatusReply
    """The status that showed the cluster ready."""
    pids: dict[str, int]
    stopped: tuple[str, ...] = ()
    """Ids of the running processes this call stopped (SIGTERM) because the asked counts left
    them out."""
    killed: tuple[str, ...] = ()
    """Those of ``stopped`` SIGKILLed at their deadline (their workers will be declared dead)."""
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
    """Members of the HA pair (``pg-1``, ``etcd-1``...) that were running and were stopped."""
    removed: tuple[str, ...] = ()
    """In containers: every container removed (by process id), then its network."""
    stop_deadlines_s: dict[str, float] = attrs.field(factory=dict)
    """Process id -> how long it was given from SIGTERM before SIGKILL, in seconds."""


@attrs.define
class Stopped:
    """What stopping a group of processes did."""

    terminated: list[str] = attrs.field(factory=list)
    """Ids that exited after SIGTERM."""
    killed: list[str] = attrs.field(factory=list)
    """Ids still running at their deadline, SIGKILLed."""
    deadlines_s: dict[str, float] = attrs.field(factory=dict)
    """Id -> its deadline, in seconds after SIGTERM."""


@attrs.frozen(kw_only=True)
class DatabaseStarted:
    """The database an ``up`` runs the cluster against."""

    url: str
    pg_port: int | None
    """The embedded server's port on this machine; None for any other database."""
    started: bool
    """Whether this ``up`` started it (or some process of it)."""


class ClusterDriver(Protocol):
    """What every launcher does; ``process_id`` names a process of cluster.json (``cp-1``,
    ``w-3``, ``fleet-1``, ``db``). The second group is what :class:`ops.launcher.up.Launcher`
    asks of a driver."""

    state: StateDir
    insecure: bool
    on_start: Callable[[], None] | None

    def config(self) -> ClusterConfig:
        """The recorded cluster. Raises ClusterError where none is recorded."""
        ...

    def pids(self, config: ClusterConfig | None = None) -> dict[str, int]:
        """Process id -> the machine's pid of each live process."""
        ...

    def live_process(self, spec: ProcessSpec) -> psutil.Process | None: ...

    def metrics_addresses(self) -> dict[str, str]:
        """Process id -> host:port of its Prometheus /metrics."""
        ...

    def up(
        self,
        *,
        control_planes: int | None = None,
        workers: int | None = None,
        timeout_s: float = ...,
        on_progress: Callable[[str], None] | None = None,
    ) -> UpResult: ...

    def kill(self, process_id: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig``; returns the pid signalled. Raises ClusterError where it does not run."""
        ...

    def pause(self, process_id: str) -> None:
        """Freeze every process of ``process_id`` (SIGSTOP, or the cgroup freezer)."""
        ...

    def unpause(self, process_id: str) -> None:
        """Thaw what :meth:`pause` froze; nothing where it is not frozen."""
        ...

    def down(self, *, timeout_s: float | None = None) -> DownReport: ...

    # -- what up asks of a driver ------------------------------------------------------

    def check_request(self, *, control_planes: int | None, workers: int | None) -> None:
        """Refuse counts or settings this driver cannot run, before anything is locked."""
        ...

    def check_record(self, previous: ClusterConfig | None) -> None:
        """Refuse a record of the other kind of cluster."""
        ...

    def prepare(self, previous: ClusterConfig | None, live_before: dict[str, int]) -> None:
        """Refuse what cannot change while the record's processes run; make what the driver
        needs before the database starts (an image, a network)."""
        ...

    def start_database(
        self, previous: ClusterConfig | None, live_before: dict[str, int], starting: Callable[[], None]
    ) -> DatabaseStarted:
        """Start the database unless it runs (``starting()`` first); where it is."""
        ...

    def launch_options(self, tls_args: Sequence[str]) -> LaunchOptions: ...

    def port_source(self) -> Callable[[], int]:
        """Gives each new process's port, one call per port."""
        ...

    def recorded(self, config: ClusterConfig) -> ClusterConfig:
        """``config`` with what this driver records beside the plan (the HA flag, the network)."""
        ...

    def issue_certificates(self, config: ClusterConfig) -> None: ...

    def stop(self, specs: Sequence[ProcessSpec], config: ClusterConfig | None) -> Stopped:
        """Stop the running processes of ``specs`` (workers first), each within its deadline."""
        ...

    def forget(self, process_ids: Sequence[str]) -> None:
        """Drop what is left of processes removed from the record (pid files, containers)."""
        ...

    def to_start(self, config: ClusterConfig, live_before: dict[str, int]) -> list[ProcessSpec]:
        """The processes of ``config`` that do not run."""
        ...

    def start(self, spec: ProcessSpec, config: ClusterConfig) -> None: ...

    def check_exited(self, config: ClusterConfig) -> None:
        """Raise ClusterError naming the first process of ``config`` that exited, with its log's end."""
        ...
