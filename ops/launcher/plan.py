"""What ``up`` starts and stops: :func:`plan`, a pure function of the record, the asked counts and
what runs (ports come from the caller). Its rules: docs/design.md, "How up changes a cluster".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import attrs

from ops.config import ClusterRequestRefused
from ops.launcher.state import (
    LISTEN_HOST,
    WORKER_CAPACITIES,
    ClusterConfig,
    ProcessSpec,
    StateDir,
    WorkerSpec,
    option_value,
    worker_order,
)
from runtime.settings.fields import str_tuple

__all__ = ["DEFAULT_CONTROL_PLANES", "DEFAULT_WORKERS", "LaunchOptions", "Plan", "check_counts", "plan"]

DEFAULT_CONTROL_PLANES = 3
DEFAULT_WORKERS = 5


@attrs.frozen(kw_only=True)
class LaunchOptions:
    """How new processes are made (recorded ones keep theirs); see :class:`ops.launcher.LocalCluster`."""

    cp_args: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    agent_args: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    fleet_size: int = 0
    worker_capacities: tuple[tuple[int, int], ...] | None = None
    metrics: bool = True
    console: bool = True
    """Give every new control plane an ``--http-port`` of its own: its web console."""
    worker_network: Callable[[str], tuple[str, list[str]]] | None = None
    host_of: Callable[[str], str] = lambda _process_id: LISTEN_HOST
    """The address a new process listens on, by its id (a container's own, in containers)."""


@attrs.frozen(kw_only=True)
class Plan:
    """What ``up`` does to the processes and the record."""

    config: ClusterConfig
    """The cluster.json to write."""
    start: tuple[str, ...]
    """Ids of the processes of ``config`` that do not run now, in ``config``'s order."""
    stop: tuple[ProcessSpec, ...]
    """Running processes the asked counts leave out, workers' processes first."""
    removed: tuple[str, ...]
    """Ids dropped from the record (control planes, workers, fleets), running or not."""


def plan(
    previous: ClusterConfig | None,
    *,
    state: StateDir,
    database_url: str,
    pg_port: int | None,
    control_planes: int | None,
    workers: int | None,
    running: Collection[str],
    options: LaunchOptions,
    free_port: Callable[[], int],
) -> Plan:
    """The plan that brings the recorded cluster (``previous``, None for a new one) to the
    asked counts.

    Args:
        pg_port: the embedded server's port (kept off the ports handed out), or None.
        control_planes, workers: the counts wanted; None keeps the recorded count (or the
            default for a new cluster).
        running: ids of the recorded processes that run now.
        free_port: returns a port that is free now; called once per port a new process needs.

    Raises:
        ClusterRequestRefused: as :func:`check_counts`.
    """
    control_planes, workers = check_counts(previous, control_planes=control_planes, workers=workers)
    recorded = list(previous.processes) if previous is not None else []

    retired = list(previous.retired_control_planes) if previous is not None else []
    used_ports = {
        _port(a)
        for p in [*recorded, *retired]
        for a in (p.address, p.metrics_address, p.console_address)
        if a
    }
    used_ports |= {w.port for w in (previous.hosted_workers if previous is not None else ())}
    if pg_port:
        used_ports.add(pg_port)

    def new_port() -> int:
        while True:
            port = free_port()
            if port not in used_ports:
                used_ports.add(port)
                return port

    kept, stop, removed = _surplus(previous, control_planes, workers, running)
    cps = _control_planes(kept, control_planes, options, new_port)
    back = {p.id for p in cps}
    kept = attrs.evolve(
        kept, retired_control_planes=[p for p in kept.retired_control_planes if p.id not in back]
    )
    if previous is not None and [p.address for p in cps] != previous.control_plane_addresses:
        kept = _retarget(kept, previous.control_plane_addresses, cps)
    config = _add_workers(kept, cps, workers, options, state, new_port)
    config = attrs.evolve(config, database_url=database_url, embedded_pg_port=pg_port)
    start = tuple(p.id for p in config.processes if p.id not in running)
    return Plan(config=config, start=start, stop=stop, removed=removed)


MAX_CONTROL_PLANES = 9
MAX_WORKERS = 1000
"""Most workers of a local cluster (the packing benchmark's limit)."""


def check_counts(
    previous: ClusterConfig | None, *, control_planes: int | None, workers: int | None
) -> tuple[int, int]:
    """The counts :func:`plan` will bring the cluster to, (control planes, workers), with None
    read as the recorded count (or the default for a new cluster).

    Raises:
        ClusterRequestRefused: a count is out of range, or the worker count would split a fleet
            (the message names the nearest counts that would not).
    """
    if control_planes is None:
        control_planes = len(previous.control_planes) if previous is not None else DEFAULT_CONTROL_PLANES
    if workers is None:
        workers = len(previous.workers) if previous is not None else DEFAULT_WORKERS
    if not 1 <= control_planes <= MAX_CONTROL_PLANES:
        raise ClusterRequestRefused(
            "--control-planes", control_planes, f"must be between 1 and {MAX_CONTROL_PLANES}"
        )
    if not 0 <= workers <= MAX_WORKERS:
        raise ClusterRequestRefused("--workers", workers, f"must be between 0 and {MAX_WORKERS}")
    if previous is not None:
        surplus = {w.id for w in previous.workers if _number(w.id) > workers}
        for fleet in previous.fleets:
            hosted = [w.id for w in previous.workers_in(fleet.id)]
            dropped = [w for w in hosted if w in surplus]
            if dropped and len(dropped) < len(hosted):
                raise ClusterRequestRefused(
                    "--workers",
                    workers,
                    "must keep or stop each fleet whole (a fleet's workers run in one process)",
                    detail=_split_fleet_detail(previous, workers, fleet.id, hosted, dropped),
                )
    return control_planes, workers


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _number(process_or_worker_id: str) -> int:
    return worker_order(process_or_worker_id)[0]


def _surplus(
    previous: ClusterConfig | None, control_planes: int, workers: int, running: Collection[str]
) -> tuple[ClusterConfig, tuple[ProcessSpec, ...], tuple[str, ...]]:
    """The record without what the counts leave out, the running processes to stop, the ids removed."""
    if previous is None:
        return ClusterConfig(database_url="", embedded_pg_port=None, processes=()), (), ()
    surplus_workers = {w.id for w in previous.workers if _number(w.id) > workers}
    gone: list[ProcessSpec] = []
    for spec in previous.processes:
        if spec.kind == "cp":
            surplus = _number(spec.id) > control_planes
        elif spec.kind == "agent":
            surplus = spec.id in surplus_workers
        else:
            surplus = bool(hosted := previous.workers_in(spec.id)) and all(
                w.id in surplus_workers for w in hosted
            )
        if surplus:
            gone.append(spec)
    gone_ids = {p.id for p in gone}
    retired = {p.id: p for p in previous.retired_control_planes}
    retired.update((p.id, p) for p in gone if p.kind == "cp")
    kept = attrs.evolve(
        previous,
        processes=[p for p in previous.processes if p.id not in gone_ids],
        hosted_workers=[w for w in previous.hosted_workers if w.id not in surplus_workers],
        retired_control_planes=sorted(retired.values(), key=lambda p: _number(p.id)),
    )
    stop = [p for p in gone if p.kind != "cp" and p.id in running]
    stop += [p for p in gone if p.kind == "cp" and p.id in running]
    removed = [p.id for p in gone] + sorted(
        (w for w in surplus_workers if w not in gone_ids), key=worker_order
    )
    return kept, tuple(stop), tuple(removed)


def _id_ranges(ids: Collection[str]) -> str:
    """Worker ids in runs: ``w-1..w-5, w-9``."""
    numbers = sorted(_number(i) for i in ids)
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"w-{low}" if low == high else f"w-{low}..w-{high}" for low, high in runs)


