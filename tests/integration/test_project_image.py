"""The project's image, ``stockade:<version>``, as :func:`ops.image.build_image` makes it;
skipped, saying why, where no Docker engine answers or the image cannot be built."""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from pgcontainer import OWNER_LABEL, owner

from ops.image import SOURCE_LABEL, ImageRecipe, build_image, project_root, source_digest

SCHEMA_PATH = Path(__file__).parents[2] / "schema.sql"
REUSE_LIMIT_S = 5.0


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    client = docker.from_env(timeout=120)
    try:
        yield client
    finally:
        client.close()


def _run(client: docker.DockerClient, image: str, command: list[str]) -> str:
    """``command``'s output in a throwaway container of ``image`` with no network at all."""
    output: bytes = client.containers.run(
        image, command, network_mode="none", remove=True, labels={OWNER_LABEL: owner()}
    )
    return output.decode()


def test_stockade_runs_in_the_image_without_network(stockade_image: str, client: docker.DockerClient) -> None:
    """``stockade --version`` in a container with network none prints the project's version."""
    output = _run(client, stockade_image, ["stockade", "--version"])
    assert output == f"stockade {importlib.metadata.version('stockade')}\n"


def test_the_image_holds_the_schema(stockade_image: str, client: docker.DockerClient) -> None:
    """schema.sql is installed at /opt/stockade/share/stockade/schema.sql, as in the source tree."""
    output = _run(client, stockade_image, ["cat", "/opt/stockade/share/stockade/schema.sql"])
    assert output == SCHEMA_PATH.read_text()


def test_the_image_carries_its_sources_digest(stockade_image: str, client: docker.DockerClient) -> None:
    """The image's source label is the digest of the sources it was built from (these ones)."""
    image = client.images.get(stockade_image)
    assert image.labels[SOURCE_LABEL] == source_digest(project_root(), ImageRecipe())


def test_a_second_build_with_nothing_changed_is_reused_at_once(stockade_image: str) -> None:
    """Building again with the same sources builds nothing and returns within a few seconds."""
    began = time.monotonic()
    report = build_image()
    elapsed = time.monotonic() - began
    assert report.reused
    assert report.tag == stockade_image
    assert elapsed < REUSE_LIMIT_S, f"a current image took {elapsed:.1f} s to be found"
