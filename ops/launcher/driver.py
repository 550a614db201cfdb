"""The one face of a cluster's launcher: :class:`ClusterDriver`.

A cluster of processes on this machine (:class:`ops.launcher.control.LocalCluster`) and one in
containers (:class:`ops.launcher.docker.DockerCluster`) are driven the same way: ``up`` and
``down``, and the faults that chaos, the benchmarks and ``stockade kill-*`` inject (a signal, a
freeze). What differs (processes or containers) stays in the drivers.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import psutil

    from ops.launcher.control import DownReport
    from ops.launcher.state import ClusterConfig, ProcessSpec, StateDir


class ClusterDriver(Protocol):
    """What every launcher does; ``process_id`` names a process of cluster.json
    (``cp-1``, ``w-3``, ``fleet-1``, ``db``)."""

    state: StateDir

    def config(self) -> ClusterConfig:
        """The recorded cluster. Raises ClusterError where none is recorded."""
        ...

    def pids(self, config: ClusterConfig | None = None) -> dict[str, int]:
        """Process id -> the machine's pid of each live process."""
        ...

    def live_process(self, spec: ProcessSpec) -> psutil.Process | None: ...

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
