"""The Stockade image, ``stockade:<version>``, built on this machine without a registry
(:func:`build_image`; stages, sizes and times: docs/containers.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from runtime.errors import PermanentError

if TYPE_CHECKING:
    import docker

__all__ = [
    "BASE_PACKAGES",
    "SOURCE_LABEL",
    "BuildReport",
    "ImageError",
    "ImageRecipe",
    "build_image",
    "image_tag",
    "project_root",
    "source_digest",
]

IMAGE_REPOSITORY = "stockade"
BASE_REPOSITORY = "stockade-base"

BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps", "iproute2")
"""Debian packages added to the minimal base (``ps`` and ``ip`` for an operator looking inside)."""

SOURCE_LABEL = "org.stockade.source"
"""Image label holding :func:`source_digest` of what the image was built from."""

MANAGED_LABEL = "org.stockade.image"
"""Label on every image this module makes (value: ``base`` or ``app``)."""

VENV = "/opt/stockade"
"""Where the image's virtual environment lives; its ``bin`` leads ``PATH``."""

PROJECT_PACKAGES = ("actors", "agent", "ops", "protocol", "runtime")
"""The project's import packages (``[tool.setuptools.packages.find]`` of pyproject.toml)."""

PROJECT_FILES = ("pyproject.toml", "schema.sql", "README.md")
"""Files at the project's root that go into its wheel."""

_TRIMMED = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/log",
)
"""Folders of the base emptied before import."""

DEBOOTSTRAP_TIMEOUT_S = 900.0
PIP_TIMEOUT_S = 900.0


class ImageError(PermanentError):
    """The image could not be built; the message says which stage and what to do."""


@attrs.frozen(kw_only=True)
class ImageRecipe:
    """What the base is made of, and where the build finds its inputs."""

    suite: str = "bookworm"
    """Debian suite given to debootstrap: Debian 12 (its Python 3.11 is the oldest supported)."""
    mirror: str = "http://deb.debian.org/debian"
    """Debian mirror debootstrap downloads from (the host's network, not the build's)."""
    packages: tuple[str, ...] = BASE_PACKAGES
    cache_dir: Path = attrs.field(factory=lambda: _default_cache_dir(), converter=Path)
    """Where the wheelhouse and the build contexts are kept (``$XDG_CACHE_HOME/stockade``)."""

    def base_digest(self) -> str:
        """sha256 (first 16 hex digits) of the suite, variant and packages: the base's tag."""
        recipe = json.dumps({"suite": self.suite, "variant": "minbase", "packages": sorted(self.packages)})
        return hashlib.sha256(recipe.encode()).hexdigest()[:16]

    @property
    def base_tag(self) -> str:
        return f"{BASE_REPOSITORY}:{self.base_digest()}"


@attrs.frozen(kw_only=True)
class BuildReport:
    """What :func:`build_image` did."""

    tag: str
    """``stockade:<version>``."""
    image_id: str
    size_bytes: int
    """The image's size as the engine reports it (all layers, the base's included)."""
    reused: bool
    """True when an image of the same :func:`source_digest` was there and nothing was built."""
    base_built: bool
    seconds: float
    steps: tuple[tuple[str, float], ...]
    """(step, seconds) in the order they ran."""

    @classmethod
    def of(
        cls,
        tag: str,
        image: docker.models.images.Image,
        *,
        base_built: bool,
        seconds: float,
        steps: tuple[tuple[str, float], ...],
    ) -> BuildReport:
        """The report of ``image``; reused when no step ran."""
        return cls(
            tag=tag,
            image_id=image.id,
            size_bytes=int(image.attrs.get("Size", 0)),
            reused=not steps,
            base_built=base_built,
            seconds=seconds,
            steps=steps,
        )


def image_tag() -> str:
    """``stockade:<version>`` of the installed project."""
    return f"{IMAGE_REPOSITORY}:{importlib.metadata.version('stockade')}"


