"""A fleet's spec file is checked before any agent starts, and the launcher's fleet layout is right."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from agent.fleet import FleetSpecError, fleet_settings, load_fleet_spec, parse_fleet_spec
from ops.cluster import ClusterConfig, ClusterError, StateDir
from ops.launcher.plan import LaunchOptions, plan
from runtime.errors import InvalidArgument


def worker(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": "w-1",
        "port": 7201,
        "cpu_millis": 8000,
        "memory_mb": 16384,
        "work_dir": "/srv/w-1",
        "advertise_address": "",
    }
    entry.update(changes)
    return {k: v for k, v in entry.items() if v is not ...}


def test_a_good_spec_gives_one_worker_per_entry_in_order(tmp_path: Path) -> None:
    """Each entry becomes a worker with its own port, capacity and absolute work dir."""
    spec = [
        worker(),
        worker(id="w-2", port=0, work_dir="w-2", advertise_address="node-7:9000"),
        worker(id="w-3", port=7203, work_dir="w-3", control_planes=["10.0.0.1:7000"]),
    ]
    workers = parse_fleet_spec(spec, base_dir=tmp_path)
    assert [(w.worker_id, w.port, w.cpu_millis, w.memory_mb) for w in workers] == [
        ("w-1", 7201, 8000, 16384),
        ("w-2", 0, 8000, 16384),
        ("w-3", 7203, 8000, 16384),
    ]
    assert [w.work_dir for w in workers] == ["/srv/w-1", str(tmp_path / "w-2"), str(tmp_path / "w-3")]
    assert workers[1].advertise_address == "node-7:9000"
    settings = fleet_settings(workers, control_planes=["127.0.0.1:7000"], heartbeat_interval_s=1.0)
    assert [s.control_planes for s in settings] == [
        ("127.0.0.1:7000",),
        ("127.0.0.1:7000",),
        ("10.0.0.1:7000",),
    ]
    assert [s.listen_port for s in settings] == [7201, 0, 7203]
    assert {s.heartbeat_interval_s for s in settings} == {1.0}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"id": "w-1"}, "spec must be a non-empty JSON list of worker objects, got {'id': 'w-1'}"),
        ([], "spec must be a non-empty JSON list of worker objects, got []"),
        (["w-1"], "entry 0: worker must be a JSON object, got 'w-1'"),
        ([worker(port=...)], "entry 0 (id 'w-1'): port is required, got None"),
        ([worker(prot=7202)], "entry 0 (id 'w-1'): prot is not a known key (id, port, cpu_millis"),
        ([worker(id="")], "entry 0: id must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter"),
        ([worker(id=7)], "entry 0: id must be 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter"),
        (
            [worker(port="7201")],
            "entry 0 (id 'w-1'): port must be an integer in 0..65535 (0: a free one), got '7201'",
        ),
        ([worker(port=70000)], "port must be an integer in 0..65535 (0: a free one), got 70000"),
        ([worker(port=True)], "port must be an integer in 0..65535 (0: a free one), got True"),
        ([worker(cpu_millis=0)], "entry 0 (id 'w-1'): cpu_millis must be an integer > 0, got 0"),
        ([worker(memory_mb=1.5)], "entry 0 (id 'w-1'): memory_mb must be an integer > 0, got 1.5"),
        ([worker(work_dir="")], "entry 0 (id 'w-1'): work_dir must be a non-empty path, got ''"),
        ([worker(advertise_address="node-7")], "advertise_address must be host:port, got 'node-7'"),
        ([worker(control_planes="a:1")], "control_planes must be a list of host:port strings, got 'a:1'"),
        (
            [worker(), worker(port=7202, work_dir="/srv/w-2")],
            "entry 1 (id 'w-1'): id is already used by entry 0, got 'w-1'",
        ),
        (
            [worker(), worker(id="w-2", work_dir="/srv/w-2")],
            "entry 1 (id 'w-2'): port is already used by w-1, got 7201",
        ),
        (
            [worker(), worker(id="w-2", port=7202)],
            "entry 1 (id 'w-2'): work_dir is already used by w-1 (one log per worker), got '/srv/w-1'",
        ),
    ],
)
def test_a_bad_spec_is_refused_naming_the_entry_field_and_value(spec: Any, message: str) -> None:
    """A bad spec raises FleetSpecError naming the file, the entry, the field and the value."""
    with pytest.raises(FleetSpecError) as info:
        parse_fleet_spec(spec, source="fleet-1.json")
    assert str(info.value).startswith("fleet-1.json: ")
    assert message in str(info.value)
    assert isinstance(info.value, InvalidArgument)


def test_two_workers_may_both_ask_for_a_free_port() -> None:
    """Port 0 (a free one) may repeat; only fixed ports must differ."""
    spec = [worker(port=0), worker(id="w-2", port=0, work_dir="/srv/w-2")]
    assert [w.port for w in parse_fleet_spec(spec)] == [0, 0]


def test_an_unreadable_or_non_json_file_is_refused(tmp_path: Path) -> None:
    """A missing file and a file that is not JSON are both named in the error."""
    missing = tmp_path / "nope.json"
    with pytest.raises(FleetSpecError, match=r"nope\.json: spec must be a readable file"):
        load_fleet_spec(missing)
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(FleetSpecError, match=r"broken\.json: spec must be JSON"):
        load_fleet_spec(broken)


def test_relative_work_dirs_are_taken_from_the_spec_files_folder(tmp_path: Path) -> None:
    """``work_dir: "w-1"`` in /x/fleet.json means /x/w-1, wherever the fleet is started."""
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps([worker(work_dir="w-1")]))
    assert load_fleet_spec(path)[0].work_dir == str(tmp_path / "w-1")


def test_a_worker_without_control_planes_is_refused() -> None:
    """With no --control-planes, every worker must name its own."""
    workers = parse_fleet_spec([worker()])
    with pytest.raises(InvalidArgument, match="worker w-1 has none"):
        fleet_settings(workers, control_planes=[])


def test_the_launcher_groups_new_workers_k_per_fleet(tmp_path: Path) -> None:
    """10 workers with fleet_size 4 make fleet-1 (w-1..w-4), fleet-2 (w-5..w-8), fleet-3 (w-9, w-10),
    each worker with its own port and the capacities cycled; cluster.json keeps them."""
    state = StateDir(tmp_path)
    options = LaunchOptions(
        fleet_size=4,
        worker_capacities=((1000, 2048), (3000, 4096)),
        agent_args=["--json-logs"],
        metrics=False,
    )
    ports = itertools.count(7000)

    def plan_for(previous: ClusterConfig | None, workers: int) -> ClusterConfig:
        return plan(
            previous,
            state=state,
            database_url="postgresql://db/x",
            pg_port=None,
            control_planes=2,
            workers=workers,
            running=(),
            options=options,
            free_port=ports.__next__,
        ).config

    config = plan_for(None, 10)
    assert [p.id for p in config.processes] == ["cp-1", "cp-2", "fleet-1", "fleet-2", "fleet-3"]
    assert [len(config.workers_in(f.id)) for f in config.fleets] == [4, 4, 2]
    assert [w.process_id for w in config.workers][-3:] == ["fleet-2", "fleet-3", "fleet-3"]
    assert [(w.cpu_millis, w.memory_mb) for w in config.workers[:3]] == [
        (1000, 2048),
        (3000, 4096),
        (1000, 2048),
    ]
    assert len({w.port for w in config.workers} | {p.port for p in config.control_planes}) == 12
    fleet = config.fleets[0]
    assert fleet.args[:5] == (
        "fleet",
        "--id",
        "fleet-1",
        "--spec",
        str(state.fleet_spec_path("fleet-1")),
    )
    assert fleet.args[-1] == "--json-logs"
    assert ClusterConfig.from_json(json.loads(json.dumps(config.to_json()))) == config

    # A later up with more workers leaves the recorded fleets alone and adds fleet-4.
    grown = plan_for(config, 13)
    assert [f.id for f in grown.fleets] == ["fleet-1", "fleet-2", "fleet-3", "fleet-4"]
    assert grown.fleets[:3] == config.fleets
    assert [w.id for w in grown.workers_in("fleet-4")] == ["w-11", "w-12", "w-13"]

    with pytest.raises(ClusterError, match=r"w-6 runs in fleet-2 .*kill the fleet"):
        config.process("w-6")
    assert config.address_of("w-6") == config.worker("w-6").address
