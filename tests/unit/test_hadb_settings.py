"""The HA PostgreSQL pair (ops/launcher/hadb.py, ops/launcher/hadb_config.py) without starting it:
its settings, URL, refusals, and what Patroni and etcd are started with."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ops.cli import EXIT_INVALID, app
from ops.launcher import hadb, hadb_members
from ops.launcher.hadb import HaPostgres
from ops.launcher.hadb_config import EtcdMember, HaPasswords, HaSettings, PgMember, etcd_argv, patroni_config
from ops.launcher.hadb_members import HaDatabaseError, HaUnavailable


def test_the_default_timings_keep_patronis_rule() -> None:
    """ttl 20 s, loop 2 s, retry 5 s: loop_wait + 2 * retry_timeout <= ttl, ttl at its minimum."""
    settings = HaSettings()
    assert (settings.ttl_s, settings.loop_wait_s, settings.retry_timeout_s) == (20, 2, 5)
    assert settings.loop_wait_s + 2 * settings.retry_timeout_s <= settings.ttl_s
    assert not settings.synchronous_mode_strict


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl_s": 10}, "ttl_s must be >= 20 (Patroni's minimum), got 10"),
        ({"loop_wait_s": 0}, "loop_wait_s must be >= 1, got 0"),
        ({"retry_timeout_s": 2}, "retry_timeout_s must be >= 3, got 2"),
        ({"loop_wait_s": 11, "retry_timeout_s": 5}, "must be <= ttl_s (20), got 11 + 2 * 5"),
    ],
)
def test_timings_that_break_patronis_rule_are_refused_naming_the_rule(
    kwargs: dict[str, int], message: str
) -> None:
    """Each value Patroni would silently lower is refused with the field, the rule and the value."""
    with pytest.raises(ValueError, match=re.escape(message)):
        HaSettings(**kwargs)


def test_the_url_names_both_members_and_asks_for_a_read_write_session(tmp_path: Path) -> None:
    """The URL lists both PostgreSQL ports, asks for read-write and names the password file."""
    layout = {
        "etcd": [{"name": f"etcd-{i}", "client_port": 2000 + i, "peer_port": 3000 + i} for i in (1, 2, 3)],
        "pg": [
            {"name": "pg-1", "pg_port": 5433, "rest_port": 8009},
            {"name": "pg-2", "pg_port": 5434, "rest_port": 8010},
        ],
        "settings": {"ttl_s": 20, "loop_wait_s": 2, "retry_timeout_s": 5, "synchronous_mode_strict": True},
    }
    (tmp_path / "hadb.json").write_text(json.dumps(layout))
    url = HaPostgres.attach(tmp_path).url()
    assert url == (
        "postgresql://postgres@127.0.0.1:5433,127.0.0.1:5434/postgres"
        f"?target_session_attrs=read-write&passfile={tmp_path / 'pgpass'}"
    )


def test_attaching_where_nothing_was_started_is_refused(tmp_path: Path) -> None:
    """attach() on a folder without hadb.json says so, naming the file."""
    with pytest.raises(HaDatabaseError, match=r"hadb\.json does not exist"):
        HaPostgres.attach(tmp_path)


def test_start_without_etcd_or_patroni_says_what_is_missing_and_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start() raises HaUnavailable naming what is missing and the install commands."""
    monkeypatch.setattr(hadb, "missing_tools", lambda: ["etcd (the etcd-server package)"])
    with pytest.raises(HaUnavailable) as raised:
        HaPostgres(tmp_path).start()
    assert "etcd (the etcd-server package)" in str(raised.value)
    assert "apt-get install -y etcd-server" in str(raised.value)
    assert not (tmp_path / "hadb.json").exists()


def test_up_ha_db_without_patroni_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade up --ha-db` where Patroni is missing prints one line and exits 2, starting nothing."""
    monkeypatch.setattr(hadb_members, "missing_tools", lambda: ["patroni"])
    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    result = CliRunner().invoke(app, ["up", "--ha-db"])
    assert result.exit_code == EXIT_INVALID
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: --ha-db needs patroni: install etcd with")
    assert not (tmp_path / "state").exists()


def _config(settings: HaSettings) -> dict[str, Any]:
    etcd = [EtcdMember(name=f"etcd-{i}", client_port=2000 + i, peer_port=3000 + i) for i in (1, 2, 3)]
    return patroni_config(
        PgMember(name="pg-1", pg_port=5433, rest_port=8009),
        etcd=etcd,
        settings=settings,
        passwords=HaPasswords(superuser="su", replication="repl", rest_api="rest"),
        data_dir=Path("/d"),
        bin_dir=Path("/b"),
        pgpass=Path("/p"),
        socket_dir=Path("/s"),
    )


def test_patroni_runs_synchronous_strict_replication_with_the_settings_timings() -> None:
    """bootstrap.dcs carries the timings, synchronous_mode, strict mode, and pg_rewind with what it
    needs (wal_log_hints, data checksums)."""
    config = _config(HaSettings(ttl_s=30, loop_wait_s=3, retry_timeout_s=6, synchronous_mode_strict=True))
    dcs = config["bootstrap"]["dcs"]
    assert (dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"]) == (30, 3, 6)
    assert dcs["synchronous_mode"] is True
    assert dcs["synchronous_mode_strict"] is True
    assert dcs["postgresql"]["use_pg_rewind"] is True
    assert dcs["postgresql"]["parameters"]["wal_log_hints"] == "on"
    assert "data-checksums" in config["bootstrap"]["initdb"]
    assert (
        _config(HaSettings(synchronous_mode_strict=False))["bootstrap"]["dcs"]["synchronous_mode_strict"]
        is False
    )


def test_every_tcp_connection_needs_a_scram_password() -> None:
    """pg_hba asks SCRAM-SHA-256 of every TCP line; only the unix socket is trusted."""
    hba = _config(HaSettings())["postgresql"]["pg_hba"]
    assert [line for line in hba if "trust" in line] == ["local all all trust"]
    assert all(line.endswith("scram-sha-256") for line in hba if line.startswith("host"))


def test_etcd_listens_on_loopback_only_and_its_command_line_holds_no_password() -> None:
    """Every URL on etcd's command line is 127.0.0.1's; the passwords never appear there."""
    members = [EtcdMember(name=f"etcd-{i}", client_port=2000 + i, peer_port=3000 + i) for i in (1, 2, 3)]
    argv = etcd_argv("etcd", members[0], members=members, data_dir=Path("/e"), cluster_token="t")
    urls = [a for a in argv if "://" in a]
    assert urls and all(
        u.startswith("http://127.0.0.1:") for url in urls for u in url.split(",") if "=" not in u
    )
    assert "--initial-cluster" in argv
    assert repr(HaPasswords.new()) == "HaPasswords(***)"
