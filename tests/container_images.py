"""The image container-job tests run: a small one built here, without network, on the engine.

Nothing can be pulled on these machines, so the image is built ``FROM`` one the engine already
holds (:data:`BASE_IMAGES`, the first found: the project's own ``stockade:<version>`` when
``stockade image build`` made it; ``STOCKADE_TEST_BASE_IMAGE`` names another) with
``network_mode="none"``, and removed after the session. The base must have ``python3`` (the
tests' jobs are small Python programs); the job image sets its own command and no entry point
is expected.
"""

from __future__ import annotations

import io
import os
import uuid


def _project_image() -> str:
    """The project's own image, ``stockade:<version>`` (``stockade image build``)."""
    import importlib.metadata

    try:
        return f"stockade:{importlib.metadata.version('stockade')}"
    except importlib.metadata.PackageNotFoundError:
        return "stockade:latest"


BASE_IMAGES = (_project_image(), "stockade-base-test:1")
"""Images a job image may be built from, in order of preference: the project's own, then a
small Debian one with python3."""
TEST_LABEL = "stockade.test"
"""The label on every image and container the tests make (value: the session's id)."""


def engine_error(timeout_s: float = 2.0) -> str | None:
    """Why no container test can run here (no engine answers a ping), or None."""
    import docker

    try:
        client = docker.from_env(timeout=timeout_s)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Docker engine reachable: {type(exc).__name__}: {exc}"
    return None


def build_job_image(session: str) -> tuple[str | None, str]:
    """Build the tests' job image; returns (its tag, "") or (None, why it cannot be built)."""
    import docker
    import docker.errors

    client = docker.from_env(timeout=60)
    try:
        wanted = os.environ.get("STOCKADE_TEST_BASE_IMAGE")
        bases = (wanted,) if wanted else BASE_IMAGES
        base = None
        for name in bases:
            try:
                client.images.get(name)
            except docker.errors.ImageNotFound:
                continue
            base = name
            break
        if base is None:
            return None, (
                f"the Docker engine holds none of {', '.join(bases)} to build the job image from, "
                "and nothing can be pulled here (set STOCKADE_TEST_BASE_IMAGE to an image with python3)"
            )
        tag = f"stockade-job-test:{session}"
        dockerfile = (
            f"FROM {base}\n"
            f'LABEL {TEST_LABEL}="{session}"\n'
            'CMD ["python3", "-c", "print(\'the image command\')"]\n'
        )
        client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()), tag=tag, network_mode="none", rm=True, pull=False
        )
        return tag, ""
    finally:
        client.close()


def remove_image(tag: str) -> None:
    import docker

    client = docker.from_env(timeout=60)
    try:
        client.images.remove(tag, force=True)
    finally:
        client.close()


def remove_containers(worker_id: str) -> None:
    """Remove every container of the tests' worker ``worker_id`` (by its label)."""
    import docker

    client = docker.from_env(timeout=30)
    try:
        labelled = {"label": f"stockade.worker_id={worker_id}"}
        for container in client.containers.list(all=True, filters=labelled):
            container.remove(force=True)
    finally:
        client.close()


def new_session() -> str:
    return uuid.uuid4().hex[:12]


class EngineProxy:
    """A Unix socket that passes every connection on to the engine's (``/var/run/docker.sock``)
    until :meth:`cut`, which closes them all and refuses new ones: an engine that disappears,
    for the processes pointed at it (``DOCKER_HOST=unix://<path>``), without touching the
    engine itself."""

    def __init__(self, path: str, engine: str = "/var/run/docker.sock") -> None:
        import socket
        import threading

        self.path = path
        self.engine = engine
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(64)
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.engine)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._cut:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pump(source: object, sink: object) -> None:
        import socket

        assert isinstance(source, socket.socket) and isinstance(sink, socket.socket)
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """Close every connection and the listening socket: the engine is gone from here on."""
        import socket

        with self._lock:
            self._cut = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