def _what_count_stops(config: ClusterConfig, count: int) -> str:
    """What ``--workers count`` (one that splits no fleet) does to ``config``'s workers."""
    stopped = [w.id for w in config.workers if _number(w.id) > count]
    if not stopped:
        return "keeps every worker"
    processes = [
        p.id
        for p in config.processes
        if (
            p.kind == "fleet" and (hosted := config.workers_in(p.id)) and all(w.id in stopped for w in hosted)
        )
    ]
    if not processes:
        return f"stops {_id_ranges(stopped)}"
    return f"stops {' and '.join(processes)} with {_id_ranges(stopped)}"


def _split_fleet_detail(
    config: ClusterConfig, workers: int, fleet_id: str, hosted: Sequence[str], dropped: Sequence[str]
) -> str:
    """What ``workers`` would split, and what the nearest counts that do not split do."""
    spans = [
        (min(_number(w.id) for w in members), max(_number(w.id) for w in members))
        for f in config.fleets
        if (members := config.workers_in(f.id))
    ]

    def splits(count: int) -> tuple[int, int] | None:
        return next(((low, high) for low, high in spans if low <= count < high), None)

    lower = workers
    while (span := splits(lower)) is not None:
        lower = span[0] - 1
    upper = workers
    while (span := splits(upper)) is not None:
        upper = span[1]
    kept = [w for w in hosted if w not in dropped]
    return (
        f"it would stop {_id_ranges(dropped)} of {fleet_id} and keep {_id_ranges(kept)}; "
        f"--workers {lower} {_what_count_stops(config, lower)}; "
        f"--workers {upper} {_what_count_stops(config, upper)}"
    )


