"""Regenerate the betterproto2 code in ``protocol/_generated`` from ``protocol/*.proto``.

Run ``python -m protocol.generate`` (``just proto``) after editing a ``.proto`` file,
or ``python -m protocol.generate --check`` to exit 1 when the committed code is stale.
Needs the dev extras (grpcio-tools for ``protoc``, betterproto2-compiler for the plugin).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
GENERATED_DIR = PROTO_DIR / "_generated"
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"


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
    (out_dir / "__init__.py").touch()


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
