"""Where a client finds the cluster: the control-plane addresses (:func:`resolve_addresses`), the
client certificate (:func:`resolve_client_tls`) and the local state folder. Imports only the
standard library and :mod:`runtime.errors`: every ``stockade`` call imports it. The order in
which each is looked for: docs/design.md, "Where a client finds the cluster".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from runtime.errors import InvalidArgument, StockadeError

T = TypeVar("T")

STATE_DIR_ENV = "STOCKADE_STATE_DIR"
"""Environment variable that overrides the state folder (default ``./.stockade``)."""

CONTROL_PLANES_ENV = "STOCKADE_CONTROL_PLANES"
"""Environment variable with comma-separated control-plane addresses for client commands."""

CERTS_DIR_ENV = "STOCKADE_CERTS_DIR"
"""Environment variable naming the folder of the client's certificates."""

IDENTITY_ENV = "STOCKADE_IDENTITY"
"""Environment variable naming the client certificate to present (default ``operator``)."""

INSECURE_ENV = "STOCKADE_INSECURE"
"""Environment variable: ``1`` makes client commands speak plaintext (``--insecure`` clusters)."""

DEFAULT_CLIENT_IDENTITY = "operator"

CONFIG_ENV = "STOCKADE_CONFIG"
"""Environment variable naming the user config file (default under the user's config folder)."""

LOCAL_TABLE = "local"
"""The user config's table where ``stockade up`` records the cluster it started."""

CLUSTER_FILE = "cluster.json"
"""The file of a state folder that records its cluster (written by :mod:`ops.cluster`)."""

DEFAULT_TIMEOUT_S = 2.0
"""Deadline of one call to one control plane, in seconds (``stockade``'s; the default of
:attr:`ops.client.settings.ClientSettings.timeout_s`, kept here for the hot commands, which
do not load the settings class)."""


class ClusterError(StockadeError):
    """The local cluster could not be started, found or stopped; the message says what to do."""


class ClusterRequestRefused(ClusterError, InvalidArgument):
    """What was asked of the local cluster is refused as asked (a count out of range, one that
    would split a fleet), before anything is started or changed: ask again otherwise. An
    :class:`~runtime.errors.InvalidArgument` (the field, the rule, the value; exit status 2)."""


def default_state_dir() -> Path:
    """``$STOCKADE_STATE_DIR``, else ``.stockade`` in the current directory (absolute)."""
    return Path(os.environ.get(STATE_DIR_ENV) or ".stockade").absolute()


