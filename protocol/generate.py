"""Regenerate the betterproto2 code in ``protocol/_generated`` from ``protocol/*.proto``.

Run ``python -m protocol.generate`` (``just proto``) after editing a ``.proto`` file,
or ``python -m protocol.generate --check`` to exit 1 when the committed code is stale.
Needs the dev extras (grpcio-tools for ``protoc``, betterproto2-compiler for the plugin).

The plugin writes each package as one module; the service bases a server subclasses are moved
from it into ``bases.py`` beside it (:func:`split_service_bases`), so that a client, which imports
the messages and the stubs, never imports grpclib's server side; and its messages are made
dataclasses on first use (:func:`defer_dataclasses`), so that a client pays only for those it uses.
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
GENERATED_DIR = PROTO_DIR / "_generated"
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"
BASES_MODULE = "bases.py"
"""The module, beside each generated package's ``__init__.py``, that holds its service bases."""

_PACKAGE_IMPORT = "from betterproto2 import grpclib as betterproto2_grpclib\n"
_STUB_IMPORT = "from betterproto2.grpclib.grpclib_client import ServiceStub\n"
_FIRST_BASE = re.compile(r"^class \w+\(betterproto2_grpclib\.ServiceBase\):$", re.MULTILINE)
_DATACLASS_IMPORT = "from dataclasses import dataclass\n"
_TYPE_CHECKING_BLOCK = re.compile(r"^if TYPE_CHECKING:\n(?:    .*\n)+", re.MULTILINE)


def generate(out_dir: Path) -> None:
    """Run protoc with the betterproto2 plugin, writing the package tree into ``out_dir``.

    The plugin formats its output with ruff, which reads the nearest ruff configuration, so
    ``out_dir`` should be outside the repository (a temporary directory) for the output to
    be the same everywhere; :func:`main` generates there and copies.

    Raises:
        subprocess.CalledProcessError: protoc or the plugin failed.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    protos = sorted(str(p.name) for p in PROTO_DIR.glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_betterproto2_out={PLUGIN_OPTIONS}:{out_dir}",
            *protos,
        ],
        check=True,
        env=env,
        cwd=PROTO_DIR,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for module in sorted(out_dir.rglob("__init__.py")):
        split_service_bases(module)
        defer_dataclasses(module)
    (out_dir / "__init__.py").touch()


def split_service_bases(module: Path) -> None:
    """Move the service bases (``class XBase(betterproto2_grpclib.ServiceBase)``, which the plugin
    writes last) out of the generated ``module`` into :data:`BASES_MODULE` beside it.

    What stays (messages, enums, stubs) takes ``ServiceStub`` from betterproto2's client module
    rather than its ``grpclib`` package, whose ``__init__`` imports the server side too;
    :mod:`protocol` imports that client module on its own first. The bases module imports the
    messages its bases name from ``module``. A module without bases is left as it is.
    """
    text = module.read_text()
    first = _FIRST_BASE.search(text)
    if first is None:
        return
    head, bases = text[: first.start()].rstrip() + "\n", text[first.start() :]
    names = re.findall(r"^class (\w+)\(", bases, re.MULTILINE)
    exported = re.search(r"^__all__ = \((.*?)^\)", head, re.MULTILINE | re.DOTALL)
    if exported is None or head.count(_PACKAGE_IMPORT) != 1:
        raise ValueError(f"{module}: not the layout protocol/generate.py splits")
    messages = [n for n in re.findall(r'"(\w+)"', exported.group(1)) if n not in names]
    head = head.replace(_PACKAGE_IMPORT, _STUB_IMPORT)
    head = head.replace("(betterproto2_grpclib.ServiceStub)", "(ServiceStub)")
    head = head.replace(exported.group(1), "".join(f'    "{n}",\n' for n in messages))
    banner = text[: text.index("__all__")]
    used = [n for n in messages if re.search(rf"\b{n}\b", bases)]
    module.write_text(head)
    (module.parent / BASES_MODULE).write_text(
        banner
        + "__all__ = ("
        + "".join(f'\n    "{n}",' for n in names)
        + "\n)\n\n"
        + "from collections.abc import AsyncIterator\n"
        + "from typing import TYPE_CHECKING\n\n"
        + "import grpclib\n"
        + "from betterproto2.grpclib.grpclib_server import ServiceBase\n\n"
        + "from . import (\n"
        + "".join(f"    {n},\n" for n in used)
        + ")\n\n"
        + "if TYPE_CHECKING:\n"
        + "    import grpclib.server\n\n\n"
        + bases.replace("(betterproto2_grpclib.ServiceBase)", "(ServiceBase)")
    )


def defer_dataclasses(module: Path) -> None:
    """Make the generated ``module`` take its ``dataclass`` decorator from
    :mod:`protocol.deferred` at run time (type checkers still see the standard one), so each
    message becomes a dataclass when it is first used. A module without dataclasses, or one
    deferred already, is left as it is.

    Raises:
        ValueError: the module imports the decorator but has no ``if TYPE_CHECKING:`` block of
            imports to put the standard one in.
    """
    text = module.read_text()
    if _DATACLASS_IMPORT not in text or "from protocol.deferred import dataclass" in text:
        return
    block = _TYPE_CHECKING_BLOCK.search(text)
    if block is None:
        raise ValueError(f"{module}: not the layout protocol/generate.py defers")
    checked = (
        block.group(0)
        + f"    {_DATACLASS_IMPORT}"
        + "else:  # each message becomes a dataclass on first use: protocol/deferred.py\n"
        + "    from protocol.deferred import dataclass\n"
    )
    text = text[: block.start()] + checked + text[block.end() :]
    module.write_text(text.replace(_DATACLASS_IMPORT, "", 1))


def _tree(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


def is_stale() -> list[str]:
    """Return the generated files that differ from a fresh generation (empty when current)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        new, old = _tree(fresh), _tree(GENERATED_DIR)
        differ = sorted(set(new) ^ set(old))
        differ += [k for k in sorted(set(new) & set(old)) if not filecmp.cmp(new[k], old[k], shallow=False)]
        return differ


def main() -> int:
    if "--check" in sys.argv[1:]:
        stale = is_stale()
        if stale:
            print("generated protocol code is stale, run `just proto`:", ", ".join(stale))
            return 1
        print("generated protocol code is current")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        shutil.rmtree(GENERATED_DIR, ignore_errors=True)
        shutil.copytree(tmp, GENERATED_DIR)
    GENERATED_DIR.chmod(0o755)
    print(f"wrote {GENERATED_DIR.relative_to(PROTO_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
