"""What a cluster in containers (:mod:`ops.launcher.docker`) takes from the Docker engine: its
labels, its image (:func:`image_id`) and its network (:func:`cluster_network`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.launcher.state import ClusterError, DockerSpec

if TYPE_CHECKING:
    import docker

__all__ = ["CLUSTER_LABEL", "PROCESS_LABEL", "SUBNET_POOL", "cluster_network", "image_id", "in_parallel"]

CLUSTER_LABEL = "org.stockade.cluster"
"""Label on the network and every container of a cluster: its state folder's absolute path."""
PROCESS_LABEL = "org.stockade.process"
"""Label on each container: the process it runs (``pg``, ``cp-N``, ``w-N``)."""

SUBNET_POOL = ipaddress.ip_network("172.29.0.0/16")


def image_id(client: docker.DockerClient, image: str | None, running: str | None) -> str:
    """The id of the image to run: ``running`` (a running cluster's, so that containers made
    again run the same build), else what ``image`` or ``stockade:<version>`` names now.

    Raises:
        ClusterError: the engine does not hold it (images are never pulled), or the default
            tag was built from other sources than this source tree's.
    """
    import docker.errors

    from ops.image import SOURCE_LABEL, ImageError, ImageRecipe, image_tag, project_root, source_digest

    if running is not None:
        with contextlib.suppress(docker.errors.ImageNotFound):
            return str(client.images.get(running).id)
    tag = image or image_tag()
    try:
        found = client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise ClusterError(
            f"the Docker engine has no image {tag}: build it with `stockade image build` (or `just image`)"
        ) from None
    if image is None:
        try:
            digest = source_digest(project_root(), ImageRecipe())
        except ImageError:
            digest = None  # installed from a wheel: nothing to compare with
        if digest is not None and found.labels.get(SOURCE_LABEL) != digest:
            raise ClusterError(
                f"{tag} was built from other sources than {project_root()}'s (another checkout, or "
                "before a change): build it again with `stockade image build` (or `just image`)"
            )
    return str(found.id)


def cluster_network(client: docker.DockerClient, root: Path, recorded: DockerSpec | None) -> Any:
    """The network of the cluster of state folder ``root``: the one it has, else a new one on a
    free /24 of :data:`SUBNET_POOL` (ClusterError where none is left)."""
    import docker.errors

    existing = client.networks.list(filters={"label": f"{CLUSTER_LABEL}={root}"})
    if existing:
        network = existing[0]
        network.reload()
        return network
    name = recorded.network if recorded is not None else DockerSpec.prefix_for(root)
    taken = _subnets_in_use(client)
    candidates: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = list(SUBNET_POOL.subnets(new_prefix=24))
    start = int(DockerSpec.prefix_for(root)[-8:], 16) % len(candidates)
    if recorded is not None:
        candidates.insert(0, ipaddress.ip_network(recorded.subnet))
        start = 0
    for subnet in [*candidates[start:], *candidates[:start]]:
        if any(subnet.overlaps(other) for other in taken):
            continue
        import docker.types

        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet))])
        try:
            return client.networks.create(name, driver="bridge", ipam=ipam, labels={CLUSTER_LABEL: str(root)})
        except docker.errors.APIError as exc:
            if "overlap" in str(exc).lower():
                continue
            raise ClusterError(f"cannot create the Docker network {name}: {exc}") from exc
    raise ClusterError(f"no free /24 subnet left in {SUBNET_POOL} for the cluster's Docker network")


def in_parallel(action: Callable[[Any], object], items: Sequence[Any]) -> None:
    """``action`` on each item from a few threads (each docker call waits for the engine)."""
    if not items:
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()


def _subnets_in_use(client: docker.DockerClient) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    taken = []
    for network in client.networks.list():
        for pool in (network.attrs.get("IPAM") or {}).get("Config") or []:
            with contextlib.suppress(KeyError, ValueError):
                taken.append(ipaddress.ip_network(pool["Subnet"]))
    return taken
