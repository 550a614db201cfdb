"""Process commands, run in the foreground until SIGTERM or Ctrl-C: ``cp``, ``agent``, ``fleet``
and ``database``. What they share: options declared once, in tables of :class:`Option` that
:func:`with_options` gives a command, and the check of a process's certificate files."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ops.cli.common import errors, fail
from ops.cli.options import quiet_option
from ops.config import default_state_dir
from runtime.priority import DEFAULT_NICE


class Option:
    """One option declared once: its default, its Typer option (``info``, or one made of
    ``declared``), its type (``kind``; default: the default's), and, for a field of a settings
    group, the group's name and the field's name there (``setting``; default: the option's)."""

    __slots__ = ("default", "group", "info", "kind", "setting")

    def __init__(
        self,
        default: Any,
        info: Any = None,
        *,
        kind: Any = None,
        group: str = "",
        setting: str = "",
        **declared: Any,
    ) -> None:
        self.default, self.kind, self.group, self.setting = default, kind or type(default), group, setting
        self.info = info or typer.Option(**declared)


PROCESS_OPTIONS = {
    "metrics_port": Option(
        0, help="Serve Prometheus metrics on the --host address at PORT/metrics (0: off)."
    ),
    "json_logs": Option(False, help="Log JSON lines instead of console lines."),
    "nice": Option(
        DEFAULT_NICE,
        help="CPU priority (nice, -20..19) this process asks for at start, so other work on the "
        "machine cannot starve its heartbeats; without CAP_SYS_NICE it keeps its own and says so.",
    ),
    "certs_dir": Option(
        None,
        quiet_option(
            "--certs-dir",
            help="Folder with the cluster CA's ca.crt and this process's <id>.crt and <id>.key "
            "(stockade certs issue). [default: the state folder's certs/]",
        ),
        kind=Path | None,
    ),
    "insecure": Option(
        False,
        typer.Option(
            "--insecure",
            help="Serve and call without TLS or identity checks, for development only (anyone who "
            "reaches the port may call it).",
        ),
    ),
}
"""The options every long-running process (``cp``, ``agent``, ``fleet``) takes, last in its
``--help``: how it serves its metrics, logs, runs and proves who it is."""


def settings_rows(group: str, default: Callable[[str], Any]) -> Callable[..., dict[str, Option]]:
    """The row constructor of the options that set fields of settings group ``group``: given a
    field's name, its option's name (``option``; default: the field's) and Typer parameters, the
    one-row table of that option, whose default is ``default(field)``."""

    def row(field: str, *, option: str = "", **declared: Any) -> dict[str, Option]:
        setting = field if option else ""
        return {option or field: Option(default(field), group=group, setting=setting, **declared)}

    return row


Options = dict[str, Any]
"""The values of a command's declared options, by name."""


def settings_fields(declared: dict[str, Option], options: Options, group: str) -> dict[str, Any]:
    """The fields of settings group ``group`` that ``options`` set, named as the group's
    settings class names them."""
    return {o.setting or name: options[name] for name, o in declared.items() if o.group == group}


def with_options(declared: dict[str, Option]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator that gives a command an option per entry of ``declared`` in place of its
    ``options`` parameter, which it is then given whole (:data:`Options`); ``--help`` lists them
    in ``declared``'s order, where that parameter stands."""
    shared = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=o.default,
            annotation=Annotated[o.kind, o.info],  # type: ignore[name-defined]
        )
        for name, o in declared.items()
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(command, eval_str=True).parameters.values()
        ]
        at = [p.name for p in own].index("options")
        parameters = [*own[:at], *shared, *own[at + 1 :]]

        @functools.wraps(command)
        def with_options(**arguments: Any) -> None:
            options = {name: arguments.pop(name) for name in declared}
            command(**arguments, options=options)

        with_options.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        with_options.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_options

    return decorate


def cert_folder(certs_dir: Path | None, insecure: bool) -> Path | None:
    """The certificate folder a process uses; None with --insecure."""
    return None if insecure else (certs_dir or default_state_dir() / "certs").absolute()


def check_tls_files(folder: Path | None, role: str, ids: list[str], what: str) -> None:
    """Warn about --insecure (``folder`` None), or check ``folder``'s files for every id in
    ``ids``: present, the key private, the certificate issued to ``role`` with that id (else
    one line, exit 1, before anything runs)."""
    from ops.certs import NotAStockadeCertificate, describe
    from ops.cli.common import warn_insecure
    from runtime.tls import TlsFiles

    if folder is None:
        warn_insecure(what)
        return
    with errors():
        for id in ids:
            files = TlsFiles.in_dir(folder, id)
            files.check()
            try:
                holder = describe(files.cert_path).identity
            except NotAStockadeCertificate as exc:
                fail(f"{files.cert_path}: {exc}")
            if holder is None or (holder.role, holder.id) != (role, id):
                named = f"{holder.role} {holder.id}" if holder else "no Stockade identity"
                fail(
                    f"{files.cert_path} is the certificate of {named}, not of {role} {id}: a "
                    f"certificate is bound to one id (issue one with `stockade certs issue --role "
                    f"{role} --id {id}`)"
                )
