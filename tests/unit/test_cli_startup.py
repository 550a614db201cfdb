"""``stockade`` starts fast: what a call imports is what it needs, checked in a fresh process.

A call imports the command group it names (``--help``: every group; Typer needs each
command's options), so a heavy import at the top of a command module, or in a module they
share, slows down every call. The budget (0.3 s for ``--help`` and ``status`` on an idle
machine) is kept by keeping those imports out; timing a subprocess here would only measure
the machine's load, so these tests check the imports themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ops.cli import params

ROOT = Path(__file__).parents[2]

_WRAPPER = """
import json, os, sys
sys.argv = ["stockade", *sys.argv[1:]]
real_exit = os._exit

def report(code):
    sys.stdout.flush()
    sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
    sys.stderr.flush()
    real_exit(0)

os._exit = report  # a client command ends with os._exit: report first
try:
    from ops.cli import main
    main()
except SystemExit as exit:
    report(exit.code)
else:
    report(0)
"""
"""Runs the CLI as ``stockade ARGS`` does, then reports every module loaded and the exit code."""

SERVER_SIDE = (
    "actors",
    "agent",
    "asyncpg",
    "runtime.aio.pg",
    "runtime.aio.grpc_server",
    "ops.cluster",
    "ops.launcher.pg",
    "ops.launcher.pg_secrets",
    "ops.launcher.pg_tools",
    "ops.launcher.pg_user",
    "ops.launcher.hadb_members",
    "ops.chaos",
    "ops.chaos_workload",
    "ops.faults",
    "ops.checker",
    "ops.checker_records",
)
"""The control plane, the agent, the database driver and the bridge's database and server
sides, the launcher and the harnesses."""

NEVER = (
    *SERVER_SIDE,
    "numpy",
    "matplotlib",
    "pydantic",
    "structlog",
    "psutil",
    "ops.bench",
    "cryptography",
    "ops.certs",
)
"""What no client call needs (the benchmarks', plotting's, logging's and Typer's heavy parts,
the certificate tooling)."""

CLIENT = ("trio", "trio_asyncio", "grpclib", "betterproto2", "protocol", "rich", "ops.rpc", "runtime.client")
"""What a call that talks to the cluster needs, and ``--help`` and ``--version`` do not."""

GRPC_SERVER = ("grpclib.server", "betterproto2.grpclib.grpclib_server", "protocol.bases")
"""grpclib's server side and the generated service bases (:mod:`protocol.bases`), which a
server subclasses: a unary call of a client needs none of them."""


@attrs.frozen
class Ran:
    """What ``stockade ARGS`` did in a fresh interpreter."""

    code: int
    modules: list[str]
    """Every module it loaded."""
    stdout: str
    stderr: str
    """Standard error without the wrapper's report."""


def ran(*args: str, **env: str) -> Ran:
    """Run ``stockade ARGS`` in a fresh interpreter, with ``env`` added to the environment.

    It runs where the test runs, with the test's environment: the suite gives every test a
    state folder and a user config of its own (``tests/conftest.py``), so what the developer's
    cluster records changes nothing here (``tests/unit/test_suite_isolation.py``)."""
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", **env},
        check=False,
    )
    stderr, _, report = done.stderr.rpartition("\nMODULES ")
    assert report, done.stderr
    data = json.loads(report)
    return Ran(code=data["code"], modules=data["modules"], stdout=done.stdout, stderr=stderr)


def loaded(*args: str) -> tuple[int, list[str]]:
    """The exit code of ``stockade ARGS`` run in a fresh interpreter (:func:`ran`), and the
    modules it loaded."""
    done = ran(*args)
    return done.code, done.modules