def user_config_path() -> Path:
    """``$STOCKADE_CONFIG``, else ``$XDG_CONFIG_HOME/stockade/config.toml``, else
    ``~/.config/stockade/config.toml`` (the XDG Base Directory Specification's default)."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser().absolute()
    base = os.environ.get("XDG_CONFIG_HOME")
    # The specification: a relative $XDG_CONFIG_HOME is invalid and must be ignored.
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "stockade" / "config.toml"


ANSWERED_FILE = "answered.json"
"""Beside the user config: for each set of control planes a client command called, the one that
answered last when it was not the first asked (:func:`answered_first`)."""
_ANSWERED_KEPT = 32
"""How many sets of control planes :data:`ANSWERED_FILE` remembers (the newest)."""


def answered_first(addresses: Sequence[str]) -> list[str]:
    """``addresses`` with the one that last answered a client command of this user for that
    same set first, when one is recorded (:func:`record_answered`); else as given. A frozen
    replica accepts connections and never answers: without this, every command asks it first
    and waits out its timeout. Never raises: an unreadable record is no record."""
    ordered = list(addresses)
    try:
        recorded = json.loads((user_config_path().with_name(ANSWERED_FILE)).read_text())
        answered = recorded.get(_answered_key(ordered))
    except (OSError, ValueError, AttributeError, RecursionError):
        return ordered
    if isinstance(answered, str) and answered in ordered:
        ordered.remove(answered)
        ordered.insert(0, answered)
    return ordered


def record_answered(addresses: Sequence[str], answered: str) -> None:
    """Record ``answered`` as the replica of ``addresses`` to ask first next time; nothing is
    written when it is the first already. Never raises: the record only saves time."""
    if not addresses or addresses[0] == answered:
        return
    path = user_config_path().with_name(ANSWERED_FILE)
    try:
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            recorded = {}
        if not isinstance(recorded, dict):
            recorded = {}
        key = _answered_key(list(addresses))
        recorded.pop(key, None)
        recorded[key] = answered
        kept = dict(list(recorded.items())[-_ANSWERED_KEPT:])
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{ANSWERED_FILE}.{os.getpid()}")
        scratch.write_text(json.dumps(kept, indent=1) + "\n")
        os.replace(scratch, path)
    except OSError:
        return


def _answered_key(addresses: list[str]) -> str:
    return ",".join(sorted(addresses))


def parse_addresses(text: str) -> list[str]:
    """``"a:1, b:2"`` -> ``["a:1", "b:2"]`` (empty items dropped, items stripped).

    Raises:
        InvalidArgument: an item is not ``host:port`` (:func:`runtime.identifiers.parse_address`).
    """
    from runtime import identifiers  # attrs and ipaddress: only for commands that take addresses

    addresses = [item.strip() for item in text.split(",") if item.strip()]
    identifiers.parse_addresses(addresses, field="control_planes")
    return addresses


NO_ADDRESS_RULE = "must name at least one host:port, e.g. 127.0.0.1:7100"
"""Why a list of control-plane addresses that names none (``''``, ``',,'``) is refused."""


def named_addresses(text: str, *, field: str = "--control-planes") -> list[str]:
    """:func:`parse_addresses` of a list that must name at least one address.

    Raises:
        InvalidArgument: it names none (:data:`NO_ADDRESS_RULE`, quoting ``text``), or an item
            is not ``host:port``.
    """
    addresses = parse_addresses(text)
    if not addresses:
        raise InvalidArgument(field, text, NO_ADDRESS_RULE)
    return addresses


def read_cluster_file(path: Path, parse: Callable[[Any], T]) -> T | None:
    """``parse`` of the JSON in the cluster file ``path``, or None when there is none.

    Raises:
        ClusterError: it exists but cannot be read, or is not a cluster file (``parse`` raised
            ValueError, KeyError or TypeError).
    """
    try:
        return parse(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClusterError(f"cannot read {path}: {exc.strerror}") from exc
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # UnicodeDecodeError: a ValueError
        raise ClusterError(
            f"{path} is not a Stockade cluster file ({exc}); remove it and run up again"
        ) from exc


def cluster_json_addresses(state_dir: Path) -> list[str] | None:
    """The control-plane addresses recorded in ``state_dir/cluster.json``, or None when it
    records no cluster (read without :mod:`ops.cluster`, which a client does not need).

    Raises:
        ClusterError: cluster.json exists but cannot be read.
    """
    addresses = read_cluster_file(state_dir / CLUSTER_FILE, _control_planes_in)
    return addresses or None


def _control_planes_in(record: Any) -> list[str]:
    """The control-plane addresses a cluster.json (as read) records; KeyError or TypeError
    when it is not one."""
    return [str(p["address"]) for p in record["processes"] if p["kind"] == "cp"]


def _load_user_config(path: Path) -> dict[str, Any]:
    """The user config's contents; empty when there is no file.

    Raises:
        ClusterError: the file cannot be read or is not TOML.
    """
    import tomllib  # here, not at the top: most calls find their cluster without the config

    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ClusterError(f"cannot read the config file {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ClusterError(f"the config file {path} is not valid TOML ({exc}); fix or remove it") from exc


def _config_addresses(path: Path, config: dict[str, Any]) -> list[str] | None:
    """The user config's own ``control_planes``, or None when it names none.

    Raises:
        ClusterError: ``control_planes`` is neither a string nor a list of strings.
        InvalidArgument: an item is not ``host:port``.
    """
    value = config.get("control_planes")
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise ClusterError(f'control_planes in {path} must be a list of "host:port" strings, got {value!r}')
    return parse_addresses(value) or None


def recorded_state_dir(config: dict[str, Any]) -> Path | None:
    """The state folder of the cluster ``stockade up`` recorded in a user config, or None."""
    table = config.get(LOCAL_TABLE)
    state_dir = table.get("state_dir") if isinstance(table, dict) else None
    return Path(state_dir) if isinstance(state_dir, str) and state_dir else None


def recorded_local_cluster() -> Path | None:
    """The state folder the user config's ``[local]`` table names, or None (also when the
    config cannot be read)."""
    try:
        return recorded_state_dir(_load_user_config(user_config_path()))
    except ClusterError:
        return None


def local_state_dirs() -> Iterator[Path]:
    """The state folders a local cluster may be recorded in: :func:`default_state_dir`, then
    (read only if the first does not do) the one the user config's ``[local]`` table names."""
    first = default_state_dir()
    yield first
    recorded = recorded_local_cluster()
    if recorded is not None and recorded != first:
        yield recorded


