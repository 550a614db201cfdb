"""A job file's text as a document: TOML (:func:`toml_document`) or YAML and JSON
(:func:`yaml_document`, with the line of every value), refused when nested deeper than
:data:`MAX_NESTING`; where each job's values are (:class:`Lines`); and :class:`JobFileError`, the
error of a file that cannot be submitted. What a document's jobs are: :mod:`ops.jobfile`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from typing import Any

from runtime.errors import InvalidArgument

MAX_NESTING = 16
"""Deepest nesting of tables and lists in a job file (``job[i].env`` is 3 levels)."""
TOO_DEEP = f"a job file must nest at most {MAX_NESTING} levels deep"
Path_ = tuple[str | int, ...]
"""Where a value sits in one job: ``()`` the job, ``("env",)`` a field, ``("env", "HOME")`` or
``("constraints", 2)`` a part of one."""


class JobFileError(InvalidArgument):
    """A job file that cannot be submitted; nothing was sent. The message starts with the file
    and, where known, the line: ``jobs.toml:7: max_attempts must be between 1 and 100, got 0``.

    Args:
        where: the file as shown, with ``:LINE`` when known.
        message: what is wrong.
        field: the field at fault (``file`` for the file as a whole).
        value: the value at fault.
    """

    def __init__(self, where: str, message: str, *, field: str = "file", value: object = None) -> None:
        super().__init__(field, value, message)
        self.args = (f"{where}: {message}",)


class Lines:
    """Where each value of a file's jobs is: ``line(job, path)``, the most precise one known."""

    def __init__(self) -> None:
        self.of: dict[tuple[int, Path_], int] = {}

    def set(self, job: int, path: Path_, line: int) -> None:
        self.of.setdefault((job, path), line)

    def line(self, job: int, path: Path_) -> int | None:
        for length in range(len(path), -1, -1):
            found = self.of.get((job, path[:length]))
            if found is not None:
                return found
        return None


def nesting_depth(value: Any) -> int:
    """How deep lists and tables nest in ``value`` (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        else:
            continue
        deepest = max(deepest, depth + 1)
    return deepest


TOML_HEADER = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(?:#.*)?$")
TOML_KEY = re.compile(r"\s*(?:\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_-]+))\s*(?:\.|=)")


def toml_document(shown: str, text: str) -> Any:
    """The parsed TOML document of ``text`` (the file ``shown``).

    Raises:
        JobFileError: not TOML (with its line), or nested deeper than :data:`MAX_NESTING`.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise JobFileError(f"{shown}:{found[1]}" if found else shown, f"not TOML: {message}") from None
    except RecursionError:
        raise JobFileError(shown, TOO_DEEP) from None
    if nesting_depth(document) > MAX_NESTING:
        raise JobFileError(shown, TOO_DEEP)
    return document


def _yaml_loader() -> type:
    """PyYAML's safe loader (its C one when there is one), reading JSON's and YAML 1.2's
    exponent floats (``1e3``) as numbers too (YAML 1.1 reads them as text)."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def yaml_document(shown: str, text: str, kind: str) -> tuple[Any, dict[Path_, int]]:
    """The parsed YAML (or JSON: ``kind`` names it in errors) document and the line of each
    value by its path.

    Raises:
        JobFileError: not YAML (with its line), empty, nested deeper than :data:`MAX_NESTING`,
            holding an alias or several documents, or a table whose keys are not text or repeat.
    """
    import yaml

    loader_class = _yaml_loader()
    try:
        _check_yaml_events(shown, yaml.parse(text, Loader=loader_class))
        loader = loader_class(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise JobFileError(shown, "a job file must hold at least one job")
            document, marks = _yaml_value(loader, root)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}" if mark is not None else shown
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        if "nesting depth" in problem:  # libyaml's own limit, met before the events are seen
            raise JobFileError(where, TOO_DEEP) from None
        raise JobFileError(where, f"not {kind}: {problem}") from None
    except yaml.YAMLError as exc:
        raise JobFileError(shown, f"not {kind}: {exc}") from None
    return document, marks


def _check_yaml_events(shown: str, events: Iterable[Any]) -> None:
    """Refuse, from the parser's events (no recursion, nothing built), a file that nests
    deeper than :data:`MAX_NESTING`, holds an alias or several documents."""
    import yaml

    depth = 0
    documents = 0
    for event in events:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        where = shown if line is None else f"{shown}:{line}"
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise JobFileError(where, TOO_DEEP)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            raise JobFileError(where, "a job file must not use aliases (*name): write the value out")
        elif isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise JobFileError(where, "a job file must hold one YAML document")


def _yaml_value(loader: Any, root: Any) -> tuple[Any, dict[Path_, int]]:
    """The Python value of a composed YAML node tree, with the line of every table key and
    list item by its path (tables' keys must be text and given once). Recursion is bounded
    by :data:`MAX_NESTING` (checked on the events first)."""
    import yaml

    marks: dict[Path_, int] = {(): root.start_mark.line + 1}

    def value(node: Any, path: Path_) -> Any:
        if isinstance(node, yaml.MappingNode):
            table: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if not isinstance(key, str):
                    raise yaml.MarkedYAMLError(
                        problem=f"a field's name must be text, got {key!r}", problem_mark=key_node.start_mark
                    )
                if key in table:
                    raise yaml.MarkedYAMLError(
                        problem=f"field {key!r} is given twice", problem_mark=key_node.start_mark
                    )
                marks.setdefault((*path, key), line)
                table[key] = value(value_node, (*path, key))
            return table
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                marks.setdefault((*path, index), item.start_mark.line + 1)
                items.append(value(item, (*path, index)))
            return items
        return loader.construct_object(node, deep=True)

    return value(root, ()), marks