def under(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules that are one of ``prefixes`` or inside one of them."""
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["status", "--help"],
        ["logs", "--help"],
        ["up", "--help"],
        ["certs", "--help"],
        ["chaos", "--help"],
    ],
)
def test_help_and_version_load_neither_the_client_nor_the_server(args: list[str]) -> None:
    """``--help`` and ``--version`` load Typer and the command modules, nothing that talks to
    a cluster or runs one."""
    code, modules = loaded(*args)
    assert code == 0
    assert under(modules, NEVER) == []
    assert under(modules, CLIENT) == []


@pytest.fixture
def client_certs() -> None:
    """The certificates of a local cluster in the test's state folder, as ``stockade up`` makes
    them: a client command finds them and goes on to call the cluster, as it does beside a
    running cluster (without them it stops before it loads the calls)."""
    from ops.certs import init_cluster
    from ops.config import default_state_dir

    init_cluster(default_state_dir() / "certs")


@pytest.mark.usefixtures("client_certs")
def test_a_client_command_loads_the_client_and_nothing_of_the_server() -> None:
    """``stockade status`` against an address where nothing listens: the client loads (trio,
    the protocol, the failover client), the server side and pydantic do not."""
    code, modules = loaded("status", "--control-planes", "127.0.0.1:1")
    assert code == 1
    assert under(modules, NEVER) == []
    assert under(modules, GRPC_SERVER) == []
    assert {"trio", "protocol", "runtime.client"} <= set(modules)


@pytest.mark.usefixtures("client_certs")
def test_logs_loads_the_client_and_nothing_of_the_server() -> None:
    """``stockade logs 1`` against an address where nothing listens: the client and its
    streams load, the server side (the bridge's server half included) does not."""
    code, modules = loaded("logs", "1", "--control-planes", "127.0.0.1:1")
    assert code == 1
    assert under(modules, NEVER) == []
    assert {"trio", "protocol", "runtime.client", "runtime.aio.grpc_client"} <= set(modules)


def test_typer_reads_plain_options_without_pydantic() -> None:
    """This Typer's internals are where :mod:`ops.cli.params` expects them, so plain options
    are read without pydantic (a Typer release that moves them is noticed here)."""
    import ops.cli.base  # noqa: F401  (installs them, as every command's import does)

    assert params.installed()


def test_the_command_map_names_what_each_group_registers() -> None:
    """ops.cli.COMMANDS lists, per module, exactly the commands it registers, so that a call
    which loads only its own group finds its command."""
    import ops.cli
    from ops.cli.base import app

    ops.cli.load_commands()
    registered: dict[str, list[str]] = {}
    for command in app.registered_commands:
        assert command.callback is not None
        group = command.callback.__module__.removeprefix("ops.cli.")
        # ops.cli.jobs registers `run` in its place among the job commands; it is written in
        # ops.cli.job_files.
        group = {"job_files": "jobs"}.get(group, group)
        registered.setdefault(group, []).append(command.name or command.callback.__name__)
    for typer_group in app.registered_groups:
        sub_app = typer_group.typer_instance
        assert sub_app is not None
        owner = sub_app.registered_commands[0].callback
        assert owner is not None
        group = owner.__module__.removeprefix("ops.cli.")
        registered.setdefault(group, []).append(typer_group.name or "")
    assert {group: sorted(names) for group, names in registered.items()} == {
        group: sorted(names) for group, names in ops.cli.COMMANDS.items()
    }


NOT_HOT = (
    "typer",
    "trio",
    "trio_asyncio",
    "runtime.client",
    "ops.client.core",
    "ops.cli.base",
    "ops.cli.jobs",
    "importlib.metadata",
    *GRPC_SERVER,
)
"""What the hot commands' own layer (:mod:`ops.cli.fast`) does without: Typer, trio, the failover
client, the Typer commands, importlib.metadata (betterproto2 asks it for its version) and
grpclib's server side with the generated service bases (``GRPC_SERVER``)."""


def test_help_loads_only_its_own_layer() -> None:
    """``stockade --help`` is printed without Typer, rich, the configuration or any command module."""
    done = ran("--help")
    assert done.code == 0
    assert (
        under(done.modules, (*NOT_HOT, "rich", "ops.config", "ops.cli.common", "runtime", "protocol")) == []
    )
    assert under(done.modules, ("ops",)) == ["ops", "ops.cli", "ops.cli.fast"]


_TYPER_HELP = "import ops.cli; ops.cli.load_commands()(['--help'], prog_name='stockade')"
"""Prints ``stockade --help`` through the Typer app."""


def test_the_version_is_the_installed_one_without_typer() -> None:
    """``stockade --version`` prints the installed distribution's version, as
    :func:`importlib.metadata.version` reads it, without loading Typer."""
    import importlib.metadata

    done = ran("--version")
    assert (done.code, done.stdout) == (0, f"stockade {importlib.metadata.version('stockade')}\n")
    assert under(done.modules, (*NOT_HOT, "rich")) == []


@pytest.mark.parametrize("columns", [30, 52, 60, 70, 79, 80, 81, 100, 200])
def test_the_help_is_typers_at_every_width(columns: int) -> None:
    """What :mod:`ops.cli.fast` prints for ``--help`` is what Typer prints, wrapped and cut alike
    (Typer's in a process of its own: Click's test runner fixes the width at 80 columns)."""
    from ops.cli import fast

    typer_help = subprocess.run(
        [sys.executable, "-c", _TYPER_HELP],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)},
        check=False,
    )
    assert typer_help.returncode == 0, typer_help.stderr
    assert fast.top_help(columns) == typer_help.stdout
    assert ran("--help", COLUMNS=str(columns)).stdout == typer_help.stdout


