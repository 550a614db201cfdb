"""What ``stockade up`` starts and stops, planned without processes: the asked counts against
the recorded cluster and what runs."""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection
from pathlib import Path

import attrs
import pytest

from ops.cluster import ClusterConfig, ClusterError, StateDir
from ops.launcher.docker import cpu_shares_of
from ops.launcher.plan import LaunchOptions, Plan, plan
from ops.launcher.ready import FRESH_HEARTBEAT_S, fresh_heartbeat_s
from ops.launcher.state import option_value
from runtime.errors import InvalidArgument

URL = "postgresql://db/x"


class Planner:
    """Plans against one state folder with ports handed out 7000, 7001, ..."""

    def __init__(self, root: Path, **options: object) -> None:
        self.state = StateDir(root)
        self.options = LaunchOptions(**options)  # type: ignore[arg-type]
        self.ports = itertools.count(7000)

    def __call__(
        self,
        previous: ClusterConfig | None,
        *,
        control_planes: int | None = None,
        workers: int | None = None,
        running: Collection[str] = (),
    ) -> Plan:
        return plan(
            previous,
            state=self.state,
            database_url=URL,
            pg_port=None,
            control_planes=control_planes,
            workers=workers,
            running=running,
            options=self.options,
            free_port=self.ports.__next__,
        )


def ids(config: ClusterConfig) -> list[str]:
    return [p.id for p in config.processes]


def all_running(config: ClusterConfig) -> set[str]:
    return {p.id for p in config.processes}


def test_a_new_cluster_has_three_control_planes_and_five_workers_each_with_metrics(tmp_path: Path) -> None:
    """With no counts asked, a new cluster gets cp-1..cp-3 and w-1..w-5, all to start, and every
    process serves metrics on a port of its own, recorded in cluster.json."""
    result = Planner(tmp_path)(None)
    assert ids(result.config) == ["cp-1", "cp-2", "cp-3", "w-1", "w-2", "w-3", "w-4", "w-5"]
    assert result.start == tuple(ids(result.config)) and result.stop == () and result.removed == ()
    metrics = result.config.metrics_addresses()
    assert list(metrics) == ids(result.config)
    for spec in result.config.processes:
        assert metrics[spec.id] == f"127.0.0.1:{option_value(spec.args, '--metrics-port')}"
    ports = [p.port for p in result.config.processes] + [int(a.rpartition(":")[2]) for a in metrics.values()]
    assert len(set(ports)) == len(ports) == 16
    assert ClusterConfig.from_json(json.loads(json.dumps(result.config.to_json()))) == result.config


def test_up_again_without_counts_changes_nothing(tmp_path: Path) -> None:
    """A running cluster asked for nothing keeps its record, starts nothing and stops nothing."""
    planner = Planner(tmp_path)
    config = planner(None, workers=6).config
    again = planner(config, running=all_running(config))
    assert again.config == config
    assert (again.start, again.stop, again.removed) == ((), (), ())


def test_a_dead_process_is_started_again_as_recorded(tmp_path: Path) -> None:
    """A recorded process that does not run is started again with its recorded ports."""
    planner = Planner(tmp_path)
    config = planner(None).config
    again = planner(config, running=all_running(config) - {"cp-2", "w-4"})
    assert again.config == config and again.start == ("cp-2", "w-4")


def test_fewer_workers_stop_the_surplus_agents_and_drop_them(tmp_path: Path) -> None:
    """``--workers 2`` on five agents stops the running w-3..w-5 and drops them from the record;
    a surplus worker that is not running is dropped without a stop."""
    planner = Planner(tmp_path)
    config = planner(None).config
    smaller = planner(config, workers=2, running=all_running(config) - {"w-4"})
    assert ids(smaller.config) == ["cp-1", "cp-2", "cp-3", "w-1", "w-2"]
    assert [p.id for p in smaller.stop] == ["w-3", "w-5"]
    assert smaller.removed == ("w-3", "w-4", "w-5")
    assert smaller.start == ()
    assert smaller.config.processes[:5] == config.processes[:5]


def test_more_workers_add_only_the_new_ones(tmp_path: Path) -> None:
    """``--workers 7`` on five adds w-6 and w-7 on fresh ports; the recorded ones are unchanged."""
    planner = Planner(tmp_path)
    config = planner(None).config
    bigger = planner(config, workers=7, running=all_running(config))
    assert bigger.start == ("w-6", "w-7")
    assert bigger.config.processes[:8] == config.processes
    assert len({p.port for p in bigger.config.processes}) == 10


