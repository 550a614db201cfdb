"""What every command group shares: exit statuses, the consoles, the one-line error handling,
Ctrl-C handling, and where the local cluster and the control planes are. Its imports stay light:
every ``stockade`` call, ``--help`` included, imports this module, and it does not import Typer
(the shared options are in :mod:`ops.cli.options`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from ops.config import (
    CONTROL_PLANES_ENV,
    ClusterError,
    answered_first,
    default_state_dir,
    local_cluster_record,
    record_answered,
    resolve_addresses,
    resolve_client_tls,
)
from runtime import validation
from runtime.errors import (
    ClusterBusy,
    ConnectionRefused,
    DatabaseRefused,
    DatabaseUnavailable,
    FailedPrecondition,
    IdempotencyConflict,
    InvalidArgument,
    LocalFileError,
    NoControlPlaneReachable,
    NotFound,
    PermissionDenied,
    RemoteError,
    ResourcesUnavailable,
    Unavailable,
)

if TYPE_CHECKING:
    from rich.console import Console

    from ops.client import Client
    from ops.launcher.state import StateDir
    from runtime.tls import TlsFiles

T = TypeVar("T")


EXIT_UNAVAILABLE = 1
"""Exit status when the cluster cannot be reached or the command cannot be carried out."""
EXIT_INVALID = 2
"""Exit status for invalid input (a value out of range, an unknown job)."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention)."""
EXIT_TOO_LATE = 3
"""Exit status of ``stockade cancel`` when the job had ended on its own before the cancel."""

_PIPED_WIDTH = 120
"""Columns of output written to a pipe or file (rich would assume 80) unless $COLUMNS says."""


def _console(*, stderr: bool = False) -> Console:
    """A console that prints what it is given as it is: no markup, highlighting or emoji codes.
    A job named ``a[/]`` or a command ``ls [abc]`` is text (rich would read ``[/]`` as a markup
    tag with nothing to close and fail the command), ``:fire:`` keeps its name (and rich does
    not load its table of 4,000 codes); styles are given as rich's ``Text`` and ``style=``."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    width = _PIPED_WIDTH if piped else None
    return Console(stderr=stderr, markup=False, highlight=False, emoji=False, width=width)


@functools.cache
def console() -> Console:
    """The console of standard output (made on first use: rich is not imported before)."""
    return _console()


@functools.cache
def err_console() -> Console:
    """The console of standard error."""
    return _console(stderr=True)


def fail(message: str, code: int = EXIT_UNAVAILABLE) -> NoReturn:
    """Print ``error: message`` as one line on stderr and exit with ``code``."""
    import typer  # not before: the hot commands' fast path (ops.cli.fast) never fails here

    err_console().print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


def _operational(exc: BaseException) -> bool:
    """Whether ``exc`` is an EmbeddedPostgresError (looked up only where its module is loaded)."""
    kind = getattr(sys.modules.get("ops.launcher.pg"), "EmbeddedPostgresError", None)
    return isinstance(kind, type) and isinstance(exc, kind)


def sole_error(exc: BaseException) -> BaseException:
    """The one error inside nested exception groups of one error each, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _with_notes(message: str, exc: BaseException) -> str:
    """``message`` followed by ``exc``'s notes (``add_note``), as sentences of one line."""
    notes = getattr(exc, "__notes__", ())
    return ". ".join([message.rstrip("."), *notes]) if notes else message


def unreachable_message(exc: NoControlPlaneReachable) -> str:
    """One line for "no control plane answered": where it asked, and what to do (start the
    cluster where every address refused the connection; else how each failed, and the notes)."""
    asked = ", ".join(exc.addresses) or "the given addresses"
    if exc.failures and all(isinstance(f, ConnectionRefused) for f in exc.failures):
        return (
            f"no control plane answered at {asked}: connection refused, nothing listens there "
            "(nothing was sent); start the local cluster with `stockade up`, or name running "
            f"control planes with --control-planes or ${CONTROL_PLANES_ENV}"
        )
    if exc.failures:
        told = f"no control plane answered at {asked}: " + "; ".join(str(f) for f in exc.failures)
    else:
        told = str(exc)
    reason = _client_cert_problem()
    if reason is not None:
        told = f"{told}. Likely why: {reason}"
    return _with_notes(told, exc)


def _client_cert_problem() -> str | None:
    """What is wrong with this client's certificate, if anything (why servers may close)."""
    tls = _client_files()
    if tls is None or isinstance(tls, ClusterError):
        return None
    from ops.certs import diagnose_client_cert

    return diagnose_client_cert(tls.ca_path, tls.cert_path)


