"""Client commands find the cluster from any folder (:mod:`ops.config`): --control-planes, then
$STOCKADE_CONTROL_PLANES, then the state folder's cluster.json, then the user config, where
``stockade up`` records the cluster it started and ``stockade down`` removes it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ops import cluster as cluster_module
from ops import config
from ops.cli import app
from ops.cluster import ClusterConfig, DownReport, ProcessSpec, StateDir, WorkerSpec
from ops.config import ClusterError, forget_local_cluster, record_local_cluster, resolve_addresses
from protocol import pb
from runtime.client import ControlPlaneClient
from runtime.errors import InvalidArgument


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean environment: HOME and the working folder under tmp_path, no Stockade variable."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("STOCKADE_CONFIG", "XDG_CONFIG_HOME", "STOCKADE_CONTROL_PLANES", "STOCKADE_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return home


def recorded_cluster(root: Path, *ports: int) -> StateDir:
    """A state folder whose cluster.json records control planes on ``ports``."""
    state = StateDir(root)
    state.save(
        ClusterConfig(
            database_url="postgresql://nowhere/db",
            embedded_pg_port=None,
            processes=[
                ProcessSpec(id=f"cp-{n}", kind="cp", address=f"127.0.0.1:{port}", args=("cp",))
                for n, port in enumerate(ports, start=1)
            ],
        )
    )
    return state


def test_the_user_config_is_under_the_users_config_folder(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~/.config/stockade/config.toml; $XDG_CONFIG_HOME when absolute (a relative one is
    ignored, as the XDG specification says); $STOCKADE_CONFIG over both."""
    assert config.user_config_path() == home / ".config" / "stockade" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/dir")
    assert config.user_config_path() == home / ".config" / "stockade" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    assert config.user_config_path() == home / "xdg" / "stockade" / "config.toml"
    monkeypatch.setenv("STOCKADE_CONFIG", str(home / "mine.toml"))
    assert config.user_config_path() == home / "mine.toml"


def test_each_source_wins_over_the_ones_after_it(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Option, then environment, then ./.stockade/cluster.json, then the config's
    control_planes, then the cluster recorded in its [local] table."""
    path = config.user_config_path()
    path.parent.mkdir(parents=True)
    recorded = recorded_cluster(tmp_path / "up-here", 7401)
    path.write_text(
        f'control_planes = ["10.0.0.1:7100", "10.0.0.2:7100"]\n\n[local]\nstate_dir = "{recorded.root}"\n'
    )
    recorded_cluster(Path(".stockade"), 7301)
    monkeypatch.setenv("STOCKADE_CONTROL_PLANES", "127.0.0.1:7201")

    assert resolve_addresses("127.0.0.1:7101") == ["127.0.0.1:7101"]
    assert resolve_addresses(None) == ["127.0.0.1:7201"]
    monkeypatch.delenv("STOCKADE_CONTROL_PLANES")
    assert resolve_addresses(None) == ["127.0.0.1:7301"]
    (Path(".stockade") / "cluster.json").unlink()
    assert resolve_addresses(None) == ["10.0.0.1:7100", "10.0.0.2:7100"]
    path.write_text(f'[local]\nstate_dir = "{recorded.root}"\n')
    assert resolve_addresses(None) == ["127.0.0.1:7401"]


def test_an_option_or_variable_naming_no_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--control-planes ''`` or ``',,'`` is a mistake, not a request for the next source; an
    empty variable is an unset one, but one of only commas is refused too."""
    monkeypatch.setenv("STOCKADE_CONTROL_PLANES", "127.0.0.1:7201")
    for given in ("", ",,,", " , "):
        with pytest.raises(InvalidArgument) as refused:
            resolve_addresses(given)
        assert str(refused.value).startswith("--control-planes must name at least one host:port")
    monkeypatch.setenv("STOCKADE_CONTROL_PLANES", "")
    assert resolve_addresses("127.0.0.1:7101") == ["127.0.0.1:7101"]
    monkeypatch.setenv("STOCKADE_CONTROL_PLANES", ",")
    with pytest.raises(InvalidArgument, match="STOCKADE_CONTROL_PLANES must name at least one"):
        resolve_addresses(None)


def test_a_named_state_folder_is_not_looked_past(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$STOCKADE_STATE_DIR names one cluster: when it records none, that is the answer, not
    the user config's cluster."""
    path = config.user_config_path()
    path.parent.mkdir(parents=True)
    path.write_text('control_planes = "10.0.0.1:7100"\n')
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "empty"))
    with pytest.raises(ClusterError, match="no control-plane addresses"):
        resolve_addresses(None)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("control_planes = [", ClusterError, "is not valid TOML"),
        ("control_planes = 7100", ClusterError, 'must be a list of "host:port" strings, got 7100'),
        ('control_planes = ["nowhere"]', InvalidArgument, r"control_planes\[0\]"),
        (
            '[local]\nstate_dir = "/no/such/folder"\n',
            ClusterError,
            "which records none: run `stockade up` there",
        ),
    ],
)
def test_a_config_that_cannot_be_used_is_said_so(
    home: Path, text: str, error: type[Exception], message: str
) -> None:
    """A broken or stale config file is named with what is wrong and what to do."""
    path = config.user_config_path()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(error, match=message):
        resolve_addresses(None)