def _control_planes(
    kept: ClusterConfig, count: int, options: LaunchOptions, new_port: Callable[[], int]
) -> list[ProcessSpec]:
    """cp-1..cp-``count``: the recorded ones as they are, a retired one back on its own ports,
    new ones on fresh ports."""
    recorded = {p.id: p for p in kept.control_planes}
    retired = {p.id: p for p in kept.retired_control_planes}
    specs = []
    for i in range(1, count + 1):
        cp_id = f"cp-{i}"
        spec = recorded.get(cp_id) or retired.get(cp_id)
        if spec is None:
            port = new_port()
            host = options.host_of(cp_id)
            spec = ProcessSpec(
                id=cp_id,
                kind="cp",
                address=f"{host}:{port}",
                args=("cp", "--id", cp_id, "--host", host, "--port", str(port), *options.cp_args),
            )
            spec = _with_metrics(spec, options, new_port)
            spec = _with_port(
                spec, options, new_port, "--http-port", "console_address", wanted=options.console
            )
        specs.append(spec)
    return specs


def _with_metrics(spec: ProcessSpec, options: LaunchOptions, new_port: Callable[[], int]) -> ProcessSpec:
    return _with_port(spec, options, new_port, "--metrics-port", "metrics_address", wanted=options.metrics)


def _with_port(
    spec: ProcessSpec,
    options: LaunchOptions,
    new_port: Callable[[], int],
    option: str,
    field: str,
    *,
    wanted: bool,
) -> ProcessSpec:
    """``spec`` given ``option <new port>``, its address recorded in ``field``, if ``wanted``."""
    if not wanted:
        return spec
    port = new_port()
    address = f"{options.host_of(spec.id)}:{port}"
    return attrs.evolve(spec, args=(*spec.args, option, str(port)), **{field: address})


def _rotated(cps: Sequence[ProcessSpec], index: int) -> list[str]:
    """The control-plane addresses as worker ``w-index`` is given them: rotated, so that the
    workers' heartbeats (to the first that answers) do not all go to cp-1."""
    shift = index % len(cps)
    return [p.address for p in [*cps[shift:], *cps[:shift]]]


