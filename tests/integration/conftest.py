"""Fixtures of the integration tests that need a Docker engine and a job image."""

from __future__ import annotations

from collections.abc import Iterator

import container_images
import pytest


@pytest.fixture(scope="session")
def container_session() -> str:
    """This test session's id, in the names and labels of what the container tests make."""
    return container_images.new_session()


@pytest.fixture(scope="session")
def job_image(container_session: str) -> Iterator[str]:
    """The tag of a small image for container jobs, built for the session without network and
    removed after it; skips, saying why, where no engine answers or no base image is there."""
    reason = container_images.engine_error()
    if reason is not None:
        pytest.skip(reason)
    tag, why = container_images.build_job_image(container_session)
    if tag is None:
        pytest.skip(why)
    try:
        yield tag
    finally:
        container_images.remove_image(tag)


@pytest.fixture
def container_worker(container_session: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A worker id of this test alone; every container labelled with it is removed after."""
    worker_id = f"crt-{container_session}-{abs(hash(request.node.nodeid)) % 10**8}"
    try:
        yield worker_id
    finally:
        container_images.remove_containers(worker_id)