def test_recording_keeps_the_rest_of_the_file_and_forgetting_only_its_own_cluster(
    home: Path, tmp_path: Path
) -> None:
    """up writes a [local] table and keeps the person's lines and comments; up of another
    cluster replaces it; down of a cluster the table does not name leaves it; down of its own
    removes it, and the rest stays."""
    path = config.user_config_path()
    path.parent.mkdir(parents=True)
    mine = '# my clusters\ncontrol_planes = ["10.0.0.1:7100"]  # production\n\n[other]\nkey = 1\n'
    path.write_text(mine)
    first, second = tmp_path / "first", tmp_path / "second"

    assert record_local_cluster(first) == path
    assert tomllib.loads(path.read_text())["local"] == {"state_dir": str(first)}
    assert path.read_text().startswith(mine.rstrip("\n"))
    record_local_cluster(second)
    assert path.read_text().count("[local]") == 1
    assert config.recorded_state_dir(tomllib.loads(path.read_text())) == second

    assert forget_local_cluster(first) is None
    assert forget_local_cluster(second) == path
    assert path.read_text() == mine
    assert forget_local_cluster(second) is None


def test_forgetting_the_only_table_removes_the_file_up_made(home: Path, tmp_path: Path) -> None:
    """up into no config file makes one holding only [local]; down removes the file, leaving
    no empty config behind."""
    path = config.user_config_path()
    assert record_local_cluster(tmp_path / "cluster") == path
    assert forget_local_cluster(tmp_path / "cluster") == path
    assert not path.exists()


def test_recording_into_a_file_it_cannot_follow_leaves_it_alone(home: Path, tmp_path: Path) -> None:
    """A config that already sets local.state_dir as a dotted key: the file is not changed,
    and the error says to edit it by hand."""
    path = config.user_config_path()
    path.parent.mkdir(parents=True)
    path.write_text('local.state_dir = "/somewhere"\n')
    with pytest.raises(ClusterError, match="edit its \\[local\\] table by hand"):
        record_local_cluster(tmp_path / "new")
    assert path.read_text() == 'local.state_dir = "/somewhere"\n'


