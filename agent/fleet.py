"""Fleet mode: many workers' agents in one process (``stockade fleet``).

One :func:`agent.main.run_agent` task per worker of a spec file (:func:`load_fleet_spec`), their
calls over one shared client (:func:`shared_client`), one-for-all on failure
(:class:`WorkerFailed`): docs/design.md, "Fleets: many workers in one process".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Unpack

import attrs
import trio

from agent.control_plane import GrpcControlPlane
from agent.core import Agent
from agent.main import ProcessOptions, run_agent, serve_until_signal, start_process
from agent.starts import Spawner, StartLimiter
from runtime import identifiers, log
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument, PermanentError
from runtime.resources import check_offered
from runtime.routes import home_index
from runtime.settings.agent import AgentSettings, uid_range
from runtime.tls import TlsFiles

REGISTRATION_STEP_S = 0.08
"""A fleet starts (and so registers) one worker this often at most, in seconds."""

_REQUIRED = ("id", "port", "cpu_millis", "memory_mb", "work_dir")
_OPTIONAL = ("advertise_address", "control_planes", "resources")


class FleetSpecError(InvalidArgument):
    """A fleet spec that cannot be used; the message names the file (``source``), the entry (e.g.
    ``"entry 2 (id 'w-3')"``; empty for the whole spec), the field, the value and the rule."""

    def __init__(self, source: str, entry: str, field: str, value: object, rule: str) -> None:
        super().__init__(field, value, rule)
        where = f"{source}: {entry}: " if entry else f"{source}: "
        Exception.__init__(self, where + str(self))
        self.source = source
        self.entry = entry


class WorkerFailed(PermanentError):
    """One worker of a fleet failed for good with ``error`` (a group is flattened into its
    leaves); the fleet stops."""

    def __init__(self, worker_id: str, error: BaseException) -> None:
        causes = "; ".join(_describe(e) for e in _leaves(error))
        super().__init__(f"worker {worker_id} failed: {causes}")
        self.worker_id = worker_id


@attrs.frozen(kw_only=True)
class FleetWorker:
    """One worker of a fleet, as its spec file gives it."""

    worker_id: str
    port: int
    """gRPC port of its Worker service; 0 picks a free one."""
    cpu_millis: int
    """CPU it offers, in millicores."""
    memory_mb: int
    """Memory it offers, in MiB."""
    work_dir: str
    """Absolute folder for its ``agent.jsonl`` and its jobs' output."""
    advertise_address: str = ""
    """host:port the leader should call; empty: the listen address."""
    control_planes: tuple[str, ...] = ()
    """Its own control-plane addresses; empty: the fleet's."""
    resources: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    """The countable devices it offers, name -> unit ids (``"resources": {"gpu": ["0", "1"]}``;
    fake units serve tests and chaos; docs/devices.md)."""


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        # asyncio's bind errors already say the address; others get their errno text.
        return str(error)
    return f"{type(error).__name__}: {error}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_fleet_spec(
    data: Any, *, source: str = "fleet spec", base_dir: Path | None = None
) -> list[FleetWorker]:
    """Check a decoded spec (the JSON list) and return its workers, in order.

    Args:
        source: how to name the spec in errors (its path).
        base_dir: the folder relative ``work_dir`` values are taken from (default: the cwd).

    Raises:
        FleetSpecError: not a non-empty list of objects; a key missing, unknown or of the
            wrong type or range; two workers with the same id, non-zero port or work folder.
    """
    if not isinstance(data, list) or not data:
        raise FleetSpecError(source, "", "spec", data, "must be a non-empty JSON list of worker objects")
    base = (base_dir or Path.cwd()).absolute()
    workers: list[FleetWorker] = []
    seen_ids: dict[str, int] = {}
    seen_ports: dict[int, str] = {}
    seen_dirs: dict[str, str] = {}
    for index, item in enumerate(data):
        entry = f"entry {index}"
        if not isinstance(item, Mapping):
            raise FleetSpecError(source, entry, "worker", item, "must be a JSON object")
        if isinstance(item.get("id"), str) and item["id"]:
            entry = f"entry {index} (id {item['id']!r})"
        bad = partial(FleetSpecError, source, entry)
        parsed = partial(_parsed, source=source, entry=entry)
        for key in _REQUIRED:
            if key not in item:
                raise bad(key, None, "is required")
        unknown = sorted(set(item) - set(_REQUIRED) - set(_OPTIONAL))
        if unknown:
            known = ", ".join((*_REQUIRED, *_OPTIONAL))
            raise bad(unknown[0], item[unknown[0]], f"is not a known key ({known})")

        worker_id = item["id"]
        parsed(identifiers.check_id, worker_id, "id")
        if worker_id in seen_ids:
            raise bad("id", worker_id, f"is already used by entry {seen_ids[worker_id]}")
        port = item["port"]
        if not _is_int(port) or not 0 <= port <= 65535:
            raise bad("port", port, "must be an integer in 0..65535 (0: a free one)")
        if port and port in seen_ports:
            raise bad("port", port, f"is already used by {seen_ports[port]}")
        for key in ("cpu_millis", "memory_mb"):
            if not _is_int(item[key]) or item[key] <= 0:
                raise bad(key, item[key], "must be an integer > 0")
        work_dir = item["work_dir"]
        if not isinstance(work_dir, str) or not work_dir:
            raise bad("work_dir", work_dir, "must be a non-empty path")
        resolved = str((base / work_dir).absolute())
        if resolved in seen_dirs:
            raise bad("work_dir", work_dir, f"is already used by {seen_dirs[resolved]} (one log per worker)")
        advertise = item.get("advertise_address", "")
        if advertise != "":
            parsed(identifiers.parse_address, advertise, "advertise_address")
        control_planes = item.get("control_planes", [])
        if not isinstance(control_planes, list):
            raise bad("control_planes", control_planes, "must be a list of host:port strings")
        for place, address in enumerate(control_planes):
            parsed(identifiers.parse_address, address, f"control_planes[{place}]")
        offered = item.get("resources", {})
        if not isinstance(offered, Mapping) or not all(isinstance(u, list) for u in offered.values()):
            raise bad(
                "resources", offered, 'must be an object of name -> list of unit ids ({"gpu": ["0", "1"]})'
            )
        try:
            resources = check_offered(offered)
        except InvalidArgument as exc:
            raise FleetSpecError(source, entry, exc.field, exc.value, exc.rule) from None

        seen_ids[worker_id] = index
        if port:
            seen_ports[port] = worker_id
        seen_dirs[resolved] = worker_id
        workers.append(
            FleetWorker(
                worker_id=worker_id,
                port=port,
                cpu_millis=item["cpu_millis"],
                memory_mb=item["memory_mb"],
                work_dir=resolved,
                advertise_address=advertise,
                control_planes=tuple(control_planes),
                resources=resources,
            )
        )
    return workers


