"""What ``stockade up`` reads and waits for, whatever it finds and whenever it is interrupted: pid
and port files of any content (missing, empty, half-written, nonsense) mean "not running";
every wait is bounded and ends at once on Ctrl-C or SIGTERM; an interrupted command ends with
one line, never a traceback."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import typer

from ops import pidfile, rpc
from ops.cli import EXIT_INTERRUPTED
from ops.cli.common import interruptible
from ops.launcher import procs
from ops.launcher.pg import EmbeddedPostgres
from ops.launcher.state import ClusterError, StateDir
from runtime.client import ControlPlaneClient

ROOT = Path(__file__).parents[2]

NONSENSE = ["", "\n", "12", "-1234\n", "0\n", "abc\n", "4194305\n", "99999999999999999999\n", " \n7\n"]
"""Pid files that name no process: empty, unfinished (no newline yet), negative (PostgreSQL's
single-user backend, as initdb runs), zero, not a number, beyond Linux's largest pid."""


@pytest.mark.parametrize("content", NONSENSE)
def test_a_pid_file_that_names_no_process_reads_as_none(tmp_path: Path, content: str) -> None:
    """Any content but a whole line holding a pid in 1..4194304 reads as no pid."""
    path = tmp_path / "x.pid"
    path.write_text(content)
    assert pidfile.read_pid(path) is None
    assert pidfile.process(pidfile.read_pid(path)) is None


def test_a_missing_pid_file_reads_as_none(tmp_path: Path) -> None:
    assert pidfile.read_pid(tmp_path / "none.pid") is None


def test_a_whole_pid_line_reads_as_its_pid(tmp_path: Path) -> None:
    path = tmp_path / "x.pid"
    path.write_text(f"{os.getpid()}\n")
    assert pidfile.read_pid(path) == os.getpid()
    found = pidfile.process(pidfile.read_pid(path))
    assert found is not None and found.pid == os.getpid()


@pytest.mark.parametrize("pid", [-1, 0, 2**40])
def test_a_pid_out_of_range_is_no_process(pid: int) -> None:
    """psutil raises ValueError for a negative pid: :func:`pidfile.process` says None."""
    assert pidfile.process(pid) is None


def test_nonsense_in_a_launcher_pid_file_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "cp-1.pid"
    path.write_text("-42\n")
    with caplog.at_level(logging.WARNING, logger="stockade.pidfile"):
        assert pidfile.read_pid(path, warn=True) is None
        assert pidfile.read_pid(path, warn=True) is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and str(path) in said[0] and "'-42'" in said[0] and "not running" in said[0]


@pytest.mark.parametrize(
    "content",
    [
        "",
        "-{pid}\n",  # a single-user backend (initdb) names itself so
        "-{pid}\n{data}\n1700000000\n",
        "{pid}",  # unfinished
        "nonsense\n{data}\n1700000000\n5432\n",
    ],
)
def test_an_embedded_server_whose_postmaster_pid_names_no_server_is_not_running(
    tmp_path: Path, content: str
) -> None:
    """``is_running`` (what an interrupted ``up`` asks to say what still runs) is False, not
    an error, whatever postmaster.pid holds; ``kill`` does nothing."""
    server = EmbeddedPostgres(data_dir=tmp_path, port=5432)
    server.pgdata.mkdir(parents=True)
    (server.pgdata / "postmaster.pid").write_text(content.format(pid=os.getpid(), data=server.pgdata))
    assert server.is_running() is False
    server.kill()


def test_a_postmaster_pid_cut_short_of_its_port_line_has_no_port(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "postmaster.pid").write_text("123\n/x\n1700000000\n54")
    assert procs.postmaster_port(tmp_path) is None
    (tmp_path / "data" / "postmaster.pid").write_text("123\n/x\n1700000000\n5432\n")
    assert procs.postmaster_port(tmp_path) == 5432


def test_a_pid_file_is_never_seen_half_written(tmp_path: Path) -> None:
    """The launcher writes pid files whole (renamed into place): no temporary is left."""
    path = tmp_path / "pids" / "w-1.pid"
    pidfile.write_pid(path, 4321)
    assert path.read_text() == "4321\n"
    assert [p.name for p in path.parent.iterdir()] == ["w-1.pid"]


def test_a_run_with_a_limit_that_does_not_end_is_given_up_on() -> None:
    """A run deaf to cancellation (here shielded for 2 s, as a call stuck in the asyncio bridge)
    is given up on at its limit: RunOverran, not a wait for the run."""

    async def deaf(_client: ControlPlaneClient) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(2.0)

    with pytest.raises(rpc.RunOverran):
        rpc.with_client(["127.0.0.1:1"], deaf, limit_s=0.2)


def test_a_run_with_a_limit_returns_what_its_body_returned_and_raises_what_it_raised() -> None:
    async def answer(_client: ControlPlaneClient) -> int:
        await trio.lowlevel.checkpoint()
        return 7

    async def refuse(_client: ControlPlaneClient) -> int:
        raise ClusterError("no")

    assert rpc.with_client(["127.0.0.1:1"], answer, limit_s=30.0) == 7
    with pytest.raises(ClusterError, match="no"):
        rpc.with_client(["127.0.0.1:1"], refuse, limit_s=30.0)


_WAIT_THAT_IGNORES_CANCELLATION = textwrap.dedent(
    """
    import os
    from pathlib import Path
    import trio, typer
    from ops import rpc
    from ops.cli.common import interruptible

    app = typer.Typer()

    @app.command()
    def up() -> None:
        async def deaf(_client) -> None:
            Path(os.environ["READY_FILE"]).touch()
            with trio.CancelScope(shield=True):  # as a status call stuck in the bridge
                await trio.sleep_forever()

        with interruptible(lambda: "nothing runs"):
            rpc.with_client(["127.0.0.1:1"], deaf, limit_s=3600.0)

    app()
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_a_wait_whose_calls_ignore_cancellation(tmp_path: Path, signum: signal.Signals) -> None:
    """Ctrl-C or SIGTERM while ``up``'s wait is stuck in a call that ignores cancellation:
    one line and exit 130 (``up`` hung there before, deaf to both, holding the state lock)."""
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "READY_FILE": str(ready)}
    process = subprocess.Popen(
        [sys.executable, "-c", _WAIT_THAT_IGNORES_CANCELLATION],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the command never started waiting"
            time.sleep(0.02)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == EXIT_INTERRUPTED, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["interrupted: nothing runs"]


def test_a_state_lock_held_by_another_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    """``up`` and ``down`` wait for another holder of the state folder's lock at most
    ``wait_s``, then say who holds it."""
    state = StateDir(tmp_path / "state")
    with state.locked():
        # Another open file description: flock conflicts even within this process.
        with (state.root / ".lock").open("a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ClusterError, match=rf"pid {os.getpid()}\) has held"), state.locked(wait_s=0.2):
            pass
    with state.locked(wait_s=0.2):  # free again
        pass


def test_an_interrupted_command_whose_message_fails_still_ends_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What an interrupted ``up`` says is worked out after the interrupt; when that fails (or
    is interrupted again) it still ends with one line and exit 130."""

    def broken() -> str:
        raise ValueError("psutil said no")

    with pytest.raises(typer.Exit) as ended, interruptible(broken):
        raise KeyboardInterrupt
    assert ended.value.exit_code == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "interrupted: could not tell what still runs (ValueError: psutil said no)" in err
    assert "Traceback" not in err
