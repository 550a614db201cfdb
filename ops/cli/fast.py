"""The hot commands' own argument layer: ``stockade --help``, ``--version``, ``status`` and ``submit`` read
without Typer and called over asyncio without trio (docs/development.md, "How fast `stockade`
starts"). It takes only what it reads with certainty and the happy path: a command line it does
not know for sure (an unknown or repeated option, a value it would have to judge, ``--help`` of a
command), and a call that no control plane answers or that one refuses, is left to the Typer
command (:func:`run` returns None), which reads it again and says what is wrong as it always
has; a submit left so carries the idempotency key already sent, so the job is stored once.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.jobs import JobSpec

__all__ = ["TOP_COMMANDS", "run", "spec_of_submit_options", "top_help"]

MAX_SLEEP_S = 7 * 24 * 3600
""":data:`runtime.jobs.MAX_SLEEP_MS` in seconds, written out so that ``--help`` need not import
the job spec (a unit test keeps them equal)."""

TOP_HELP = (
    "Stockade: a cluster scheduler whose leaders can crash and freeze without placing or running a job twice."
)
"""The app's help, as ``stockade --help`` says it (ops.cli.base.app's)."""

TOP_OPTIONS = (
    ("--version", "Print the installed version and exit."),
    ("--help", "Show this message and exit."),
)

TOP_COMMANDS: tuple[tuple[str, str], ...] = (
    ("up", "Start the local cluster in the background and wait for a leader and"),
    ("down", "Stop every process of the local cluster and the embedded database, and"),
    ("kill-leader", "SIGKILL the current leader's process (a local cluster's; found through"),
    ("kill-worker", "SIGKILL the busiest live worker (most CPU allocated) of the local"),
    ("prometheus-config", "Write a Prometheus configuration that scrapes every process of the local"),
    ("jobs", "Submit COUNT sleep jobs of mixed sizes (250-4000 cpu_millis, 128-4096"),
    ("submit", "Submit one job, a command (stockade submit ... -- CMD ARGS...), a"),
    ("run", "Submit the jobs of a job file, all or none; print their ids, one a line"),
    ("job", "Show one job: state, worker, assignment, times, its attempts and"),
    ("list", "List jobs in a table, newest first, with the account that owns each."),
    ("cancel", "Cancel a job: at once while pending or waiting, through its worker once"),
    ("status", "Show the leader and its epoch, the control planes, the workers with"),
    ("logs", "Print a job's stdout (or --stderr) as its worker keeps it, from any"),
    ("console", "Print the URL of each control plane's web console with a login token."),
    ("cordon", "Cordon a worker: nothing new is placed on it; its running jobs go on."),
    ("uncordon", "Uncordon a worker: it takes placements again; a drain of it ends (what"),
    ("drain", "Drain a worker: cordon it, then wait for its jobs to end; at"),
    ("audit", "Show the audit trail, newest first: each submit, cancel, cordon,"),
    ("chaos", "Start a fresh cluster, inject leader failovers (alternating SIGKILL and"),
    ("check", "Check a cluster's history: no job placed twice (database), none run"),
    ("cp", "Run one control-plane replica in the foreground until SIGTERM or Ctrl-C."),
    ("agent", "Run one worker agent in the foreground until SIGTERM or Ctrl-C (a clean"),
    ("fleet", "Run many workers' agents in one process until SIGTERM or Ctrl-C."),
    ("database", "Run the embedded PostgreSQL server in the foreground until SIGTERM or"),
    ("bench", "Benchmarks that print measured numbers."),
    ("account", "Accounts' quotas (cpu_millis, memory_mb, max pending jobs), priority"),
    ("schedule", "Periodic jobs: one job per slot of a cron expression in a time zone,"),
    ("certs", "The cluster CA and the certificates it issues (mutual TLS between every"),
    ("image", "The Stockade image (PostgreSQL, control planes and agents), built"),
)
"""Each command ``stockade --help`` lists, in its order, with the start of its help: as much of
its first paragraph as the widest listing shows (``tests/unit/test_cli_startup.py`` checks both
against the Typer app, and the whole text against Typer's at every width)."""

_HELP_WIDTH_MAX = 80
"""Click's widest help, columns (its HelpFormatter's ``max_width``)."""


def _short_help(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` columns as Click cuts a command's help in a listing: at the
    first sentence's end when that fits, else at a word, with ``...``."""
    words = text.split()
    total = 0
    for index, word in enumerate(words):
        total += len(word) + (index > 0)
        if total > limit:
            break
        if word.endswith("."):
            return " ".join(words[: index + 1])
        if total == limit and index != len(words) - 1:
            break
    else:
        return " ".join(words)
    total += len("...")
    while index > 0:
        total -= len(words[index]) + (index > 0)
        if total <= limit:
            break
        index -= 1
    return " ".join(words[:index]) + "..."


def _definitions(rows: Sequence[tuple[str, str]], width: int) -> list[str]:
    """``rows`` as Click's definition list under a section heading (indent 2)."""
    import textwrap

    first_col = min(max(len(name) for name, _ in rows), 30) + 2
    wrap_at = max(width - first_col - 2, 10)
    lines = []
    for name, text in rows:
        wrapped = textwrap.wrap(text, wrap_at, replace_whitespace=False) or [""]
        if len(name) <= first_col - 2:
            lines.append(f"  {name.ljust(first_col)}{wrapped[0]}")
        else:
            lines += [f"  {name}", " " * (first_col + 2) + wrapped[0]]
        lines += [" " * (first_col + 2) + line for line in wrapped[1:]]
    return lines


def _terminal_columns() -> int:
    """The terminal's width as :func:`shutil.get_terminal_size` tells it (``$COLUMNS``, else
    standard output's terminal, else 80), without importing :mod:`shutil` and its compressors."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def top_help(columns: int | None = None) -> str:
    """What ``stockade --help`` prints, as Click lays it out for a terminal ``columns`` wide
    (default: the terminal's, or ``$COLUMNS``)."""
    import textwrap  # here: only --help lays text out

    if columns is None:
        columns = _terminal_columns()
    width = max(min(columns, _HELP_WIDTH_MAX) - 2, 50)
    limit = width - 6 - max(len(name) for name, _ in TOP_COMMANDS)
    commands = [(name, _short_help(text, limit)) for name, text in TOP_COMMANDS]
    about = textwrap.wrap(TOP_HELP, width, initial_indent="  ", subsequent_indent="  ")
    lines = [
        "Usage: stockade [OPTIONS] COMMAND [ARGS]...",
        "",
        *about,
        "",
        "Options:",
        *_definitions(TOP_OPTIONS, width),
        "",
        "Commands:",
        *_definitions(commands, width),
    ]
    return "\n".join(lines) + "\n"


class _Refused(Exception):
    """A command line this layer does not read with certainty: the Typer command reads it."""


_VALUE_OPTIONS: tuple[str, ...] = ("name", "image", "max_attempts", "retry_backoff_s", "timeout_s", "workdir")
_VALUE_OPTIONS += ("array", "max_failed_tasks", "tasks", "idempotency_key", "control_planes")
_SUBMIT_OPTIONS: Mapping[str, str] = {
    "cpu_millis": "count",
    "memory_mb": "count",
    "priority": "count",
    "sleep_s": "seconds",
    **dict.fromkeys(_VALUE_OPTIONS, "value"),
    **dict.fromkeys(("constraint", "resource", "env", "after", "retry_on_exit", "no_retry_on"), "list"),
    **dict.fromkeys(("count_lost", "spread"), "flag"),
}
"""``stockade submit``'s options by parameter name, each with how it is read."""
_STATUS_OPTIONS: Mapping[str, str] = {"as_json": "flag", "control_planes": "value"}
_OPTION_NAMES = {"as_json": "--json"}
"""Options whose name is not their parameter's (by default ``--`` and the name with ``-``)."""


def _parse(args: Sequence[str], kinds: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The options of ``args`` (a command's, after its name) by parameter name (None, False or
    [] when absent) and what follows ``--``; raises :class:`_Refused` for anything else: a word
    before ``--``, an unknown option, one given twice, a value that starts with ``-`` or that
    is not a plain count (or seconds)."""
    by_flag = {_OPTION_NAMES.get(p, "--" + p.replace("_", "-")): p for p in kinds}
    options: dict[str, Any] = {
        p: [] if k == "list" else (False if k == "flag" else None) for p, k in kinds.items()
    }
    given: set[str] = set()
    rest = list(args)
    while rest:
        word = rest.pop(0)
        if word == "--":
            return options, rest
        flag, has_value, value = word.partition("=")
        param = by_flag.get(flag)
        if param is None or (param in given and kinds[param] != "list"):
            raise _Refused(word)
        given.add(param)
        kind = kinds[param]
        if kind == "flag":
            if has_value:
                raise _Refused(word)
            options[param] = True
            continue
        if not has_value:
            if not rest:
                raise _Refused(word)
            value = rest.pop(0)
        options[param] = _value(kind, value, options[param])
    return options, []


def _value(kind: str, text: str, before: Any) -> Any:
    """An option's value ``text`` read as ``kind`` (``before``: a list option's values so far)."""
    if text.startswith("-") or not text:
        raise _Refused(text)
    import re

    if kind == "count":
        if not re.fullmatch(r"[0-9]{1,15}", text):
            raise _Refused(text)
        return int(text)
    if kind == "seconds":
        if not re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9})?", text) or float(text) > MAX_SLEEP_S:
            raise _Refused(text)
        return float(text)
    if kind == "list":
        return [*before, text]
    return text


def spec_of_submit_options(options: Mapping[str, Any]) -> JobSpec:
    """The job of ``stockade submit``'s options, by parameter name (also ``stockade schedule
    add``'s, which takes them): a command, a container or a sleep, checked by the control plane's
    rules here first (out-of-range numbers do not fit the wire). Exits with EXIT_INVALID unless
    exactly one of ``sleep_s``, ``image`` and ``command`` is given (``image`` may have a command).

    Raises:
        InvalidArgument: an option breaks a job's rule.
    """
    from ops.cli.common import EXIT_INVALID, fail
    from ops.jobfields import spec_of_options

    image, sleep_s, command = options["image"], options["sleep_s"], options["command"]
    if image is not None and sleep_s is not None:
        fail("give --image IMAGE [-- CMD ARGS...] or --sleep-s SECONDS, not both", EXIT_INVALID)
    if image is None and (sleep_s is None) == (not command):
        fail("give exactly one of --sleep-s SECONDS, --image IMAGE or -- CMD ARGS...", EXIT_INVALID)
    return spec_of_options(
        {
            "name": options["name"],
            "cpu_millis": options["cpu_millis"],
            "memory_mb": options["memory_mb"],
            "priority": options["priority"],
            "sleep_s": sleep_s,
            "command": tuple(command) if command else None,
            "image": image,
            "max_attempts": options["max_attempts"],
            "retry_backoff_s": options["retry_backoff_s"],
            "count_lost": options["count_lost"],
            "timeout_s": options["timeout_s"],
            "constraints": options["constraint"] or [],
            "resources": options.get("resource") or [],
            "env": options["env"] or [],
            "workdir": options["workdir"],
            "after": options.get("after") or [],
            "array": options.get("array"),
            "max_failed_tasks": options.get("max_failed_tasks"),
            "retry_on_exit": options.get("retry_on_exit") or [],
            "no_retry_on": options.get("no_retry_on") or [],
            "tasks": options.get("tasks"),
            "spread": options.get("spread") or False,
        }
    )


def _distribution_version(name: str) -> str | None:
    """The version of the installed distribution ``name`` (the ``Version`` of the METADATA in the
    first ``NAME-VERSION.dist-info`` folder on :data:`sys.path`, where
    :func:`importlib.metadata.version` finds it); None when there is none."""
    for folder in sys.path:
        try:
            entries = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            found, dash, version = entry.removesuffix(".dist-info").partition("-")
            if found == name and dash and "-" not in version and entry.endswith(".dist-info"):
                try:
                    with open(os.path.join(folder or ".", entry, "METADATA"), encoding="utf-8") as metadata:
                        for line in metadata:
                            if line.startswith("Version:"):
                                return line.removeprefix("Version:").strip()
                            if not line.strip():
                                break
                except OSError:
                    pass
                return None
    return None


def _protocol() -> Any:
    """:data:`protocol.pb`, imported without :mod:`importlib.metadata` when that is not loaded yet.

    betterproto2 asks ``importlib.metadata.version("betterproto2")`` for its own version (to
    check the generated code's compiler version against it), and importing that module loads
    the email, zipfile and csv modules: tens of milliseconds of every hot command. For that
    import a stand-in answers with the version its ``.dist-info`` folder's METADATA gives, and is
    removed at once (as :mod:`protocol` hides pydantic from betterproto2); whoever imports
    :mod:`importlib.metadata` later gets the real one.
    """
    if "betterproto2" not in sys.modules and "importlib.metadata" not in sys.modules:
        version = _distribution_version("betterproto2")
        if version is not None:
            import types

            stand_in = types.ModuleType("importlib.metadata")
            stand_in.version = {"betterproto2": version}.__getitem__  # type: ignore[attr-defined]
            sys.modules["importlib.metadata"] = stand_in
            try:
                from protocol import pb
            finally:
                del sys.modules["importlib.metadata"]
            return pb
    from protocol import pb

    return pb


class _NoAnswer(Exception):
    """No control plane answered the fast path's call: the Typer command calls again."""


STATUS_HEDGE_AFTER_S = 0.3
"""How long ``status`` waits for a control plane's answer before it asks the next one too, in
seconds: a frozen replica accepts connections and never answers, and status is a read any
replica gives (a submit, a write, waits the per-replica timeout: :func:`_answer`)."""

_STATUS_ROUTE = "/stockade.v1.ControlPlane/Status"
_SUBMIT_JOB_ROUTE = "/stockade.v1.ControlPlane/SubmitJob"
"""The ControlPlane methods this layer calls, by their gRPC path (``stockade.proto``)."""


def _answer(
    addresses: list[str],
    route: str,
    request: Any,
    reply_type: type[Any],
    meanwhile: Callable[[], object] | None = None,
    hedge_after_s: float | None = None,
) -> Any:
    """The reply (a ``reply_type``) of the unary ControlPlane method at gRPC path ``route`` over
    asyncio, with the certificate a client command presents, from the first of ``addresses``
    that answers, asked in the order the trio client asks them, each within its per-replica
    timeout; one that refuses the connection or stays silent is left for the next, as that
    client leaves it. With ``hedge_after_s`` (a read any replica answers), each time that long
    passes without an answer the next replica is asked too, and the first answer is taken
    (:func:`_first_answer`): a frozen replica, which accepts connections and never answers,
    costs ``hedge_after_s``, not the per-replica timeout.

    The call is made as the generated stub makes it; ``meanwhile`` is called once, when the
    first request has been sent, to do the command's own work (its imports) while the control
    plane prepares the reply, which waits in the socket meanwhile.

    Raises:
        _NoAnswer: none answered (the Typer command then walks them again and says how each
            failed); anything else a replica said or the call met (that command says it).
    """
    import asyncio

    import grpclib.client
    import grpclib.config
    import grpclib.const

    from ops.config import DEFAULT_TIMEOUT_S, record_answered, resolve_client_tls
    from runtime.identifiers import parse_address, parse_addresses
    from runtime.tls import ANY_CONTROL_PLANE, ClientTls

    parse_addresses(addresses, field="control_planes")
    files = resolve_client_tls()
    target = None if files is None else ClientTls(files).target(ANY_CONTROL_PLANE)
    waiting = [meanwhile] if meanwhile is not None else []

    async def ask(channel: grpclib.client.Channel) -> Any:
        cardinality = grpclib.const.Cardinality.UNARY_UNARY
        async with channel.request(
            route, cardinality, type(request), reply_type, timeout=DEFAULT_TIMEOUT_S
        ) as stream:
            await stream.send_message(request, end=True)
            while waiting:
                waiting.pop()()
            reply = await stream.recv_message()
        if reply is None:
            raise _NoAnswer(route)
        return reply

    answered: list[str] = []

    async def call(address: str) -> Any:
        where = parse_address(address, field="address")
        if target is None:
            channel = grpclib.client.Channel(where.host, where.port)
        else:
            config = grpclib.config.Configuration(ssl_target_name_override=target.server_name)
            channel = grpclib.client.Channel(where.host, where.port, ssl=target.context, config=config)
        try:
            reply = await asyncio.wait_for(ask(channel), DEFAULT_TIMEOUT_S + 0.5)
        finally:
            channel.close()
        answered.append(address)
        return reply

    calls = [functools.partial(call, address) for address in addresses]
    reply = asyncio.run(_first_answer(calls, hedge_after_s, addresses))
    record_answered(addresses, answered[0])  # the next command asks it first
    return reply


async def _first_answer(
    calls: Sequence[Callable[[], Awaitable[Any]]], hedge_after_s: float | None, said: object
) -> Any:
    """The first result of ``calls``, started in order: the next when one fails with an
    OSError or TimeoutError (refused, unreachable, silent past its timeout), and, with
    ``hedge_after_s``, whenever that long passes with no call ended (None: one at a time); the
    others are cancelled once one answers.

    Raises:
        _NoAnswer: every call failed so (naming ``said``).
        ssl.SSLError, or any other error a call raises: at once.
    """
    import asyncio
    import ssl

    waiting = iter(calls)
    running: set[asyncio.Task[Any]] = set()

    def start_next() -> None:
        call = next(waiting, None)
        if call is not None:
            running.add(asyncio.ensure_future(call()))

    start_next()
    try:
        while running:
            ended, _ = await asyncio.wait(running, timeout=hedge_after_s, return_when=asyncio.FIRST_COMPLETED)
            if not ended:
                start_next()  # no answer yet: ask the next one too
            for task in ended:
                running.discard(task)
                error = task.exception()
                if error is None:
                    return task.result()
                if isinstance(error, ssl.SSLError) or not isinstance(error, TimeoutError | OSError):
                    raise error
                start_next()
        raise _NoAnswer(said)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


def _prepare_status_view(addresses: list[str], as_json: bool) -> dict[str, str]:
    """What shows the status of the cluster at ``addresses``, readied before its reply comes: the
    client's result classes, the tables (rich) or, with ``as_json``, the JSON imported; the local
    cluster's metrics addresses (:func:`ops.cli.common.local_metrics`) returned."""
    import ops.client.status_results

    if as_json:
        import ops.cli.status_json
    else:
        import ops.cli.render  # noqa: F401
    from ops.cli.common import local_metrics

    return local_metrics(addresses)


def _status(args: Sequence[str]) -> int | None:
    """``stockade status [--json] [--control-planes ADDRESSES]``, when a control plane answers
    (:func:`_answer`, during which the view is readied); None otherwise."""
    if "--" in args:
        raise _Refused("--")
    options, _ = _parse(args, _STATUS_OPTIONS)
    from ops.cli.common import control_plane_addresses

    try:
        pb = _protocol()
        addresses = control_plane_addresses(options["control_planes"])
        view = functools.cache(functools.partial(_prepare_status_view, addresses, options["as_json"]))
        answer = _answer(
            addresses,
            _STATUS_ROUTE,
            pb.StatusRequest(),
            pb.StatusReply,
            meanwhile=view,
            hedge_after_s=STATUS_HEDGE_AFTER_S,
        )
        from ops.client.status_results import status_from_pb

        reply = status_from_pb(answer)
    except Exception:
        return None
    import json

    from ops.cli.common import console, ha_db_line, local_ha_db_dir
    from ops.cli.status_json import status_json

    metrics = view()
    if options["as_json"]:
        sys.stdout.write(json.dumps(status_json(reply, metrics), indent=2) + "\n")
        return 0
    from ops.cli.render import render_status

    console().print(render_status(reply, metrics))
    hadb_dir = local_ha_db_dir(addresses)
    if hadb_dir is not None:
        console().print(ha_db_line(hadb_dir), soft_wrap=True)
    return 0


def _submit(args: list[str]) -> int | None:
    """``stockade submit`` of one job, when a control plane stores it (:func:`_answer`); None otherwise,
    with ``args`` given the key sent (``--idempotency-key``) for the Typer command to send again."""
    options, command = _parse(args, _SUBMIT_OPTIONS)
    if options["priority"] is None:
        options["priority"] = 0  # submit's default
    if options["cpu_millis"] is None or options["memory_mb"] is None:
        raise _Refused("--cpu-millis")
    image, sleep_s = options["image"], options["sleep_s"]
    if (image is not None and sleep_s is not None) or (image is None and (sleep_s is None) == (not command)):
        raise _Refused("--image")
    try:
        pb = _protocol()  # before runtime's modules, which import it as it is
        from ops.cli.common import control_plane_addresses, idempotency_key_of

        key = idempotency_key_of(options["idempotency_key"])
    except Exception:
        return None
    if options["idempotency_key"] is None:
        args.insert(args.index("--") if "--" in args else len(args), f"--idempotency-key={key}")
    try:
        from runtime.wire_jobs import job_spec_to_pb

        spec = spec_of_submit_options({**options, "command": command}).check()
        addresses = control_plane_addresses(options["control_planes"])
        request = pb.SubmitJobRequest(spec=job_spec_to_pb(spec), idempotency_key=key)
        job_id = int(_answer(addresses, _SUBMIT_JOB_ROUTE, request, pb.SubmitJobReply).job_id)
    except Exception:
        return None
    sys.stdout.write(f"{job_id}\n")
    return 0


def run(args: list[str]) -> int | None:
    """Carry out ``stockade ARGS`` when it is a hot command this layer reads and the call
    succeeds at once: its exit status; else None, for the Typer app (``args`` may then carry
    what the fast path sent, see :func:`_submit`)."""
    try:
        if args == ["--help"]:
            sys.stdout.write(top_help())
            return 0
        if args == ["--version"]:
            version = _distribution_version("stockade")
            if version is None:
                return None
            sys.stdout.write(f"stockade {version}\n")
            return 0
        if args[:1] == ["status"]:
            return _status(args[1:])
        if args[:1] == ["submit"]:
            tail = args[1:]
            status = _submit(tail)
            args[1:] = tail
            return status
    except _Refused:
        return None
    return None