def test_a_whole_fleet_beyond_the_count_is_stopped_as_one(tmp_path: Path) -> None:
    """10 workers in fleets of 5 asked for 5: fleet-2 stops with all its workers."""
    planner = Planner(tmp_path, fleet_size=5)
    config = planner(None, workers=10).config
    smaller = planner(config, workers=5, running=all_running(config))
    assert ids(smaller.config) == ["cp-1", "cp-2", "cp-3", "fleet-1"]
    assert [w.id for w in smaller.config.workers] == ["w-1", "w-2", "w-3", "w-4", "w-5"]
    assert [p.id for p in smaller.stop] == ["fleet-2"]
    assert smaller.removed == ("fleet-2", "w-6", "w-7", "w-8", "w-9", "w-10")


def test_a_count_that_splits_a_fleet_is_refused_naming_the_counts_that_do_not(tmp_path: Path) -> None:
    """Workers of a fleet cannot be stopped one by one: ``--workers 7`` with fleets of 5 is
    refused, pointing at 5 and 10."""
    planner = Planner(tmp_path, fleet_size=5)
    config = planner(None, workers=10).config
    with pytest.raises(ClusterError) as info:
        planner(config, workers=7, running=all_running(config))
    assert str(info.value) == (
        "--workers must keep or stop each fleet whole (a fleet's workers run in one process), got 7 "
        "(it would stop w-8..w-10 of fleet-2 and keep w-6..w-7; --workers 5 stops fleet-2 with "
        "w-6..w-10; --workers 10 keeps every worker)"
    )
    assert isinstance(info.value, InvalidArgument)


def test_a_refused_count_names_every_fleet_the_nearest_counts_stop(tmp_path: Path) -> None:
    """40 workers in fleets of 20 asked for 5: the count below stops both fleets (not only the
    one split), the count above only the second."""
    planner = Planner(tmp_path, fleet_size=20)
    config = planner(None, workers=40).config
    with pytest.raises(ClusterError) as info:
        planner(config, workers=5, running=all_running(config))
    assert str(info.value).endswith(
        "(it would stop w-6..w-20 of fleet-1 and keep w-1..w-5; --workers 0 stops fleet-1 and fleet-2 "
        "with w-1..w-40; --workers 20 stops fleet-2 with w-21..w-40)"
    )


def test_fewer_control_planes_stop_the_surplus_after_the_workers_and_retarget_the_workers(
    tmp_path: Path,
) -> None:
    """``--control-planes 1`` with ``--workers 1`` stops w-2.. first, then cp-2 and cp-3, and the
    remaining worker's recorded control-plane list names cp-1 only (for its next start)."""
    planner = Planner(tmp_path)
    config = planner(None, workers=2).config
    smaller = planner(config, control_planes=1, workers=1, running=all_running(config))
    assert [p.id for p in smaller.stop] == ["w-2", "cp-2", "cp-3"]
    cp_1 = smaller.config.control_planes[0]
    assert ids(smaller.config) == ["cp-1", "w-1"] and cp_1 == config.control_planes[0]
    worker = smaller.config.processes[1]
    assert option_value(worker.args, "--control-planes") == cp_1.address


def test_more_control_planes_are_added_and_named_to_the_workers(tmp_path: Path) -> None:
    """``--control-planes 4`` adds cp-4 (with metrics) and every recorded worker's and fleet's
    control-plane list then names all four."""
    planner = Planner(tmp_path, fleet_size=2)
    config = planner(None, workers=3).config
    bigger = planner(config, control_planes=4, running=all_running(config))
    assert bigger.start == ("cp-4",)
    addresses = set(bigger.config.control_plane_addresses)
    assert len(addresses) == 4 and "cp-4" in bigger.config.metrics_addresses()
    for fleet in bigger.config.fleets:
        assert set((option_value(fleet.args, "--control-planes") or "").split(",")) == addresses
    assert all(set(w.control_planes) == addresses for w in bigger.config.hosted_workers)