def database_message(exc: DatabaseUnavailable) -> str:
    """One line for "the database does not answer", and what to do."""
    cause = exc.__cause__
    detail = (
        f"connection refused: {cause.strerror}"
        if isinstance(cause, ConnectionRefusedError) and cause.strerror
        else str(exc)
    )
    return (
        f"the database does not answer ({detail}); if it is the local cluster's, start it with "
        "`stockade up`; else check the URL (--database-url, $DATABASE_URL) and that the server runs"
    )


@contextlib.contextmanager
def errors() -> Iterator[None]:
    """Turn Stockade's errors (also one alone in trio's exception groups) into one line on
    stderr and exit status :data:`EXIT_INVALID` for invalid input, else :data:`EXIT_UNAVAILABLE`;
    anything unexpected propagates."""
    try:
        yield
    except Exception as raised:
        exc = sole_error(raised)
        if isinstance(exc, InvalidArgument | NotFound | IdempotencyConflict):
            fail(_with_notes(str(exc), exc), EXIT_INVALID)
        if isinstance(exc, ClusterBusy):
            from ops.client.settings import DEFAULT_BUSY_RETRY_S

            fail(
                f"the cluster is too busy to take this now: every control plane answered 'busy' "
                f"for {DEFAULT_BUSY_RETRY_S:g} s (what they refused was not stored); try again later. "
                f"Details: {exc}",
                EXIT_UNAVAILABLE,
            )
        if isinstance(exc, NoControlPlaneReachable):
            fail(unreachable_message(exc), EXIT_UNAVAILABLE)
        if isinstance(exc, DatabaseUnavailable):
            fail(database_message(exc), EXIT_UNAVAILABLE)
        if isinstance(exc, PermissionDenied):
            fail(
                f"{exc} (this client presents the certificate {_identity_hint()}; "
                "set STOCKADE_IDENTITY or the config's identity to use another)",
                EXIT_UNAVAILABLE,
            )
        if isinstance(exc, DatabaseRefused | LocalFileError | FailedPrecondition | ResourcesUnavailable):
            fail(_with_notes(str(exc), exc), EXIT_UNAVAILABLE)
        if isinstance(exc, Unavailable | RemoteError | ClusterError) or _operational(exc):
            fail(_with_notes(str(exc), exc), EXIT_UNAVAILABLE)
        raise