def local_cluster_record(addresses: Sequence[str]) -> tuple[Path, dict[str, Any]] | None:
    """The state folder and the ``cluster.json`` (as read, a JSON object) of the local cluster
    whose control planes are ``addresses``, looked for in :func:`local_state_dirs`; None when
    none is, or its record cannot be read. Read without the launcher's classes
    (:class:`ops.launcher.state.ClusterConfig`), which a client command need not load."""
    try:
        for folder in local_state_dirs():
            try:
                record = json.loads((folder / CLUSTER_FILE).read_text())
                recorded = _control_planes_in(record)
            except (OSError, ValueError, KeyError, TypeError, RecursionError):
                continue
            if set(recorded) == set(addresses):
                return folder, record
    except StockadeError:  # the user config, which names another folder, is unreadable
        pass
    return None


def resolve_addresses(option: str | None, state_dir: Path | None = None) -> list[str]:
    """Control-plane addresses for a client command, from the first source that names any
    (see the module docstring for the order).

    Args:
        option: the ``--control-planes`` option's value, or None.
        state_dir: the local state folder; None means :func:`default_state_dir`.

    Raises:
        ClusterError: no source names any address, or cluster.json or the config file cannot
            be read.
        InvalidArgument: an address is not ``host:port``, or the option (or a non-empty
            variable) names none (``--control-planes ',,'``).
    """
    sources = (("--control-planes", option), (CONTROL_PLANES_ENV, os.environ.get(CONTROL_PLANES_ENV)))
    for field, text in sources:
        if text is None or (not text and field == CONTROL_PLANES_ENV):
            continue  # an empty variable is an unset one; an empty option was given on purpose
        return named_addresses(text, field=field)
    named = state_dir is not None or bool(os.environ.get(STATE_DIR_ENV))
    state_dir = state_dir or default_state_dir()
    recorded_here = cluster_json_addresses(state_dir)
    if recorded_here:
        return recorded_here
    config_path = user_config_path()
    if not named:
        config = _load_user_config(config_path)
        configured = _config_addresses(config_path, config)
        if configured:
            return configured
        recorded = recorded_state_dir(config)
        if recorded is not None:
            recorded_there = cluster_json_addresses(recorded)
            if recorded_there:
                return recorded_there
            raise ClusterError(
                f"{config_path} names the local cluster in {recorded}, which records none: run "
                f"`stockade up` there, or remove the [{LOCAL_TABLE}] table from {config_path}"
            )
    raise ClusterError(
        f"no control-plane addresses: pass --control-planes host:port,..., set {CONTROL_PLANES_ENV}, "
        f'run `stockade up`, or name them in {config_path} (control_planes = ["host:port", ...]); '
        f"no cluster is recorded in {state_dir}"
    )