def test_a_control_plane_that_comes_back_listens_where_it_did(tmp_path: Path) -> None:
    """After ``--control-planes 1``, ``--control-planes 3`` brings cp-2 and cp-3 back on their
    own ports (a running worker still has them in the list it started with), and a stopped
    control plane's ports are never handed to another process meanwhile."""
    planner = Planner(tmp_path)
    config = planner(None, workers=2).config
    smaller = planner(config, control_planes=1, running=all_running(config)).config
    assert [p.id for p in smaller.retired_control_planes] == ["cp-2", "cp-3"]
    grown = planner(smaller, workers=6, running=all_running(smaller)).config
    retired_ports = {a for p in smaller.retired_control_planes for a in (p.address, p.metrics_address)}
    assert not retired_ports & {a for p in grown.processes for a in (p.address, p.metrics_address)}
    back = planner(grown, control_planes=3, running=all_running(grown))
    assert back.start == ("cp-2", "cp-3")
    assert back.config.control_planes == config.control_planes
    assert back.config.retired_control_planes == ()
    assert ClusterConfig.from_json(json.loads(json.dumps(smaller.to_json()))) == smaller


def test_workers_routed_elsewhere_keep_their_control_planes(tmp_path: Path) -> None:
    """A worker given its own route (the chaos harness's proxies) is not retargeted."""
    planner = Planner(tmp_path, worker_network=lambda w: ("127.0.0.1:9000", ["127.0.0.1:9001"]))
    config = planner(None, workers=1).config
    smaller = planner(config, control_planes=2, running=all_running(config))
    worker = smaller.config.processes[-1]
    assert option_value(worker.args, "--control-planes") == "127.0.0.1:9001"
    assert option_value(worker.args, "--advertise-address") == "127.0.0.1:9000"


def test_metrics_can_be_left_off(tmp_path: Path) -> None:
    """With ``metrics=False`` no process gets a ``--metrics-port``."""
    config = Planner(tmp_path, metrics=False)(None).config
    assert config.metrics_addresses() == {}
    assert not any("--metrics-port" in p.args for p in config.processes)


@pytest.mark.parametrize(("control_planes", "workers"), [(0, 5), (10, 5), (3, -1), (3, 1001)])
def test_counts_out_of_range_are_refused(tmp_path: Path, control_planes: int, workers: int) -> None:
    """1 to 9 control planes and 0 to 1,000 workers; the message names the range."""
    with pytest.raises(ClusterError, match=r"must be between \d+ and \d+, got -?\d+"):
        Planner(tmp_path)(None, control_planes=control_planes, workers=workers)


def test_the_up_commands_bounds_are_the_plans() -> None:
    """`stockade up` refuses the counts the plan refuses (its options repeat the limits so that
    `--help` need not import the launcher)."""
    import typing

    from ops.cli.local import up
    from ops.launcher.plan import MAX_CONTROL_PLANES, MAX_WORKERS

    hints = typing.get_type_hints(up, include_extras=True)
    (cps,) = hints["control_planes"].__metadata__
    (workers,) = hints["workers"].__metadata__
    assert (cps.min, cps.max) == (1, MAX_CONTROL_PLANES)
    assert (workers.min, workers.max) == (0, MAX_WORKERS)


def test_a_cluster_in_containers_listens_on_each_containers_own_address(tmp_path: Path) -> None:
    """With ``host_of`` (a cluster in containers), every process listens, serves its metrics and
    is reached at its container's address, workers are given those of the control planes, and
    the record keeps the network so it reads back the same."""
    from ops.launcher.state import DockerSpec

    spec = DockerSpec(network="n", subnet="172.29.7.0/24", image="stockade:0", prefix="stockade-x")
    result = Planner(tmp_path, host_of=spec.address_of)(None, control_planes=2, workers=2)
    config = result.config
    assert [p.address.rpartition(":")[0] for p in config.processes] == [
        "172.29.7.11",
        "172.29.7.12",
        "172.29.7.21",
        "172.29.7.22",
    ]
    for process in config.processes:
        host = process.address.rpartition(":")[0]
        assert option_value(process.args, "--host") == host
        assert process.metrics_address.startswith(f"{host}:")
    cp_1, cp_2 = config.control_plane_addresses
    assert option_value(config.processes[2].args, "--control-planes") == f"{cp_2},{cp_1}"
    recorded = ClusterConfig.from_json(json.loads(json.dumps(attrs_evolve(config, docker=spec).to_json())))
    assert recorded.docker == spec