def test_the_help_lists_the_apps_commands() -> None:
    """:data:`ops.cli.fast.TOP_COMMANDS` names the app's shown commands (in the order of a fresh
    ``stockade --help``: :func:`test_the_help_is_typers_at_every_width`), each with the start of
    its help: its whole first paragraph, or more of it than any listing shows."""
    import typer

    import ops.cli
    from ops.cli import fast
    from ops.cli.base import app

    ops.cli.load_commands()
    group = typer.main.get_command(app)
    context = group.context_class(group, info_name="stockade")
    shown: dict[str, str] = {}
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None
        if not command.hidden:
            shown[name] = " ".join((command.help or "").split("\n\n")[0].split())
    assert sorted(name for name, _ in fast.TOP_COMMANDS) == sorted(shown)
    longest_cut = 80 - 2 - 6 - max(len(name) for name in shown)
    for name, start in fast.TOP_COMMANDS:
        assert shown[name].startswith(start), name
        assert start == shown[name] or len(start) > longest_cut + 1, name
    assert group.help == fast.TOP_HELP


_FAKE_CONTROL_PLANE = """
import asyncio, sys
import grpclib.const, grpclib.server
from protocol import pb
from protocol.bases import ControlPlaneBase

refuse = sys.argv[1] == "refuse"
sent = open(sys.argv[2], "a")


class FakeControlPlane(ControlPlaneBase):
    async def status(self, message):
        return pb.StatusReply(
            leader="cp-1",
            epoch=4,
            answered_by="cp-1",
            heartbeat_interval_ms=250,
            dead_after_ms=2500,
            heartbeat_policy="the control planes' settings",
            control_planes=[pb.ControlPlaneInfo(id="cp-1", address="127.0.0.1:7", role="leader")],
            workers=[
                pb.WorkerInfo(
                    id="w-1", address="127.0.0.1:9", state="alive", cpu_millis=4000, memory_mb=8192,
                    cpu_allocated_millis=1000, memory_allocated_mb=512, job_ids=[3, 5],
                    labels={"container": "docker", "resources": "cgroup2"},
                )
            ],
            jobs=[pb.JobCount(state="running", count=2), pb.JobCount(state="succeeded", count=7)],
        )

    async def submit_job(self, message):
        sent.write(bytes(message).hex() + "\\n")
        sent.flush()
        if refuse:
            raise grpclib.GRPCError(grpclib.const.Status.INVALID_ARGUMENT, "after: no job 99 (request)")
        return pb.SubmitJobReply(job_id=41)


async def main():
    server = grpclib.server.Server([FakeControlPlane()])
    await server.start("127.0.0.1", 0)
    print(server._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""
"""A control plane that answers Status, and SubmitJob with job 41 (or, given ``refuse``,
INVALID_ARGUMENT), writing each SubmitJobRequest it gets to the file named, in hex; it prints
its port, served in plaintext on 127.0.0.1."""


@attrs.frozen
class FakeControlPlane:
    """A running :data:`_FAKE_CONTROL_PLANE`."""

    address: str
    sent_file: Path

    def submitted(self) -> list[Any]:
        """Every SubmitJobRequest it got, in order."""
        from protocol import pb

        lines = self.sent_file.read_text().split()
        return [pb.SubmitJobRequest.parse(bytes.fromhex(line)) for line in lines]


@contextlib.contextmanager
def serving(tmp_path: Path, mode: str) -> Iterator[FakeControlPlane]:
    """A fake control plane in a process of its own (``mode``: ``answer`` or ``refuse``),
    stopped when the block ends."""
    sent_file = tmp_path / f"submitted-{mode}.hex"
    sent_file.touch()
    with subprocess.Popen(
        [sys.executable, "-c", _FAKE_CONTROL_PLANE, mode, str(sent_file)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ) as server:
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            yield FakeControlPlane(address=f"127.0.0.1:{port}", sent_file=sent_file)
        finally:
            server.kill()


@pytest.fixture
def fake_control_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeControlPlane]:
    """A fake control plane that answers; client commands call it in plaintext."""
    monkeypatch.setenv("STOCKADE_INSECURE", "1")
    with serving(tmp_path, "answer") as plane:
        yield plane


def typer_run(*args: str) -> Any:
    """``stockade ARGS`` through the Typer app in this process (the trio client), as the test's
    environment says, 100 columns wide."""
    from typer.testing import CliRunner

    import ops.cli

    return CliRunner().invoke(ops.cli.load_commands(), list(args), env={"COLUMNS": "100"})


def submit_args(address: str, *more: str, command: tuple[str, ...] = ("sh", "-c", "true")) -> list[str]:
    """A ``stockade submit`` of ``command`` (none: ``more`` says the job) with an environment
    variable and the options ``more``, to ``address``."""
    options = ["--cpu-millis", "100", "--memory-mb", "64", "--env", "A=b", "--control-planes", address]
    return ["submit", *options, *more, *(("--", *command) if command else ())]


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["submit"]])
def test_the_hot_commands_load_neither_typer_nor_trio(
    fake_control_plane: FakeControlPlane, args: list[str]
) -> None:
    """``status`` and ``submit`` answered by the first control plane run on asyncio without
    Typer or trio, and load nothing of the server."""
    if args == ["submit"]:
        args = submit_args(fake_control_plane.address)
    else:
        args = [*args, "--control-planes", fake_control_plane.address]
    done = ran(*args)
    assert done.code == 0, done.stderr
    assert under(done.modules, NOT_HOT if args[1] != "--json" else (*NOT_HOT, "rich")) == []
    assert under(done.modules, NEVER) == []


def test_status_loads_the_classes_it_shows_and_no_others(fake_control_plane: FakeControlPlane) -> None:
    """``stockade status`` of a cluster with nothing unschedulable loads the status results, not
    the job results, the launcher's record classes or rich's table of emoji codes."""
    done = ran("status", "--control-planes", fake_control_plane.address)
    assert done.code == 0, done.stderr
    assert "ops.client.status_results" in done.modules
    assert under(done.modules, ("ops.client.results", "ops.launcher", "rich._emoji_codes")) == []


def test_the_fast_layers_routes_are_the_services() -> None:
    """The gRPC paths :mod:`ops.cli.fast` calls are the ControlPlane service's Status and
    SubmitJob, with the reply types the generated service gives them."""
    from ops.cli import fast
    from protocol import pb
    from protocol.bases import ControlPlaneBase

    mapping = ControlPlaneBase().__mapping__()
    assert mapping[fast._STATUS_ROUTE].reply_type is pb.StatusReply
    assert mapping[fast._SUBMIT_JOB_ROUTE].reply_type is pb.SubmitJobReply


@pytest.mark.parametrize("args", [["status"], ["status", "--json"]])
def test_the_fast_status_prints_what_the_typer_command_prints(
    fake_control_plane: FakeControlPlane, args: list[str]
) -> None:
    """``stockade status`` (and ``--json``) prints the same whichever layer answers."""
    fast = ran(*args, "--control-planes", fake_control_plane.address)
    slow = typer_run(*args, "--control-planes", fake_control_plane.address)
    assert slow.exit_code == 0
    assert fast.stdout == slow.output
    assert "w-1" in fast.stdout


@pytest.mark.parametrize(
    ("more", "command"),
    [
        ((), ("sh", "-c", "true")),
        (("--sleep-s", "1.5", "--name=nap", "--priority", "5", "--spread", "--tasks", "2"), ()),
        (
            (
                "--max-attempts=3",
                "--retry-backoff-s",
                "2",
                "--count-lost",
                "--timeout-s",
                "60",
                "--constraint",
                "resources=cgroup2",
                "--env",
                "C=d",
                "--workdir",
                "/srv",
                "--after",
                "3,4",
                "--retry-on-exit",
                "1,75",
                "--no-retry-on",
                "oom_killed",
                "--resource",
                "gpu=1",
            ),
            ("python3", "-c", "print(1)"),
        ),
        (("--image", "busybox", "--array", "1-4%2", "--max-failed-tasks", "2"), ("echo", "--", "-x")),
    ],
)
def test_the_fast_submit_sends_what_the_typer_command_sends(
    fake_control_plane: FakeControlPlane, more: tuple[str, ...], command: tuple[str, ...]
) -> None:
    """``stockade submit`` prints the job's id and sends the same spec as the Typer command,
    whatever options it is given."""
    fast = ran(*submit_args(fake_control_plane.address, *more, command=command))
    slow = typer_run(*submit_args(fake_control_plane.address, *more, command=command))
    assert (fast.code, fast.stdout) == (slow.exit_code, slow.output) == (0, "41\n")
    assert "typer" not in fast.modules
    sent_fast, sent_slow = fake_control_plane.submitted()
    assert sent_fast.spec == sent_slow.spec
    assert sent_fast.idempotency_key != sent_slow.idempotency_key


def test_a_refused_submit_is_said_by_the_typer_command_under_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submit the first control plane refuses is left to the Typer command, which sends it
    again with the same idempotency key and says the refusal as always (exit status 2)."""
    monkeypatch.setenv("STOCKADE_INSECURE", "1")
    with serving(tmp_path, "refuse") as plane:
        done = ran(*submit_args(plane.address))
        first, again = plane.submitted()
    assert done.code == 2
    assert done.stderr == "error: after: no job 99 (request)\n"
    assert "typer" in done.modules
    assert first.idempotency_key == again.idempotency_key