def cluster_json_cert_dir(state_dir: Path) -> tuple[bool, Path | None]:
    """Whether ``state_dir/cluster.json`` records a cluster (False also when it cannot be read:
    the address lookup reports that), and the certificate folder it records: None when that
    cluster runs with ``--insecure`` (or was made before clusters had certificates)."""
    try:
        data = json.loads((state_dir / CLUSTER_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return False, None
    if not isinstance(data, dict):
        return False, None
    value = data.get("cert_dir")
    return True, Path(value) if isinstance(value, str) and value else None


def resolve_client_tls(state_dir: Path | None = None, *, identity: str | None = None) -> Any:
    """The client's mutual-TLS files (a :class:`runtime.tls.TlsFiles`, not read here), or None
    for plaintext, from the first source that says (see the module docstring for the order).

    Args:
        state_dir: the local state folder; None means :func:`default_state_dir`.
        identity: the certificate to present (``operator``, ``viewer``); None:
            ``$STOCKADE_IDENTITY``, the config's, else ``operator``.

    Raises:
        ClusterError: the config file cannot be read, or its ``certs_dir``/``identity`` is not
            a string.
    """
    from runtime.tls import TlsFiles

    if os.environ.get(INSECURE_ENV, "").strip().lower() in {"1", "true", "yes"}:
        return None
    named = state_dir is not None or bool(os.environ.get(STATE_DIR_ENV))
    state_dir = state_dir or default_state_dir()
    config_path = user_config_path()
    config = {} if named else _load_user_config(config_path)
    identity = identity or os.environ.get(IDENTITY_ENV) or config.get("identity") or DEFAULT_CLIENT_IDENTITY
    if not isinstance(identity, str):
        raise ClusterError(f"identity in {config_path} must be a string, got {identity!r}")
    if os.environ.get(CERTS_DIR_ENV):
        return TlsFiles.in_dir(Path(os.environ[CERTS_DIR_ENV]), identity)
    found, recorded = cluster_json_cert_dir(state_dir)
    if found:
        return None if recorded is None else TlsFiles.in_dir(recorded, identity)
    if config.get("insecure") is True:
        return None
    certs_dir = config.get("certs_dir")
    if certs_dir is not None:
        if not isinstance(certs_dir, str):
            raise ClusterError(f"certs_dir in {config_path} must be a string, got {certs_dir!r}")
        return TlsFiles.in_dir(Path(certs_dir).expanduser(), identity)
    elsewhere = recorded_state_dir(config)
    if elsewhere is not None:
        found, recorded = cluster_json_cert_dir(elsewhere)
        if found:
            return None if recorded is None else TlsFiles.in_dir(recorded, identity)
    return TlsFiles.in_dir(state_dir / "certs", identity)


# ---------------------------------------------------------------------------- writing


def _without_local_table(text: str) -> str:
    """``text`` without the ``[local]`` table (its header up to the next header), the rest kept
    as written (ending in one newline, or empty)."""
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("["):
            header = stripped.split("#", 1)[0].strip()
            inside = header == f"[{LOCAL_TABLE}]"
            if inside:
                continue
        if not inside:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    text = "".join(kept)
    return text if not text or text.endswith("\n") else text + "\n"


def _write_config(path: Path, text: str, *, records: Path | None) -> None:
    """Replace the config file with ``text`` atomically, if ``text`` is TOML whose ``[local]``
    table names ``records`` (None: no table).

    Raises:
        ClusterError: ``text`` fails that check (the file is left as it was).
        OSError: the file cannot be written.
    """
    try:
        import tomllib

        problem = "" if recorded_state_dir(tomllib.loads(text)) == records else "[local] elsewhere"
    except tomllib.TOMLDecodeError as exc:
        problem = str(exc)
    if problem:
        raise ClusterError(
            f"{path} could not be updated without changing what else it says ({problem}); "
            f"edit its [{LOCAL_TABLE}] table by hand"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def record_local_cluster(state_dir: Path) -> Path:
    """Record ``state_dir`` as the local cluster in the user config's ``[local]`` table, so
    client commands find it from any folder.

    Returns:
        the config file's path.

    Raises:
        ClusterError: the config file cannot be read, is not TOML, or cannot be written.
    """
    path = user_config_path()
    config = _load_user_config(path)
    if recorded_state_dir(config) == state_dir.absolute():
        return path
    try:
        text = path.read_text() if path.exists() else ""
        kept = _without_local_table(text)
        table = (
            f"[{LOCAL_TABLE}]\n"
            "# Written by `stockade up`; `stockade down` there removes it.\n"
            f"state_dir = {json.dumps(str(state_dir.absolute()))}\n"
        )
        _write_config(path, f"{kept}\n{table}" if kept else table, records=state_dir.absolute())
    except OSError as exc:
        raise ClusterError(f"cannot write the config file {path}: {exc.strerror}") from exc
    return path


def forget_local_cluster(state_dir: Path) -> Path | None:
    """Remove the user config's ``[local]`` table when it names ``state_dir`` (and the file,
    when that table was all it held).

    Returns:
        the config file's path when the table was removed, else None.

    Raises:
        ClusterError: the config file cannot be read, is not TOML, or cannot be written.
    """
    path = user_config_path()
    if recorded_state_dir(_load_user_config(path)) != state_dir.absolute():
        return None
    try:
        kept = _without_local_table(path.read_text())
        if kept.strip():
            _write_config(path, kept, records=None)
        else:
            path.unlink()
    except OSError as exc:
        raise ClusterError(f"cannot write the config file {path}: {exc.strerror}") from exc
    return path