def test_a_client_command_from_another_folder_calls_the_recorded_cluster(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `up` recorded a cluster, `stockade status` run elsewhere calls its control planes."""
    state = recorded_cluster(tmp_path / "project" / ".stockade", 7501, 7502)
    record_local_cluster(state.root)
    called: list[list[str]] = []

    async def status(
        self: ControlPlaneClient, index: int, rpc: str, request: Any, **_: Any
    ) -> pb.StatusReply:
        called.append(list(self.addresses))
        return pb.StatusReply(leader="cp-1", epoch=3, answered_by="cp-1")

    monkeypatch.setattr(ControlPlaneClient, "_attempt", status)
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    assert called == [["127.0.0.1:7501", "127.0.0.1:7502"]]


def test_down_removes_the_record_of_its_cluster(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade down` in the recorded cluster's folder stops it and removes the [local] table."""
    project = tmp_path / "project"
    state = recorded_cluster(project / ".stockade", 7601)
    record_local_cluster(state.root)
    monkeypatch.chdir(project)
    report = DownReport(terminated=("cp-1",), killed=(), stragglers=(), database_stopped=False)
    monkeypatch.setattr(cluster_module.LocalCluster, "down", lambda self, **_: report)
    result = CliRunner().invoke(app, ["down"], env={"COLUMNS": "400"})  # the path on one line
    assert result.exit_code == 0, result.output
    assert "stopped cp-1" in result.output and f"removed it from {config.user_config_path()}" in result.output
    assert not config.user_config_path().exists()  # [local] was all it held


def test_status_shows_where_the_local_clusters_processes_serve_metrics(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status --json` of the recorded local cluster maps each process, and each worker hosted in
    a fleet, to its metrics address; for addresses given by hand (another cluster) it maps none."""
    state = StateDir(tmp_path / "project" / ".stockade")
    state.save(
        ClusterConfig(
            database_url="postgresql://nowhere/db",
            embedded_pg_port=None,
            processes=[
                ProcessSpec(
                    id="cp-1",
                    kind="cp",
                    address="127.0.0.1:7501",
                    args=("cp", "--id", "cp-1", "--metrics-port", "9101"),
                    metrics_address="127.0.0.1:9101",
                ),
                ProcessSpec(
                    id="fleet-1",
                    kind="fleet",
                    address="",
                    args=("fleet", "--id", "fleet-1", "--metrics-port", "9102"),
                    metrics_address="127.0.0.1:9102",
                ),
            ],
            hosted_workers=[
                WorkerSpec(
                    id="w-1", address="127.0.0.1:7601", cpu_millis=1000, memory_mb=1024, process_id="fleet-1"
                )
            ],
        )
    )
    record_local_cluster(state.root)

    async def status(*args: Any, **kwargs: Any) -> pb.StatusReply:
        return pb.StatusReply(leader="cp-1", epoch=1)

    monkeypatch.setattr(ControlPlaneClient, "_attempt", status)

    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["metrics"] == {
        "cp-1": "127.0.0.1:9101",
        "fleet-1": "127.0.0.1:9102",
        "w-1": "127.0.0.1:9102",
    }

    result = CliRunner().invoke(app, ["status", "--json", "--control-planes", "127.0.0.1:7999"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["metrics"] == {}


def test_files_that_are_not_utf8_are_said_so_in_one_line(home: Path, tmp_path: Path) -> None:
    """A user config or a cluster.json holding bytes that are not UTF-8 is refused as not valid,
    naming the file, instead of ending in a traceback."""
    path = config.user_config_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe garbage\n")
    with pytest.raises(ClusterError, match="is not valid TOML"):
        resolve_addresses(None)

    path.unlink()
    state = tmp_path / "elsewhere" / ".stockade"
    state.mkdir(parents=True)
    (state / "cluster.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ClusterError, match="is not a Stockade cluster file"):
        resolve_addresses(None)
    with pytest.raises(ClusterError, match="is not a Stockade cluster file"):
        StateDir(state).load()


def test_commands_on_the_local_clusters_files_find_it_from_another_folder(home: Path, tmp_path: Path) -> None:
    """kill-leader, kill-worker and check act on the cluster `up` recorded in the user config when
    the current folder records none, and on the current folder's when it does."""
    from ops.cli.common import recorded_local_state

    state = recorded_cluster(tmp_path / "project" / ".stockade", 7501)
    record_local_cluster(state.root)
    assert recorded_local_state().root == state.root
    here = recorded_cluster(Path(".stockade").absolute(), 7601)
    assert recorded_local_state().root == here.root


def test_a_client_reads_the_local_clusters_metrics_as_the_launcher_records_them(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status``'s metrics column, read from cluster.json without the launcher's classes,
    names what :class:`ClusterConfig` names: each process's, and a fleet's for its workers;
    another cluster's addresses find nothing, and an HA cluster's ``hadb/`` is named."""
    from ops.cli.common import local_ha_db_dir, local_metrics

    root = home / "state"
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(root))
    processes = [
        ProcessSpec(
            id="cp-1", kind="cp", address="127.0.0.1:7001", args=("cp",), metrics_address="127.0.0.1:9001"
        ),
        ProcessSpec(id="cp-2", kind="cp", address="127.0.0.1:7002", args=("cp",)),
        ProcessSpec(
            id="w-1",
            kind="agent",
            address="127.0.0.1:7101",
            args=("agent",),
            metrics_address="127.0.0.1:9101",
        ),
        ProcessSpec(
            id="fleet-1", kind="fleet", address="", args=("fleet",), metrics_address="127.0.0.1:9201"
        ),
    ]
    hosted = [
        WorkerSpec(
            id=f"w-{n}", address=f"127.0.0.1:71{n:02}", cpu_millis=1000, memory_mb=512, process_id="fleet-1"
        )
        for n in (2, 3)
    ]
    recorded = ClusterConfig(
        database_url="postgresql://nowhere/db",
        embedded_pg_port=None,
        processes=processes,
        hosted_workers=hosted,
        ha_db=True,
    )
    StateDir(root).save(recorded)
    expected = recorded.metrics_addresses()
    for worker in recorded.workers:
        expected.setdefault(worker.id, expected.get(worker.process_id, ""))
    expected = {k: v for k, v in expected.items() if v}
    assert local_metrics(["127.0.0.1:7002", "127.0.0.1:7001"]) == expected
    assert expected["w-3"] == "127.0.0.1:9201"
    assert local_ha_db_dir(["127.0.0.1:7001", "127.0.0.1:7002"]) == StateDir(root).hadb_dir
    assert local_metrics(["127.0.0.1:7001"]) == {}
    assert local_ha_db_dir(["127.0.0.1:7001"]) is None


def test_the_replica_that_answered_is_asked_first_next_time(home: Path) -> None:
    """A command answered by another replica than the first it asked records it, beside the
    user config, for that set of control planes only; the next command asks it first. A record
    that cannot be read is no record, and an answer from the first replica writes nothing."""
    first, second, third = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"
    record = config.user_config_path().with_name(config.ANSWERED_FILE)
    config.record_answered([first, second, third], first)
    assert not record.exists()
    config.record_answered([first, second, third], third)
    assert config.answered_first([first, second, third]) == [third, first, second]
    assert config.answered_first([second, third, first]) == [third, second, first]
    assert config.answered_first([first, second]) == [first, second]  # another set
    config.record_answered([third, first, second], second)
    assert config.answered_first([first, second, third]) == [second, first, third]
    record.write_text("{not json")
    assert config.answered_first([first, second, third]) == [first, second, third]
    config.record_answered([first, second, third], third)
    assert config.answered_first([first, second, third]) == [third, first, second]


def test_a_cluster_file_nested_past_the_recursion_limit_is_no_record(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster.json of 100,000 nested lists (Python's json gives up with RecursionError) is
    said to be no cluster file, and is no local cluster for metrics or certificates."""
    from ops.cli.common import local_metrics

    root = home / "state"
    root.mkdir()
    (root / "cluster.json").write_text("[" * 100_000)
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(root))
    with pytest.raises(ClusterError, match="not a Stockade cluster file"):
        resolve_addresses(None)
    assert config.cluster_json_cert_dir(root) == (False, None)
    assert local_metrics(["127.0.0.1:7001"]) == {}