def test_a_hot_command_whose_first_control_plane_is_down_asks_the_next(
    fake_control_plane: FakeControlPlane,
) -> None:
    """``status`` and ``submit`` whose first control plane refuses the connection are answered
    by the next one, as the failover client would answer them, still without trio."""
    addresses = f"127.0.0.1:1,{fake_control_plane.address}"
    status = ran("status", "--json", "--control-planes", addresses)
    submit = ran(*submit_args(addresses))
    assert (status.code, submit.code, submit.stdout) == (0, 0, "41\n")
    assert status.stdout == typer_run("status", "--json", "--control-planes", addresses).output
    assert under(status.modules + submit.modules, NOT_HOT) == []


@pytest.mark.usefixtures("client_certs")
def test_a_call_no_control_plane_answers_is_said_by_the_typer_command() -> None:
    """When no control plane answers, the Typer command walks them again and says how each
    failed, as it always has (exit status 1)."""
    done = ran("status", "--control-planes", "127.0.0.1:1,127.0.0.1:2")
    assert done.code == 1
    assert done.stderr.startswith(
        "error: no control plane answered at 127.0.0.1:1, 127.0.0.1:2: connection refused"
    )
    assert "typer" in done.modules


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--bogus"],
        ["status", "--json", "--json"],
        ["status", "--json=1"],
        ["status", "extra"],
        ["status", "--help"],
        ["status", "--control-planes"],
        ["submit", "--cpu-millis", "-1", "--memory-mb", "64", "--sleep-s", "1"],
        ["submit", "--cpu-millis", "1e3", "--memory-mb", "64", "--sleep-s", "1"],
        ["submit", "--memory-mb", "64", "--sleep-s", "1"],
        ["submit", "--cpu-millis", "100", "--memory-mb", "64", "true"],
        ["submit", "--cpu-millis", "100", "--memory-mb", "64", "--sleep-s", "1e9"],
        ["submit", "--cpu-millis", "100", "--memory-mb", "64", "--sleep-s", "1", "--image", "x"],
        ["submit", "--cpu-millis", "100", "--memory-mb", "64", "--name", "--", "true"],
    ],
)
def test_what_the_fast_layer_does_not_read_is_left_to_typer(args: list[str]) -> None:
    """A command line :mod:`ops.cli.fast` does not read with certainty (unknown, repeated or
    valueless options, words before ``--``, values it would have to judge, a command's
    ``--help``) is left to the Typer app, untouched."""
    from ops.cli import fast

    kept = list(args)
    assert fast.run(kept) is None
    assert kept == args


