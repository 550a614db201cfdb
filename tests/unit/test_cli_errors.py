"""No expected condition shows a traceback: a cluster that is down, a database that does not
answer and Ctrl-C each end with one line that says what happened and what to do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ops import cluster as cluster_module
from ops.cli import EXIT_INTERRUPTED, EXIT_UNAVAILABLE, app
from ops.cluster import ClusterConfig, ProcessSpec, StateDir
from ops.config import INSECURE_ENV
from runtime.client import ControlPlaneClient
from runtime.errors import ConnectionRefused, Unavailable

ROOT = Path(__file__).parents[2]
NOWHERE = "127.0.0.1:1,127.0.0.1:2"
"""Two addresses where nothing listens: connecting is refused at once."""


@pytest.fixture(autouse=True)
def _plaintext_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """These commands call addresses where nothing, or a plaintext fake, listens."""
    monkeypatch.setenv(INSECURE_ENV, "1")


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize("command", [["status"], ["list"], ["job", "3"], ["jobs", "2"], ["cancel", "3"]])
def test_a_cluster_that_is_down_is_one_line_naming_the_addresses(command: list[str]) -> None:
    """Every control plane refused the connection: one line naming each address once, saying
    nothing was sent and how to start the cluster; no exception text; exit 1."""
    result = CliRunner().invoke(app, [*command, "--control-planes", NOWHERE])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert lines(result.output) == [
        "error: no control plane answered at 127.0.0.1:1, 127.0.0.1:2: connection refused, nothing "
        "listens there (nothing was sent); start the local cluster with `stockade up`, or name "
        "running control planes with --control-planes or $STOCKADE_CONTROL_PLANES"
    ]


def test_replicas_failing_in_different_ways_are_each_named_on_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One replica refused, one did not answer in time: one line says how each failed."""

    async def unreachable(
        self: ControlPlaneClient, index: int, rpc: str, request: object, **_: object
    ) -> object:
        if index == 0:
            raise ConnectionRefused("127.0.0.1:1 refused the connection")
        raise Unavailable("127.0.0.1:2 did not answer within 2 s")

    monkeypatch.setattr(ControlPlaneClient, "_attempt", unreachable)
    result = CliRunner().invoke(app, ["list", "--control-planes", NOWHERE])
    assert result.exit_code == EXIT_UNAVAILABLE
    assert lines(result.output) == [
        "error: no control plane answered at 127.0.0.1:1, 127.0.0.1:2: 127.0.0.1:1 refused the "
        "connection; 127.0.0.1:2 did not answer within 2 s"
    ]


def test_a_database_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    """``stockade check`` against a database where nothing listens: one line saying the
    database does not answer and what to do, exit 1 (it printed a 130-line traceback)."""
    result = CliRunner().invoke(
        app,
        [
            "check",
            "--state-dir",
            str(tmp_path),
            "--database-url",
            "postgresql://postgres@127.0.0.1:1/postgres",
        ],
    )
    assert result.exit_code == EXIT_UNAVAILABLE
    (line,) = lines(result.output)
    assert line.startswith("error: the database does not answer (connection refused: ")
    assert "start it with `stockade up`" in line and "--database-url" in line


def test_no_address_anywhere_is_one_line_naming_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No option, environment, cluster.json or user config names a control plane: one line
    naming each place to give one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STOCKADE_CONTROL_PLANES", raising=False)
    monkeypatch.delenv("STOCKADE_STATE_DIR", raising=False)
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == EXIT_UNAVAILABLE
    (line,) = lines(result.output)
    assert line.startswith("error: no control-plane addresses: pass --control-planes host:port,...")
    assert "STOCKADE_CONTROL_PLANES" in line and "`stockade up`" in line and "config.toml" in line


# ---------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_during_up_says_what_still_runs_and_how_to_stop_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted while waiting for the cluster: one line naming the processes that run, that
    they run on, and ``stockade down``; exit 130."""
    state = StateDir(tmp_path / "state")
    state.save(
        ClusterConfig(
            database_url="postgresql://nowhere/db",
            embedded_pg_port=None,
            processes=[
                ProcessSpec(id="cp-1", kind="cp", address="127.0.0.1:7001", args=("cp",)),
                ProcessSpec(id="w-1", kind="agent", address="127.0.0.1:7101", args=("agent",)),
            ],
        )
    )

    def interrupted_up(self: cluster_module.LocalCluster, **_: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state.root))
    monkeypatch.setattr(cluster_module.LocalCluster, "up", interrupted_up)
    monkeypatch.setattr(
        cluster_module.LocalCluster, "pids", lambda self, config=None: {"cp-1": 41, "w-1": 42}
    )
    result = CliRunner().invoke(app, ["up"])
    assert result.exit_code == EXIT_INTERRUPTED
    (line,) = lines(result.output)
    assert line.startswith(f"interrupted: cp-1 w-1 of {state.root} still run in the background")
    assert f"`STOCKADE_STATE_DIR={state.root} stockade down` stops them" in line


_UP_THAT_WAITS = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from ops import cluster

    def waiting_up(self, **options):
        Path(os.environ["READY_FILE"]).touch()
        while True:
            time.sleep(0.05)

    cluster.LocalCluster.up = waiting_up
    sys.argv = ["stockade", "up"]
    from ops.cli import main
    main()
    """
)

_CHAOS_THAT_WAITS = textwrap.dedent(
    """
    import os
    from pathlib import Path
    import trio, typer
    from ops.cli.common import interruptible

    app = typer.Typer()

    @app.command()
    def chaos() -> None:
        async def run() -> None:
            Path(os.environ["READY_FILE"]).touch()
            await trio.sleep_forever()

        with interruptible():
            trio.run(run)

    app()
    """
)


