"""The image builder's pure parts (:mod:`ops.image`): what the content address covers, the
network-free Dockerfile, the base recipe's digest, and the error outside a source tree."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import ops.image
from ops.image import (
    BASE_PACKAGES,
    PROJECT_FILES,
    SOURCE_LABEL,
    ImageError,
    ImageRecipe,
    build_image,
    image_tag,
    project_root,
    source_digest,
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small source tree: the root files and one module in one of the project's packages."""
    for name in PROJECT_FILES:
        (tmp_path / name).write_text(f"{name}\n")
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "clock.py").write_text("NOW = 0\n")
    return tmp_path


def test_source_digest_changes_when_a_package_file_changes(tree: Path, tmp_path: Path) -> None:
    """Editing a module of a package gives another digest."""
    recipe = ImageRecipe(cache_dir=tmp_path / "cache")
    before = source_digest(tree, recipe)
    (tree / "runtime" / "clock.py").write_text("NOW = 1\n")
    assert source_digest(tree, recipe) != before


def test_source_digest_changes_when_a_file_is_added_or_a_root_file_changes(
    tree: Path, tmp_path: Path
) -> None:
    """A new module, or a changed pyproject.toml or schema.sql, gives another digest."""
    recipe = ImageRecipe(cache_dir=tmp_path / "cache")
    digests = {source_digest(tree, recipe)}
    (tree / "agent").mkdir()
    (tree / "agent" / "new.py").write_text("")
    digests.add(source_digest(tree, recipe))
    (tree / "pyproject.toml").write_text("[project]\n")
    digests.add(source_digest(tree, recipe))
    (tree / "schema.sql").write_text("CREATE TABLE t ();\n")
    digests.add(source_digest(tree, recipe))
    assert len(digests) == 4


def test_source_digest_ignores_pycache_and_files_outside_the_packages(tree: Path, tmp_path: Path) -> None:
    """Byte-compiled files and folders that are not the project's packages (tests/, docs/, a
    build/ left by setuptools) leave the digest as it was."""
    recipe = ImageRecipe(cache_dir=tmp_path / "cache")
    before = source_digest(tree, recipe)
    (tree / "runtime" / "__pycache__").mkdir()
    (tree / "runtime" / "__pycache__" / "clock.cpython-311.pyc").write_bytes(b"\x00compiled")
    for folder in ("tests", "docs", "build"):
        (tree / folder).mkdir()
        (tree / folder / "x.py").write_text("x = 1\n")
    assert source_digest(tree, recipe) == before


def test_source_digest_depends_on_the_base_recipe(tree: Path, tmp_path: Path) -> None:
    """The same sources on another base get another digest (the base is part of the image)."""
    plain = ImageRecipe(cache_dir=tmp_path / "cache")
    more = ImageRecipe(cache_dir=tmp_path / "cache", packages=(*BASE_PACKAGES, "strace"))
    assert source_digest(tree, plain) != source_digest(tree, more)


def test_source_digest_is_64_hex_digits_and_repeatable(tree: Path, tmp_path: Path) -> None:
    """The digest is a sha256 in hex, the same for the same tree."""
    recipe = ImageRecipe(cache_dir=tmp_path / "cache")
    digest = source_digest(tree, recipe)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert source_digest(tree, recipe) == digest


def test_base_digest_depends_on_the_packages_not_their_order() -> None:
    """Another package list or suite makes another base; the same packages in another order do not."""
    plain = ImageRecipe()
    assert ImageRecipe(packages=(*BASE_PACKAGES, "strace")).base_digest() != plain.base_digest()
    assert ImageRecipe(packages=BASE_PACKAGES[1:]).base_digest() != plain.base_digest()
    assert ImageRecipe(suite="trixie").base_digest() != plain.base_digest()
    assert ImageRecipe(packages=tuple(reversed(BASE_PACKAGES))).base_digest() == plain.base_digest()
    assert re.fullmatch(r"stockade-base:[0-9a-f]{16}", plain.base_tag)