def _answers(*behaviours: str) -> tuple[list[Any], list[str]]:
    """Calls for :func:`ops.cli.fast._first_answer`, one per behaviour (``silent``: never ends;
    ``refused``: OSError at once; ``tls``: an SSL error; else answers that word), and the log of
    what each did (``started X``, ``cancelled X``)."""
    import asyncio
    import ssl

    log: list[str] = []

    def make(behaviour: str, index: int) -> Any:
        async def call() -> str:
            name = f"{behaviour}{index}"
            log.append(f"started {name}")
            try:
                if behaviour == "silent":
                    await asyncio.Event().wait()
                if behaviour == "refused":
                    raise ConnectionRefusedError(name)
                if behaviour == "tls":
                    raise ssl.SSLError(name)
                return name
            except asyncio.CancelledError:
                log.append(f"cancelled {name}")
                raise

        return call

    return [make(b, i) for i, b in enumerate(behaviours)], log


def test_status_asks_the_next_control_plane_while_a_silent_one_keeps_it_waiting() -> None:
    """A replica that never answers (frozen: it accepts the connection, then nothing) holds the
    status only until the hedge delay: the next one is asked too, its answer taken, and the
    silent call cancelled. A refused one is passed at once; an SSL error is said at once; none
    answering is said as no answer."""
    import asyncio
    import ssl

    from ops.cli import fast

    def first(*behaviours: str) -> tuple[Any, list[str]]:
        calls, log = _answers(*behaviours)
        result = asyncio.run(asyncio.wait_for(fast._first_answer(calls, 0.01, "them"), 30))
        return result, log

    assert first("silent", "ok") == ("ok1", ["started silent0", "started ok1", "cancelled silent0"])
    assert first("refused", "silent", "ok") == (
        "ok2",
        ["started refused0", "started silent1", "started ok2", "cancelled silent1"],
    )
    calls, log = _answers("refused", "ok", "silent")
    assert asyncio.run(fast._first_answer(calls, None, "them")) == "ok1"  # one at a time
    assert log == ["started refused0", "started ok1"]
    with pytest.raises(ssl.SSLError):
        asyncio.run(fast._first_answer(_answers("tls", "ok")[0], 10.0, "them"))
    with pytest.raises(fast._NoAnswer):
        asyncio.run(fast._first_answer(_answers("refused", "refused")[0], 10.0, "them"))


def test_status_is_answered_past_a_control_plane_that_accepts_and_never_answers(
    fake_control_plane: FakeControlPlane,
) -> None:
    """A first control plane that takes the connection and never answers (a listening socket
    nobody accepts from, as a frozen replica's) leaves ``status`` to the next one, through the
    fast layer still (no Typer, no trio); the commands after it (``status``, ``submit``) ask
    the one that answered first, and the silent one is not connected to again."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.setblocking(False)
        addresses = f"127.0.0.1:{silent.getsockname()[1]},{fake_control_plane.address}"

        def connections() -> int:
            taken = 0
            with contextlib.suppress(BlockingIOError):
                while True:
                    silent.accept()[0].close()
                    taken += 1
            return taken

        done = ran("status", "--json", "--control-planes", addresses)
        assert done.code == 0, done.stderr
        assert json.loads(done.stdout)["leader"] == "cp-1"
        assert under(done.modules, NOT_HOT) == []
        assert connections() == 1
        again = ran("status", "--json", "--control-planes", addresses)
        submitted = ran(*submit_args(addresses))
        assert (again.code, submitted.code, submitted.stdout) == (0, 0, "41\n")
        assert connections() == 0
