"""``stockade image``: the Stockade image, built on this machine without a registry
(:mod:`ops.image`); a build that cannot be done is one line and exit 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import attrs
import typer

from ops.cli.base import command_group
from ops.cli.common import EXIT_UNAVAILABLE, fail

image_app = command_group(
    "image",
    "The Stockade image (PostgreSQL, control planes and agents), built offline.",
)


@image_app.command("build")
def image_build(
    suite: Annotated[str, typer.Option(help="Debian suite of the base (debootstrap).")] = "bookworm",
    mirror: Annotated[
        str, typer.Option(help="Debian mirror debootstrap downloads from (on the host).")
    ] = "http://deb.debian.org/debian",
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="Wheelhouse and build folder (default: $XDG_CACHE_HOME/stockade, else ~/.cache/stockade)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build report as JSON.")] = False,
) -> None:
    """Build stockade:<version> (debootstrap base, wheels built on the host, docker build with no
    network). Returns at once when an image of the same sources is there."""
    from ops.image import ImageError, ImageRecipe, build_image

    recipe = ImageRecipe(suite=suite, mirror=mirror)
    if cache_dir is not None:
        recipe = attrs.evolve(recipe, cache_dir=cache_dir)
    try:
        report = build_image(recipe=recipe, progress=(lambda line: None) if as_json else print)
    except ImageError as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    if as_json:
        print(
            json.dumps(
                {
                    "tag": report.tag,
                    "image_id": report.image_id,
                    "size_bytes": report.size_bytes,
                    "reused": report.reused,
                    "base_built": report.base_built,
                    "seconds": round(report.seconds, 3),
                    "steps": [{"step": name, "seconds": round(s, 3)} for name, s in report.steps],
                },
                indent=2,
            )
        )
    elif report.reused:
        print(
            f"{report.tag}: {report.image_id[7:19]}, {report.size_bytes / 1e6:.0f} MB, "
            f"checked in {report.seconds:.2f} s"
        )
