"""``stockade up --agent-args/--cp-args``: the extra options every new process gets are read by
that process's own command line (``stockade agent``, ``stockade fleet``, ``stockade cp``) before
anything starts; options it would refuse are refused in one line naming the option, what is
wrong and the text given, exit 2, and nothing is started or recorded (cluster.json keeps the
options it records, so a bad one would break every later ``up``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops import cluster as cluster_module
from ops.cli import EXIT_INTERRUPTED, EXIT_INVALID, app


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], list[str]]]:
    """The (cp_args, agent_args) of every LocalCluster.up called; the call itself stops there
    (as an interrupted ``up``), so no process is started."""
    seen: list[tuple[list[str], list[str]]] = []

    def up(self: cluster_module.LocalCluster, **_: object) -> object:
        seen.append((list(self.cp_args), list(self.agent_args)))
        raise KeyboardInterrupt

    monkeypatch.setenv("STOCKADE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("STOCKADE_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setattr(cluster_module.LocalCluster, "up", up)
    return seen


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--agent-args", "--foo 1"],
            "--agent-args: no such option --foo for stockade agent, got '--foo 1'",
        ),
        (
            ["--cp-args", "--dead-after-s 5 --bogus"],
            "--cp-args: no such option --bogus for stockade cp, got '--dead-after-s 5 --bogus'",
        ),
        (
            ["--agent-args", "--heartbeat-interval-s soon"],
            "--agent-args: --heartbeat-interval-s must be a number for stockade agent ('soon'), "
            "got '--heartbeat-interval-s soon'",
        ),
        (
            ["--cp-args", "--lease-ttl-s 1e400"],
            "--cp-args: --lease-ttl-s must be a finite number for stockade cp ('1e400'), "
            "got '--lease-ttl-s 1e400'",
        ),
        (
            ["--agent-args", "--json-logs --heartbeat-interval-s"],
            "--agent-args: --heartbeat-interval-s must be given a value for stockade agent, "
            "got '--json-logs --heartbeat-interval-s'",
        ),
        (
            ["--agent-args", "stray"],
            "--agent-args: stockade agent takes options only, not 'stray', got 'stray'",
        ),
        (
            ["--fleet-size", "2", "--agent-args", "--cpu-millis 100"],
            "--agent-args: no such option --cpu-millis for stockade fleet, got '--cpu-millis 100'",
        ),
        (
            ["--agent-args", "--help"],
            "--agent-args: --help prints help and runs no stockade agent, got '--help'",
        ),
        (
            ["--agent-args", "--label b@d=1"],
            "--agent-args: --label key must be a name of 1-63 characters of A-Z a-z 0-9 - _ . starting "
            "and ending with a letter or digit, optionally after a lower-case DNS subdomain and a slash "
            "for stockade agent ('b@d'), got '--label b@d=1'",
        ),
        (
            ["--agent-args", "--label noequals"],
            "--agent-args: --label must be key=value for stockade agent ('noequals'), got '--label noequals'",
        ),
        (
            ["--agent-args", "--label 'a=b"],
            '--agent-args must be options as a shell reads them (no closing quotation), got "--label \'a=b"',
        ),
    ],
)
def test_extra_options_a_process_would_refuse_are_refused_before_anything_starts(
    started: list[tuple[list[str], list[str]]], tmp_path: Path, args: list[str], line: str
) -> None:
    """One line naming the option, what the process's command refuses and the text; exit 2;
    no cluster.json, no user config, no process."""
    result = CliRunner().invoke(app, ["up", "--insecure", *args])
    assert (result.exit_code, result.stderr) == (EXIT_INVALID, f"error: {line}\n")
    assert result.stdout == ""
    assert started == []
    assert not (tmp_path / "state" / "cluster.json").exists()
    assert not (tmp_path / "config.toml").exists()


def test_the_message_names_the_command_not_the_module(started: list[tuple[list[str], list[str]]]) -> None:
    """The process's command is named as an operator types it, never ``python -m ops.cli``."""
    result = CliRunner().invoke(app, ["up", "--insecure", "--agent-args", "--foo 1"])
    assert "stockade agent" in result.stderr and "ops.cli" not in result.stderr


@pytest.mark.parametrize(
    ("args", "cp_args", "agent_args"),
    [
        (
            [
                "--cp-args",
                "--dead-after-s 5 --policy first_fit",
                "--agent-args",
                "--heartbeat-interval-s 1 --json-logs",
            ],
            ["--dead-after-s", "5", "--policy", "first_fit"],
            ["--heartbeat-interval-s", "1", "--json-logs"],
        ),
        (["--agent-args", "--host 127.0.0.2"], [], ["--host", "127.0.0.2"]),
        (
            ["--fleet-size", "2", "--agent-args", "--self-fence-after-s 3.5"],
            [],
            ["--self-fence-after-s", "3.5"],
        ),
    ],
)
def test_good_extra_options_reach_the_launcher(
    started: list[tuple[list[str], list[str]]], args: list[str], cp_args: list[str], agent_args: list[str]
) -> None:
    """Options the process takes go on to the launcher as given."""
    result = CliRunner().invoke(app, ["up", "--insecure", *args])
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert started == [(cp_args, agent_args)]