def test_container_addresses_are_fixed_by_id_and_bounded_by_the_subnet() -> None:
    """The database is host 2, cp-N host 10+N and w-N host 20+N of the /24; an id beyond what
    the subnet holds, or of another kind, is refused naming the ids it holds."""
    from ops.launcher.state import DockerSpec

    spec = DockerSpec(network="n", subnet="172.29.7.0/24", image="stockade:0", prefix="stockade-x")
    assert [spec.address_of(i) for i in ("pg", "cp-1", "cp-9", "w-1", "w-200")] == [
        "172.29.7.2",
        "172.29.7.11",
        "172.29.7.19",
        "172.29.7.21",
        "172.29.7.220",
    ]
    for bad in ("cp-10", "w-0", "w-201", "fleet-1", "db"):
        with pytest.raises(ClusterError, match=r"pg, cp-1\.\.cp-9 and w-1\.\.w-200"):
            spec.address_of(bad)
    assert DockerSpec.prefix_for(Path("/a")) != DockerSpec.prefix_for(Path("/b"))
    assert spec.container_name("w-3") == "stockade-x-w-3"


def attrs_evolve(config: ClusterConfig, **changes: object) -> ClusterConfig:
    import attrs

    return attrs.evolve(config, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "fresh_s"),
    [
        ({}, FRESH_HEARTBEAT_S),
        ({"agent_args": ("--heartbeat-interval-s", "0.5")}, FRESH_HEARTBEAT_S),
        ({"agent_args": ("--heartbeat-interval-s", "3")}, 6.0),
        ({"agent_args": ("--heartbeat-interval-s=5",), "fleet_size": 5}, 10.0),
    ],
)
def test_readiness_waits_for_a_heartbeat_as_young_as_two_of_the_workers_intervals(
    tmp_path: Path, options: dict[str, object], fresh_s: float
) -> None:
    """A cluster whose workers beat every 3 s is ready with heartbeats up to 6 s old (in agent
    processes and in fleets alike), never stricter than FRESH_HEARTBEAT_S."""
    result = Planner(tmp_path, **options)(None)
    assert fresh_heartbeat_s(result.config) == fresh_s


def test_containers_weigh_the_database_and_control_planes_above_the_workers() -> None:
    """Under contention the kernel shares CPU between containers first: the database and each
    control plane outweigh a worker's container, and 100 workers' containers together weigh no
    more than 4 fleet processes at the engine's default weight (1024 each)."""
    assert cpu_shares_of("pg") > cpu_shares_of("cp-1") == cpu_shares_of("cp-9") > cpu_shares_of("w-1")
    assert 100 * cpu_shares_of("w-100") <= 4 * 1024 < cpu_shares_of("pg") + 3 * cpu_shares_of("cp-1")


def test_every_new_control_plane_gets_a_console_port_of_its_own(tmp_path: Path) -> None:
    """Each control plane of a new cluster is given an --http-port, on a port no other process
    has, recorded in cluster.json; its console URL is https with TLS, http on 127.0.0.1 without."""
    planner = Planner(tmp_path / "s")
    result = planner(None, control_planes=3, workers=1)
    config = attrs.evolve(result.config, cert_dir=str(tmp_path / "certs"))
    consoles = config.console_urls()
    assert list(consoles) == ["cp-1", "cp-2", "cp-3"]
    for spec in config.control_planes:
        port = option_value(spec.args, "--http-port")
        assert consoles[spec.id] == f"https://127.0.0.1:{port}"
    every_port = [p.port for p in config.processes]
    every_port += [int(a.rpartition(":")[2]) for a in config.metrics_addresses().values()]
    every_port += [int(u.rpartition(":")[2]) for u in consoles.values()]
    assert len(every_port) == len(set(every_port))
    again = ClusterConfig.from_json(json.loads(json.dumps(config.to_json())))
    assert again.console_urls() == consoles
    insecure = attrs.evolve(config, cert_dir=None)
    assert all(url.startswith("http://127.0.0.1:") for url in insecure.console_urls().values())
    kept = planner(result.config, running=all_running(result.config))
    assert [p.console_address for p in kept.config.control_planes] == [
        p.console_address for p in result.config.control_planes
    ]
