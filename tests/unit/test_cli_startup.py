"""``stockade`` starts fast: what a call imports is what it needs, checked in a fresh process.

A call imports the command group it names (``--help``: every group; Typer needs each
command's options), so a heavy import at the top of a command module, or in a module they
share, slows down every call. The budget (0.3 s for ``--help`` and ``status`` on an idle
machine) is kept by keeping those imports out; timing a subprocess here would only measure
the machine's load, so these tests check the imports themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def loaded(*args: str) -> tuple[int, list[str]]:
    """The exit code of ``stockade ARGS`` run in a fresh interpreter, and the modules it loaded.

    It runs where the test runs, with the test's environment: the suite gives every test a
    state folder and a user config of its own (``tests/conftest.py``), so what the developer's
    cluster records changes nothing here (``tests/unit/test_suite_isolation.py``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    report = done.stderr.rpartition("MODULES ")[2]
    assert report, done.stderr
    data = json.loads(report)
    return data["code"], data["modules"]


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