def interrupted(exc: BaseException) -> bool:
    """True when ``exc`` is a KeyboardInterrupt, also inside trio's exception groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and any(interrupted(e) for e in exc.exceptions)


@contextlib.contextmanager
def interruptible(message: Callable[[], str] | None = None) -> Iterator[None]:
    """For commands that start processes of their own: SIGTERM acts as Ctrl-C (turned into
    SIGINT, so their clean-up runs), and either ends with one line, ``interrupted: `` and
    ``message()``, and exit status 130. A SIGINT ignored (a shell's background job) gets
    Python's handler back for the block, or SIGTERM would stop nothing."""
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        yield
    except BaseException as exc:
        if not interrupted(exc):
            raise
        import typer

        said = _said_safely(message)
        err_console().print(f"interrupted: {said}", markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _said_safely(message: Callable[[], str] | None) -> str:
    """``message()``, or, whatever it raises (a second Ctrl-C included), a line that says it
    could not tell."""
    if message is None:
        return "what this command started has been stopped"
    try:
        return message()
    except BaseException as exc:  # the line is all that is left to print
        reason = "interrupted again" if interrupted(exc) else f"{type(exc).__name__}: {exc}"
        return f"could not tell what still runs ({reason})"


def local_state() -> StateDir:
    """The local cluster's state folder (``./.stockade`` or ``$STOCKADE_STATE_DIR``)."""
    from ops.launcher.state import StateDir  # not ops.cluster: it loads the launcher, and the agent

    return StateDir(default_state_dir())


def recorded_local_state() -> StateDir:
    """The state folder of the local cluster client commands would call: ``./.stockade`` (or
    ``$STOCKADE_STATE_DIR``) when it records a cluster, else the one the user config names,
    else ``./.stockade``."""
    from ops.config import local_state_dirs
    from ops.launcher.state import StateDir

    for folder in local_state_dirs():
        if StateDir(folder).config_path.exists():
            return StateDir(folder)
    return StateDir(default_state_dir())


def _identity_hint() -> str:
    tls = _client_files()
    if isinstance(tls, ClusterError):
        return "of an unreadable config"
    return "of no one (plaintext)" if tls is None else str(tls.cert_path)


def _client_files() -> TlsFiles | ClusterError | None:
    """The client's certificate files, None for plaintext, or the error that kept them hidden."""
    try:
        files: TlsFiles | None = resolve_client_tls()
    except ClusterError as exc:
        return exc
    return files


def warn_insecure(what: str) -> None:
    """Say on stderr, at start, that ``what`` runs without TLS (``--insecure``)."""
    err_console().print(
        f"WARNING: {what} runs with --insecure: plaintext gRPC, no certificates and no identity "
        "checks; anyone who can reach its ports can submit jobs, pose as a worker or send "
        "assignments. For development only.",
        markup=False,
        soft_wrap=True,
    )


client_tls = resolve_client_tls
"""The client certificate files a client command presents, or None for plaintext."""


def control_plane_addresses(option: str | None) -> list[str]:
    """The control planes a client command calls: the option, else where :mod:`ops.config`
    says; the one that answered this user's last command first (:func:`ops.config.answered_first`).

    Raises:
        ClusterError, InvalidArgument: as :func:`ops.config.resolve_addresses`.
    """
    return answered_first(resolve_addresses(option))


def with_client(addresses: list[str], body: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``await body(client)`` in a fresh trio run, ``client`` an :class:`ops.client.Client`
    of ``addresses`` presenting this command's certificate; raises what ``body`` raises."""
    import trio

    from ops.client import Client, ClientSettings

    settings = ClientSettings(control_planes=addresses, tls=client_tls())

    async def main() -> T:
        async with Client.open(settings) as client:
            try:
                return await body(client)
            finally:
                record_answered(addresses, client.last_answered)

    return trio.run(main)


def shown_path(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def local_metrics(addresses: list[str]) -> dict[str, str]:
    """Process or worker id (a fleet's: the fleet's) -> ``host:port`` of its Prometheus metrics,
    for the local cluster whose control planes are ``addresses``; else empty.

    Read from the cluster's record as :meth:`ops.launcher.state.ClusterConfig.metrics_addresses`
    and its workers give it (tests/unit/test_cli_config.py holds the two to the same answer),
    without loading those classes: ``stockade status`` calls this."""
    local = local_cluster_record(addresses)
    if local is None:
        return {}
    record = local[1]
    try:
        found = {
            str(p["id"]): str(p["metrics_address"]) for p in record["processes"] if p.get("metrics_address")
        }
        for worker in record.get("hosted_workers", ()):  # an agent process's worker has its id
            if worker["process_id"] in found:
                found.setdefault(str(worker["id"]), found[worker["process_id"]])
    except (KeyError, TypeError, AttributeError):  # a record this release did not write
        return {}
    return found


def local_ha_db_dir(addresses: list[str]) -> Path | None:
    """The ``hadb/`` folder of the local cluster whose control planes are ``addresses``, when it
    runs with ``--ha-db``; else None."""
    local = local_cluster_record(addresses)
    if local is None or local[1].get("ha_db") is not True:
        return None
    from ops.launcher.state import StateDir

    return StateDir(local[0]).hadb_dir


def ha_db_line(hadb_dir: Path) -> str:
    """One line on the local cluster's HA PostgreSQL: each member's role, state and port."""
    from ops.launcher.hadb import HaPostgres
    from ops.launcher.hadb_members import HaDatabaseError

    try:
        members = HaPostgres(hadb_dir).members()
    except HaDatabaseError as exc:
        return f"database  HA PostgreSQL: no member answers ({exc})"
    names = {"leader": "primary", "sync_standby": "sync standby"}
    return "database  HA PostgreSQL: " + ", ".join(
        f"{m.name} {names.get(m.role, m.role)} {m.state} on 127.0.0.1:{m.port}" for m in members
    )


def idempotency_key_of(option: str | None) -> str:
    """The key a mutating command sends: the one given, checked (InvalidArgument), or a fresh one."""
    from runtime.idempotency_keys import new_idempotency_key

    return new_idempotency_key() if option is None else validation.check_idempotency_key(option)


@contextlib.contextmanager
def answer_unknown(key: str, what: str) -> Iterator[None]:
    """When a mutating call ends without an answer, add how to learn what became of it."""
    try:
        yield
    except Unavailable as exc:
        exc.add_note(
            f"If a control plane {what} before it failed to answer, the same command with "
            f"--idempotency-key {key} returns that answer instead of doing it twice."
        )
        raise


def batch_keys(key: str, batches: int) -> list[str]:
    """The idempotency key of each batch of one submission: ``key`` for one batch, else
    ``key/1``, ``key/2``, ... (InvalidArgument where one is too long)."""
    if batches == 1:
        return [key]
    return [validation.check_idempotency_key(f"{key}/{n}") for n in range(1, batches + 1)]