def project_root() -> Path:
    """The project's source folder: the parent of the ``ops`` package, holding pyproject.toml.

    Raises:
        ImageError: Stockade is installed from a wheel, not run from its source tree.
    """
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file() or not (root / "schema.sql").is_file():
        raise ImageError(
            f"the image is built from Stockade's source tree, and {root} is not one (no pyproject.toml "
            "and schema.sql): run `stockade image build` from a clone, installed with `pip install -e .`"
        )
    return root


def source_digest(root: Path, recipe: ImageRecipe) -> str:
    """sha256 (64 hex digits) of everything the image is made of: the base recipe, the files of
    :data:`PROJECT_FILES` and of the packages of :data:`PROJECT_PACKAGES` (not ``__pycache__``),
    paths included."""
    digest = hashlib.sha256()
    digest.update(recipe.base_digest().encode())
    paths = [root / name for name in PROJECT_FILES]
    for package in PROJECT_PACKAGES:
        paths += sorted(
            p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    for path in paths:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_image(
    *,
    recipe: ImageRecipe | None = None,
    client: docker.DockerClient | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> BuildReport:
    """Build ``stockade:<version>`` unless an image of the same sources is there.

    Args:
        recipe: the base recipe and cache folder; the defaults of :class:`ImageRecipe`.
        client: a docker SDK client; None: ``docker.from_env()``.
        progress: called with one line per step as it starts and ends.

    Returns:
        the tag, id, size and timings.

    Raises:
        ImageError: no engine answers, debootstrap is missing or not run as root, a download
            or the build failed (the message carries the tail of the failing step's output).
    """
    recipe = recipe or ImageRecipe()
    try:
        return _build(recipe, client, progress)
    except OSError as exc:
        raise ImageError(f"cannot build the image: {exc}") from exc


def _build(
    recipe: ImageRecipe, client: docker.DockerClient | None, progress: Callable[[str], None]
) -> BuildReport:
    root = project_root()
    started = time.monotonic()
    steps: list[tuple[str, float]] = []
    client = client or engine_client(timeout_s=600, error=ImageError)
    tag = image_tag()
    digest = source_digest(root, recipe)
    existing = _image(client, tag)
    if existing is not None and existing.labels.get(SOURCE_LABEL) == digest:
        progress(f"{tag} is current (sources {digest[:12]}): nothing to build")
        return BuildReport.of(tag, existing, base_built=False, seconds=time.monotonic() - started, steps=())

    with _step(steps, "base", progress):
        base_built = ensure_base(recipe, client, progress)
    python_version, glibc = _base_platform(client, recipe.base_tag)
    with _step(steps, "dependency wheels", progress):
        deps_dir = _dependency_wheels(root, recipe.cache_dir, python_version, glibc, progress)
    with tempfile.TemporaryDirectory(prefix="stockade-image-", dir=_ensure_dir(recipe.cache_dir)) as tmp:
        context = Path(tmp)
        with _step(steps, "project wheel", progress):
            _project_wheel(root, context / "app")
        shutil.copytree(deps_dir, context / "deps")
        (context / "Dockerfile").write_text(_dockerfile(recipe.base_tag))
        with _step(steps, "docker build (network none)", progress):
            image = _docker_build(client, context, tag, labels={SOURCE_LABEL: digest, MANAGED_LABEL: "app"})
    seconds = time.monotonic() - started
    progress(
        f"built {tag} ({image.short_id}, {int(image.attrs.get('Size', 0)) / 1e6:.0f} MB) in {seconds:.1f} s"
    )
    return BuildReport.of(tag, image, base_built=base_built, seconds=seconds, steps=tuple(steps))


def ensure_base(recipe: ImageRecipe, client: docker.DockerClient, progress: Callable[[str], None]) -> bool:
    """Make and import the base image unless the engine holds it; whether it was made.

    Raises:
        ImageError: debootstrap is missing, not run as root, or failed; the import failed.
    """
    if _image(client, recipe.base_tag) is not None:
        progress(f"base {recipe.base_tag} is there")
        return False
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageError(
            "the base image is made with debootstrap, which is not installed: install Debian's "
            "debootstrap package (apt-get install debootstrap)"
        )
    if os.geteuid() != 0:
        raise ImageError(
            "debootstrap makes the base image and must run as root; run `stockade image build` as root"
        )
    with tempfile.TemporaryDirectory(prefix="stockade-base-", dir=_ensure_dir(recipe.cache_dir)) as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = [debootstrap, "--variant=minbase", f"--include={','.join(recipe.packages)}"]
        command += [recipe.suite, str(rootfs), recipe.mirror]
        progress(f"debootstrap {recipe.suite} from {recipe.mirror} (about a minute)")
        _run(command, what="debootstrap", timeout_s=DEBOOTSTRAP_TIMEOUT_S)
        for relative in _TRIMMED:
            folder = rootfs / relative
            if folder.is_dir():
                for child in folder.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        archive = Path(tmp) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".", filter=_numeric_owner)
        shutil.rmtree(rootfs)
        repository, _, tag = recipe.base_tag.partition(":")
        try:
            client.api.import_image_from_file(
                str(archive),
                repository=repository,
                tag=tag,
                changes=[f"LABEL {MANAGED_LABEL}=base", 'CMD ["/bin/bash"]'],
            )
        except Exception as exc:  # docker.errors.APIError and the transport's errors
            raise ImageError(f"the engine refused the base image {recipe.base_tag}: {exc}") from exc
    progress(f"imported base {recipe.base_tag}")
    return True


def _numeric_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Keep ids, drop the host's names for them (the image has its own /etc/passwd)."""
    info.uname = info.gname = ""
    return info


def _base_platform(client: docker.DockerClient, base_tag: str) -> tuple[str, tuple[int, int]]:
    """The base's Python version (``3.11``) and glibc version, asked of a container of it.

    Raises:
        ImageError: the container did not run or printed something else.
    """
    script = (
        "import platform, sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}', platform.libc_ver()[1])"
    )
    try:
        output = client.containers.run(
            base_tag,
            ["python3", "-c", script],
            remove=True,
            network_mode="none",
            labels={MANAGED_LABEL: "probe"},
        )
    except Exception as exc:  # docker.errors.ContainerError, APIError
        raise ImageError(f"cannot run python3 in {base_tag}: {exc}") from exc
    match = re.fullmatch(r"(\d+\.\d+) (\d+)\.(\d+)", output.decode().strip())
    if match is None:
        raise ImageError(f"{base_tag} printed {output!r} for its Python and glibc versions")
    return match[1], (int(match[2]), int(match[3]))


def _dependency_wheels(
    root: Path, cache_dir: Path, python_version: str, glibc: tuple[int, int], progress: Callable[[str], None]
) -> Path:
    """The wheelhouse of the project's dependencies for the base's Python and glibc (made now
    unless the cache holds it).

    Raises:
        ImageError: pip could not download them (the tail of its output says why).
    """
    dependencies = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    arch = platform.machine()
    key = hashlib.sha256(
        json.dumps([sorted(dependencies), python_version, glibc, arch]).encode()
    ).hexdigest()[:16]
    wheelhouse = cache_dir / "wheels" / key
    if (wheelhouse / ".complete").exists():
        progress(f"dependency wheels are cached in {wheelhouse}")
        return wheelhouse
    if wheelhouse.exists():
        shutil.rmtree(wheelhouse)
    wheelhouse.mkdir(parents=True)
    requirements = wheelhouse / "requirements.txt"
    requirements.write_text("\n".join(dependencies) + "\n")
    abi = "cp" + python_version.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    command += ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    command += ["--abi", abi, "--abi", "abi3", "--abi", "none"]
    for minor in range(glibc[1], 4, -1):
        command += ["--platform", f"manylinux_{glibc[0]}_{minor}_{arch}"]
    command += [f"--platform={tag}_{arch}" for tag in ("manylinux2014", "manylinux2010", "manylinux1")]
    command += ["--platform", "any", "--dest", str(wheelhouse), "-r", str(requirements)]
    progress(f"downloading the dependencies' wheels for Python {python_version}, glibc {glibc[0]}.{glibc[1]}")
    _run(command, what="pip download", timeout_s=PIP_TIMEOUT_S)
    requirements.unlink()
    (wheelhouse / ".complete").touch()
    return wheelhouse


def _project_wheel(root: Path, out_dir: Path) -> None:
    """Build the project's wheel (no dependencies) into ``out_dir``, from a copy of exactly the
    files :func:`source_digest` hashed (not a stale ``build/`` folder).

    Raises:
        ImageError: the build failed.
    """
    out_dir.mkdir(parents=True)
    source = out_dir.parent / "source"
    source.mkdir()
    for name in PROJECT_FILES:
        shutil.copy2(root / name, source / name)
    for package in PROJECT_PACKAGES:
        shutil.copytree(root / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps"]
    command += ["--wheel-dir", str(out_dir), str(source)]
    _run(command, what="pip wheel", timeout_s=PIP_TIMEOUT_S)
    shutil.rmtree(source)


def _dockerfile(base_tag: str) -> str:
    """The build: the dependencies' venv in a stage of its own (cached), the project's wheel on top."""
    pip = f"{VENV}/bin/pip install --no-index --no-cache-dir --disable-pip-version-check"
    return (
        f"FROM {base_tag} AS deps\n"
        "COPY deps /tmp/deps\n"
        f"RUN python3 -m venv {VENV} && {pip} /tmp/deps/*.whl\n"
        f"FROM {base_tag}\n"
        f"COPY --from=deps {VENV} {VENV}\n"
        "COPY app /tmp/app\n"
        f"RUN {pip} --no-deps /tmp/app/*.whl && rm -rf /tmp/app\n"
        f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        "ENV PYTHONUNBUFFERED=1\n"
        'CMD ["stockade", "--help"]\n'
    )


def _docker_build(
    client: docker.DockerClient, context: Path, tag: str, *, labels: dict[str, str]
) -> docker.models.images.Image:
    """``docker build`` of ``context`` with no network, tagged ``tag``.

    Raises:
        ImageError: the build failed (the message ends with the build's last lines).
    """
    import docker.errors

    try:
        image, _logs = client.images.build(
            path=str(context), tag=tag, network_mode="none", labels=labels, rm=True, forcerm=True, pull=False
        )
    except docker.errors.BuildError as exc:
        tail = "".join(
            str(chunk.get("stream", chunk.get("error", ""))) for chunk in list(exc.build_log)[-20:]
        )
        raise ImageError(f"docker build of {tag} failed: {exc.msg}\n{tail}") from exc
    except docker.errors.APIError as exc:
        raise ImageError(f"docker build of {tag} failed: {exc}") from exc
    return image


def engine_client(*, timeout_s: float, error: type[Exception]) -> docker.DockerClient:
    """A docker SDK client of the engine ``$DOCKER_HOST`` (or the local socket) names, each call
    waiting up to ``timeout_s`` seconds.

    Raises:
        error: no engine answers.
    """
    import docker

    try:
        client = docker.from_env(timeout=timeout_s)
        client.ping()
    except Exception as exc:  # docker.errors.DockerException, requests' errors, OSError
        raise error(
            f"no Docker engine answers ({type(exc).__name__}: {exc}); start one, or set DOCKER_HOST"
        ) from exc
    return client


def _image(client: docker.DockerClient, tag: str) -> docker.models.images.Image | None:
    import docker.errors

    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def _run(command: list[str], *, what: str, timeout_s: float) -> None:
    """Run ``command``; its output is shown only when it fails.

    Raises:
        ImageError: it failed or ran past ``timeout_s`` (the message has its last 20 lines).
    """
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what} ran past {timeout_s:.0f} s") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise ImageError(f"{what} failed with exit code {result.returncode}:\n{tail}")


@contextlib.contextmanager
def _step(steps: list[tuple[str, float]], name: str, progress: Callable[[str], None]) -> Iterator[None]:
    began = time.monotonic()
    yield
    seconds = time.monotonic() - began
    steps.append((name, seconds))
    progress(f"{name}: {seconds:.1f} s")


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base and os.path.isabs(base) else Path.home() / ".cache") / "stockade"