def _parsed(parser: Callable[..., object], value: Any, field: str, *, source: str, entry: str) -> None:
    """``parser(value, field=field)``; its refusal raised as a :class:`FleetSpecError`."""
    try:
        parser(value, field=field)
    except InvalidArgument as exc:
        raise FleetSpecError(source, entry, field, value, exc.rule) from None


def load_fleet_spec(path: Path) -> list[FleetWorker]:
    """Read and check the spec file at ``path``; FleetSpecError when it cannot be read, is not
    JSON, or breaks a rule (:func:`parse_fleet_spec`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FleetSpecError(
            str(path), "", "spec", str(path), f"must be a readable file ({exc.strerror})"
        ) from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FleetSpecError(str(path), "", "spec", text[:40], f"must be JSON ({exc})") from exc
    return parse_fleet_spec(data, source=str(path), base_dir=path.absolute().parent)


def fleet_settings(
    workers: Sequence[FleetWorker],
    *,
    control_planes: Sequence[str],
    listen_host: str = "127.0.0.1",
    cert_dir: Path | None = None,
    resources: dict[str, tuple[str, ...]] | None = None,
    **options: Any,
) -> list[AgentSettings]:
    """One :class:`AgentSettings` per worker.

    Args:
        control_planes: the fleet's control-plane addresses (a worker's own list wins).
        cert_dir: the folder of ``ca.crt`` and each worker's ``<id>.crt`` and ``<id>.key``
            (:class:`runtime.tls.TlsFiles`); None: plaintext (``--insecure``).
        resources: the devices every worker offers, name -> unit ids, but those whose spec
            names its own (``stockade fleet --resource``; docs/devices.md).
        options: further :class:`AgentSettings` fields shared by all.

    A ``job_uids`` range in ``options`` is split evenly among the workers, in their order
    (:func:`split_uid_range`): no two of them give out one uid.

    Raises:
        InvalidArgument: a worker has no control-plane address, or an option is out of range.
    """
    settings = []
    shared_uids = uid_range(options.pop("job_uids", None))
    parts = [None] * len(workers) if shared_uids is None else split_uid_range(shared_uids, len(workers))
    for worker, uids in zip(workers, parts, strict=True):
        addresses = worker.control_planes or tuple(control_planes)
        if not addresses:
            raise InvalidArgument(
                "control_planes", "", f"must name at least one host:port (worker {worker.worker_id} has none)"
            )
        settings.append(
            AgentSettings(
                worker_id=worker.worker_id,
                control_planes=addresses,
                cpu_millis=worker.cpu_millis,
                memory_mb=worker.memory_mb,
                work_dir=worker.work_dir,
                listen_host=listen_host,
                listen_port=worker.port,
                advertise_address=worker.advertise_address,
                tls=None if cert_dir is None else TlsFiles.in_dir(cert_dir, worker.worker_id),
                job_uids=uids,
                resources=dict(worker.resources or resources or {}),
                **options,
            )
        )
    return settings


def shared_client(
    workers: Sequence[AgentSettings], *, control_planes: Sequence[str], tls: TlsFiles | None
) -> ControlPlaneClient:
    """The one control-plane client a fleet's workers share, its per-call deadline the shortest
    ``heartbeat_timeout_s`` of ``workers``.

    ``tls``: the fleet certificate's files (naming every worker it hosts); None: plaintext.

    Raises:
        InvalidArgument: ``control_planes`` is empty or malformed.
    """
    return ControlPlaneClient(
        control_planes, timeout_s=min((w.heartbeat_timeout_s for w in workers), default=2.0), tls=tls
    )


async def _host(
    settings: AgentSettings,
    start_limiter: StartLimiter,
    leave_turns: trio.CapacityLimiter,
    spawner: Spawner,
    client: ControlPlaneClient | None,
    *,
    task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one worker's agent with its id bound to every log line of its tasks (each trio task
    runs in a copy of its parent's context), calling through ``client`` when it reaches the
    worker's control planes, in any order (else through a client of its own)."""
    log.bind(worker_id=settings.worker_id)
    control_plane = None
    own = list(settings.control_planes)
    if client is not None and sorted(client.addresses) == sorted(own):
        # The home a client of its own would give it: the home_index of its id in its list.
        client.add_route(settings.worker_id, home=own[home_index(settings.worker_id, len(own))])
        control_plane = GrpcControlPlane(
            client, hedge_after_s=settings.heartbeat_timeout_s, home_key=settings.worker_id
        )
    try:
        await run_agent(
            settings,
            control_plane=control_plane,
            start_limiter=start_limiter,
            leave_turns=leave_turns,
            spawner=spawner,
            sweep_beside_registration=True,
            task_status=task_status,
        )
    except Exception as exc:  # an ExceptionGroup too; Cancelled is a BaseException and passes
        raise WorkerFailed(settings.worker_id, exc) from exc