def interrupt(
    script: str, tmp_path: Path, signum: signal.Signals, *, sigint_ignored: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (which touches the file named by $READY_FILE once it waits), send it
    ``signum``, and return how it ended; ``sigint_ignored`` starts it with SIGINT ignored, as
    a shell starts a background job."""
    ready = tmp_path / "ready"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STOCKADE_STATE_DIR": str(tmp_path / "state"),
        "READY_FILE": str(ready),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the command never started waiting"
            time.sleep(0.02)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:  # the test failed before it ended: leave nothing behind
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_sigint_during_up_ends_with_one_line_and_exit_130(tmp_path: Path) -> None:
    """A real SIGINT (Ctrl-C) while ``up`` waits: no traceback, one line, exit 130."""
    done = interrupt(_UP_THAT_WAITS, tmp_path, signal.SIGINT)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert lines(done.stderr) == ["interrupted: nothing of state runs"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_command_that_runs_processes_ends_with_one_line(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM inside trio (chaos, the benchmarks): ``interruptible`` turns either
    into one line and exit 130, after the command's own clean-up ran."""
    done = interrupt(_CHAOS_THAT_WAITS, tmp_path, signum)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert lines(done.stderr) == ["interrupted: what this command started has been stopped"]


def test_sigterm_stops_a_command_started_in_the_background(tmp_path: Path) -> None:
    """Started with SIGINT ignored (``stockade chaos &`` in a script), SIGTERM still ends the
    command with its clean-up, one line and exit 130."""
    done = interrupt(_CHAOS_THAT_WAITS, tmp_path, signal.SIGTERM, sigint_ignored=True)
    assert done.returncode == EXIT_INTERRUPTED, done.stderr
    assert lines(done.stderr) == ["interrupted: what this command started has been stopped"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--cpu-millis", "2000000", "error: cpu_millis must be between 1 and 1000000, got 2000000"),
        ("--memory-mb", "0", "error: memory_mb must be between 1 and 16777216, got 0"),
    ],
)
def test_an_agent_offering_capacity_no_registration_may_is_refused_at_start(
    tmp_path: Path, option: str, value: str, message: str
) -> None:
    """Capacity beyond what a control plane accepts ends the agent at start with one line
    (exit 2), instead of a registration retried for ever."""
    args = {"--cpu-millis": "1000", "--memory-mb": "512", option: value}
    result = CliRunner().invoke(
        app,
        [
            "agent", "--id", "w-1", "--control-planes", "127.0.0.1:1", "--work-dir", str(tmp_path),
            "--insecure", *(item for pair in args.items() for item in pair),
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert lines(result.output) == [message]


def test_up_with_json_logs_names_the_running_processes_it_does_not_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stockade up --json-logs` on a cluster whose recorded processes run without it (also one
    it starts again from cluster.json): the table as usual, and a note naming them and how to
    start them with it; exit 0."""
    from ops.cluster import UpResult
    from protocol import pb

    state = StateDir(tmp_path / "state")
    config = ClusterConfig(
        database_url="postgresql://nowhere/db",
        embedded_pg_port=None,
        processes=[
            ProcessSpec(id="cp-1", kind="cp", address="127.0.0.1:7001", args=("cp",)),
            ProcessSpec(id="w-1", kind="agent", address="127.0.0.1:7101", args=("agent", "--json-logs")),
        ],
    )
    state.save(config)

    def kept_up(self: cluster_module.LocalCluster, **_: object) -> UpResult:
        return UpResult(
            config=config,
            started=(),
            database_started=False,
            status=pb.StatusReply(leader="cp-1", epoch=1),
            pids={"cp-1": 41, "w-1": 42},
        )

    monkeypatch.setenv("STOCKADE_STATE_DIR", str(state.root))
    monkeypatch.setattr(cluster_module.LocalCluster, "up", kept_up)
    result = CliRunner().invoke(app, ["up", "--json-logs"])
    assert result.exit_code == 0, result.output
    assert (
        "note: --json-logs reaches only processes new to this cluster; these keep the options "
        f"recorded for them and log console lines: cp-1 (`STOCKADE_STATE_DIR={state.root} stockade "
        "down` then `stockade up --json-logs` starts them all with it)"
    ) in " ".join(result.stderr.split())


@pytest.mark.parametrize("given", ["", ",,,"])
def test_an_agent_given_no_control_plane_address_says_what_was_typed(tmp_path: Path, given: str) -> None:
    """`stockade agent --control-planes ''` (or only commas): one line quoting it, exit 2."""
    result = CliRunner().invoke(
        app,
        [
            "agent", "--id", "w-1", "--cpu-millis", "1000", "--memory-mb", "512", "--control-planes", given,
            "--work-dir", str(tmp_path), "--insecure",
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert lines(result.output) == [
        f"error: --control-planes must name at least one host:port, e.g. 127.0.0.1:7100, got {given!r}"
    ]


def test_names_and_commands_with_brackets_or_colons_print_as_they_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A job named ``a[/]``, ``[bold]x`` or ``:fire:`` shows as written in the CLI's tables:
    rich would read ``[/]`` as a markup tag with nothing to close and fail the command."""
    from rich.table import Table

    from ops.cli.common import _console

    names = ("a[/]", "[bold]x", ":fire:", "[fe80::1]:7000")
    table = Table()
    table.add_column("name")
    for name in names:
        table.add_row(name)
    _console().print(table)
    _console().print("sh -c '[ -f x ] && ls [/]'")
    out = capsys.readouterr().out
    assert all(name in out for name in names)
    assert "sh -c '[ -f x ] && ls [/]'" in out