def _retarget(kept: ClusterConfig, old: Sequence[str], cps: Sequence[ProcessSpec]) -> ClusterConfig:
    """The recorded workers with their control-plane lists made from ``cps``, for those whose
    list named only the old control planes (``old``)."""
    old_set = set(old)
    addresses = ",".join(p.address for p in cps)

    def ours(listed: Sequence[str]) -> bool:
        return bool(listed) and set(listed) <= old_set

    processes = []
    for spec in kept.processes:
        listed = (option_value(spec.args, "--control-planes") or "").split(",")
        if spec.kind == "agent" and ours(listed):
            spec = attrs.evolve(
                spec,
                args=_set_option(spec.args, "--control-planes", ",".join(_rotated(cps, _number(spec.id)))),
            )
        elif spec.kind == "fleet" and ours(listed):
            spec = attrs.evolve(spec, args=_set_option(spec.args, "--control-planes", addresses))
        processes.append(spec)
    hosted = [
        attrs.evolve(w, control_planes=_rotated(cps, _number(w.id))) if ours(w.control_planes) else w
        for w in kept.hosted_workers
    ]
    return attrs.evolve(kept, processes=processes, hosted_workers=hosted)


def _set_option(args: Sequence[str], name: str, value: str) -> tuple[str, ...]:
    """``args`` with the value after ``name`` replaced (the option is there)."""
    out = list(args)
    out[out.index(name) + 1] = value
    return tuple(out)


def _add_workers(
    kept: ClusterConfig,
    cps: list[ProcessSpec],
    workers: int,
    options: LaunchOptions,
    state: StateDir,
    new_port: Callable[[], int],
) -> ClusterConfig:
    """``kept`` with control planes ``cps`` and new workers up to w-``workers``: agents of their
    own, or K per new fleet (numbered after the highest recorded one)."""
    capacities = options.worker_capacities or WORKER_CAPACITIES
    recorded = {p.id: p for p in kept.processes if p.kind == "agent"}
    hosted_ids = {w.id for w in kept.hosted_workers}
    agent_specs: list[ProcessSpec] = []
    new_hosted: list[WorkerSpec] = []
    for i in range(1, workers + 1):
        worker_id = f"w-{i}"
        if worker_id in hosted_ids:
            continue
        spec = recorded.get(worker_id)
        if spec is not None:
            agent_specs.append(spec)
            continue
        cpu_millis, memory_mb = capacities[(i - 1) % len(capacities)]
        advertise, routed = "", _rotated(cps, i)
        if options.worker_network is not None:
            advertise, routed = options.worker_network(worker_id)
        if options.fleet_size > 0:
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
        port = new_port()
        host = options.host_of(worker_id)
        args: tuple[str, ...] = ("agent", "--id", worker_id, "--host", host, "--port", str(port))
        args += (
            "--cpu-millis",
            str(cpu_millis),
            "--memory-mb",
            str(memory_mb),
            "--control-planes",
            ",".join(routed),
        )
        args += ("--work-dir", str(state.work_dir(worker_id)), *options.agent_args)
        if options.worker_network is not None:
            args = (*args, "--advertise-address", advertise)
        spec = ProcessSpec(id=worker_id, kind="agent", address=f"{host}:{port}", args=args)
        agent_specs.append(_with_metrics(spec, options, new_port))

    fleet_specs = list(kept.fleets)
    numbers = [n for p in fleet_specs if (n := _number(p.id))]
    next_number = max(numbers, default=0) + 1
    hosted_specs = list(kept.hosted_workers)
    size = max(1, options.fleet_size)
    addresses = ",".join(p.address for p in cps)
    for start in range(0, len(new_hosted), size):
        fleet_id = f"fleet-{next_number}"
        next_number += 1
        hosted_specs += [attrs.evolve(w, process_id=fleet_id) for w in new_hosted[start : start + size]]
        args = (
            "fleet",
            "--id",
            fleet_id,
            "--spec",
            str(state.fleet_spec_path(fleet_id)),
            "--host",
            LISTEN_HOST,
        )
        fleet = ProcessSpec(
            id=fleet_id,
            kind="fleet",
            address="",
            args=(*args, "--control-planes", addresses, *options.agent_args),
        )
        fleet_specs.append(_with_metrics(fleet, options, new_port))
    return attrs.evolve(kept, processes=[*cps, *agent_specs, *fleet_specs], hosted_workers=hosted_specs)