async def run_fleet(
    workers: Sequence[AgentSettings],
    *,
    spread_s: float | None = None,
    client: ControlPlaneClient | None = None,
    task_status: trio.TaskStatus[list[Agent]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run every worker's agent until cancelled; the asyncio bridge must already be open.

    Starts the agents in the order of ``workers``, spread evenly over ``spread_s`` seconds (None:
    the longest ``heartbeat_interval_s`` of the workers or :data:`REGISTRATION_STEP_S` per worker,
    whichever is longer; 0: all at once), then signals ``task_status.started(agents)``. The
    workers share the process's start slots, leave turns and spawner thread, and ``client``
    (the caller closes it; None: each worker makes its own).

    Raises:
        WorkerFailed: (inside an ExceptionGroup) a worker's agent failed; the others were
            stopped, their jobs first.
    """
    logger = log.get("fleet")
    if spread_s is None:
        spread_s = max([*(w.heartbeat_interval_s for w in workers), REGISTRATION_STEP_S * len(workers)])
    step_s = spread_s / len(workers) if workers else 0.0
    start_limiter = StartLimiter(min((w.max_concurrent_starts for w in workers), default=1))
    leave_turns = trio.CapacityLimiter(min((w.max_concurrent_leaves for w in workers), default=1))
    with Spawner() as spawner:
        async with trio.open_nursery() as nursery:
            began = trio.current_time()
            agents = []
            for index, settings in enumerate(workers):
                await trio.sleep_until(began + index * step_s)
                agents.append(
                    await nursery.start(_host, settings, start_limiter, leave_turns, spawner, client)
                )
            logger.info("every worker's agent is serving", workers=len(agents), spread_s=spread_s)
            task_status.started(agents)


async def _run_until_signal(workers: Sequence[AgentSettings], client: ControlPlaneClient | None) -> None:
    async def serve(agents: list[Agent]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                agents.extend(await nursery.start(partial(run_fleet, workers, client=client)))
        finally:
            if client is not None:
                client.close()  # every worker has left (or given up): nothing calls it any more

    logger = log.get("fleet")
    await serve_until_signal(
        serve, logger=logger, message="stopping: signal received, stopping every worker's jobs"
    )
    logger.info("fleet stopped")


def main(
    workers: Sequence[AgentSettings],
    *,
    fleet_id: str,
    control_planes: Sequence[str] = (),
    fleet_tls: TlsFiles | None = None,
    **options: Unpack[ProcessOptions],
) -> None:
    """Run the fleet as this process's one job until SIGTERM or SIGINT, then return.

    On the signal every running job of every worker is stopped (and logged) before this
    returns; on SIGHUP the process exits for a planned restart. Must run in the main thread.

    Args:
        fleet_id: this process's id, bound to every log line (``fleet_id``).
        control_planes: the fleet's control-plane addresses: the workers that use these share
            one client (:func:`shared_client`); empty: each worker has its own.
        fleet_tls: the fleet certificate's files; None with workers that use TLS: no shared
            client, each worker calls with its own certificate.

    Raises:
        WorkerFailed: a worker's agent failed (the first one, unwrapped from trio's
            exception group); every other worker's jobs were stopped first.
    """
    host = workers[0].listen_host if workers else "127.0.0.1"
    start_process(options, logger="fleet", metrics_host=host, fleet_id=fleet_id)
    log.get("fleet").info("fleet starting", workers=[w.worker_id for w in workers])
    secure = any(w.tls is not None for w in workers)
    client = None
    if control_planes and (fleet_tls is not None or not secure):
        client = shared_client(workers, control_planes=control_planes, tls=fleet_tls)
    log.get("fleet").info(
        "control-plane connections",
        shared=client is not None,
        fleet_certificate=None if fleet_tls is None else str(fleet_tls.cert_path),
    )
    try:
        trio.run(_run_until_signal, workers, client)
    except BaseExceptionGroup as group:
        matched, _ = group.split(WorkerFailed)
        if matched is None:
            raise
        failures = list(_leaves(matched))
        for failure in failures[1:]:
            log.get("fleet").error("worker failed", error=str(failure))
        raise failures[0] from None


def split_uid_range(uids: tuple[int, int], count: int) -> list[tuple[int, int]]:
    """``uids`` (first, last) cut into ``count`` consecutive equal parts (the rest unused).

    Raises:
        InvalidArgument: ``uids`` holds fewer uids than ``count``.
    """
    size = (uids[1] - uids[0] + 1) // count
    if size < 1:
        raise InvalidArgument(
            "job_uids", f"{uids[0]}-{uids[1]}", f"must hold at least one uid per worker ({count} workers)"
        )
    return [(uids[0] + i * size, uids[0] + (i + 1) * size - 1) for i in range(count)]
