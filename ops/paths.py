"""Named paths below a folder, declared one a line: ``cert_dir = PathBelow("root", "certs")``
in place of a property that returns ``self.root / "certs"``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, overload


class PathBelow:
    """A read-only attribute: the path ``name`` below the folder that the instance's attribute
    ``folder`` holds (a :class:`~pathlib.Path`); read on the class, the descriptor itself.

    Args:
        folder: the name of the instance's attribute that holds the folder.
        name: the file or folder below it (may hold ``/``).
    """

    def __init__(self, folder: str, name: str) -> None:
        self._folder = folder
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> PathBelow: ...

    @overload
    def __get__(self, instance: object, owner: type[Any]) -> Path: ...

    def __get__(self, instance: object | None, owner: type[Any]) -> PathBelow | Path:
        if instance is None:
            return self
        folder: Path = getattr(instance, self._folder)
        return folder / self._name