def test_base_digest_ignores_the_mirror_and_the_cache_folder(tmp_path: Path) -> None:
    """Where the packages come from and where the build keeps its files do not change the base."""
    assert (
        ImageRecipe(mirror="http://mirror.example/debian", cache_dir=tmp_path).base_digest()
        == ImageRecipe().base_digest()
    )


def test_dockerfile_builds_without_network() -> None:
    """Every step of the Dockerfile works offline: FROM only the local base, COPY from the
    context, pip only from the copied wheels (--no-index), no downloader or package manager."""
    base = ImageRecipe().base_tag
    text = ops.image._dockerfile(base)
    steps = [line.split(" ", 1) for line in text.splitlines() if line.strip()]
    assert {instruction for instruction, _ in steps} <= {"FROM", "COPY", "RUN", "ENV", "CMD"}
    assert [rest.split()[0] for instruction, rest in steps if instruction == "FROM"] == [base, base]
    runs = [rest for instruction, rest in steps if instruction == "RUN"]
    assert runs
    for run in runs:
        assert not re.search(r"\b(apt-get|apt|curl|wget|git|pip download)\b", run), run
        for install in re.findall(r"pip install[^&]*", run):
            assert "--no-index" in install, run
    assert "ENV PATH=/opt/stockade/bin:" in text


def test_project_root_is_the_source_tree_holding_the_ops_package() -> None:
    """From a clone, the root is the folder above ``ops`` and holds pyproject.toml and schema.sql."""
    root = project_root()
    assert root == Path(ops.image.__file__).resolve().parents[1]
    assert (root / "pyproject.toml").is_file()
    assert (root / "schema.sql").is_file()


def test_project_root_outside_a_source_tree_says_to_build_from_a_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed from a wheel (no pyproject.toml beside the packages), the error names the folder
    and says to build from a clone installed with ``pip install -e .``."""
    (tmp_path / "ops").mkdir()
    monkeypatch.setattr(ops.image, "__file__", str(tmp_path / "ops" / "image.py"))
    with pytest.raises(ImageError) as raised:
        project_root()
    message = str(raised.value)
    assert str(tmp_path) in message
    assert "no pyproject.toml and schema.sql" in message
    assert "pip install -e ." in message


class _Image:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.id = "sha256:" + "ab" * 32
        self.attrs = {"Size": 123}


class _Images:
    def __init__(self, images: dict[str, _Image]) -> None:
        self.images = images

    def get(self, tag: str) -> _Image:
        import docker.errors

        if tag not in self.images:
            raise docker.errors.ImageNotFound(tag)
        return self.images[tag]


class _Client:
    def __init__(self, images: dict[str, _Image]) -> None:
        self.images = _Images(images)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a current image needs no {name} of the engine")


def test_build_image_reuses_an_image_of_the_same_sources(tmp_path: Path) -> None:
    """An image tagged stockade:<version> whose source label matches is returned as it is:
    nothing is built and no other call reaches the engine."""
    recipe = ImageRecipe(cache_dir=tmp_path / "cache")
    digest = source_digest(project_root(), recipe)
    client = _Client({image_tag(): _Image({SOURCE_LABEL: digest})})
    lines: list[str] = []
    report = build_image(recipe=recipe, client=client, progress=lines.append)  # type: ignore[arg-type]
    assert report.reused
    assert not report.base_built
    assert report.steps == ()
    assert report.tag == image_tag()
    assert any("is current" in line for line in lines)
    assert not (tmp_path / "cache").exists()


def test_build_image_of_changed_sources_needs_debootstrap_for_a_missing_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale image and no base: the build goes on to make the base, and without debootstrap
    it stops saying to install Debian's package."""
    recipe = ImageRecipe(cache_dir=tmp_path / "cache")
    client = _Client({image_tag(): _Image({SOURCE_LABEL: "0" * 64})})
    monkeypatch.setattr(ops.image.shutil, "which", lambda name: None)
    with pytest.raises(ImageError, match=r"apt-get install debootstrap"):
        build_image(recipe=recipe, client=client)  # type: ignore[arg-type]
