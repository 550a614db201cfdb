"""Countable devices: named resources whose units a worker offers by id and a job asks by count.

A worker offers ``gpu=0,1,2,3`` (``stockade agent --resource``, or the indexes ``nvidia-smi -L``
lists); a job asks ``gpu=2`` (``stockade submit --resource``, ``resources`` in a job file). The
placer gives a job whole units of a worker, the lowest free ids first, and no unit is held by two
active assignments at once (docs/devices.md). The shape follows Slurm's GRES (``gres=gpu:2``),
Nomad's ``device`` blocks and Kubernetes' extended resources (``nvidia.com/gpu: 2``).

Names are ``[a-z][a-z0-9_-]*`` of at most :data:`MAX_RESOURCE_NAME_BYTES`; unit ids are short
tokens of ``A-Z a-z 0-9 . _ : -`` (an index, or a GPU's ``GPU-<uuid>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from runtime.errors import InvalidArgument

MAX_RESOURCE_KINDS = 16
"""Most resource names one job asks or one worker offers."""
MAX_RESOURCE_NAME_BYTES = 32
"""Longest resource name, in bytes (ASCII)."""
MAX_RESOURCE_UNITS = 256
"""Most units of one resource on one worker, and most one job asks of one resource."""
MAX_UNIT_ID_BYTES = 64
"""Longest unit id, in bytes (ASCII): room for a GPU's ``GPU-<uuid>`` or ``MIG-<uuid>``."""

NAME_RULE = f"must be 1 to {MAX_RESOURCE_NAME_BYTES} characters of [a-z][a-z0-9_-]*"
"""The rule a resource name breaks."""
UNIT_RULE = (
    f"must be 1 to {MAX_UNIT_ID_BYTES} characters of A-Z a-z 0-9 . _ : - starting with a letter or digit"
)
"""The rule a unit id breaks."""

_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_UNIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")

GPU = "gpu"
"""The resource name whose units also go to ``CUDA_VISIBLE_DEVICES`` and a container's
``--gpus`` (agent/job_env.py, agent/container.py)."""

Offered = dict[str, tuple[str, ...]]
"""A worker's resources: name -> its unit ids, in the order offered."""


def check_resource_name(field: str, name: str) -> str:
    """``name``, once it is a resource name (:data:`NAME_RULE`); else InvalidArgument naming ``field``."""
    if not isinstance(name, str) or len(name) > MAX_RESOURCE_NAME_BYTES or not _NAME.fullmatch(name):
        raise InvalidArgument(field, name, NAME_RULE)
    return name


def check_asked(resources: Mapping[str, int], *, field: str = "resources") -> tuple[tuple[str, int], ...]:
    """A job's ``resources`` (name -> count) as (name, count) pairs sorted by name, without those
    asking 0 (as asking none).

    Raises:
        InvalidArgument: more than :data:`MAX_RESOURCE_KINDS` names, a bad name
            (``resources``), or a count outside 0..MAX_RESOURCE_UNITS (``resources[gpu]``).
    """
    if len(resources) > MAX_RESOURCE_KINDS:
        raise InvalidArgument(field, len(resources), f"must name at most {MAX_RESOURCE_KINDS} resources")
    asked = []
    for name, count in sorted(resources.items()):
        check_resource_name(field, name)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_RESOURCE_UNITS:
            raise InvalidArgument(
                f"{field}[{name}]", count, f"must be a count between 0 and {MAX_RESOURCE_UNITS}"
            )
        if count:
            asked.append((name, count))
    return tuple(asked)


def check_offered(resources: Mapping[str, Iterable[str]], *, field: str = "resources") -> Offered:
    """A worker's ``resources`` (name -> unit ids) as :data:`Offered`, names sorted, names with
    no unit left out.

    Raises:
        InvalidArgument: more than :data:`MAX_RESOURCE_KINDS` names, a bad name, more than
            :data:`MAX_RESOURCE_UNITS` units of one, a bad unit id, or a unit id listed twice
            (``resources[gpu]``, the id as the value).
    """
    if len(resources) > MAX_RESOURCE_KINDS:
        raise InvalidArgument(field, len(resources), f"must name at most {MAX_RESOURCE_KINDS} resources")
    offered: Offered = {}
    for name in sorted(resources):
        check_resource_name(field, name)
        units = tuple(resources[name])
        where = f"{field}[{name}]"
        if len(units) > MAX_RESOURCE_UNITS:
            raise InvalidArgument(where, len(units), f"must list at most {MAX_RESOURCE_UNITS} units")
        seen: set[str] = set()
        for unit in units:
            if not isinstance(unit, str) or len(unit) > MAX_UNIT_ID_BYTES or not _UNIT.fullmatch(unit):
                raise InvalidArgument(where, unit, UNIT_RULE)
            if unit in seen:
                raise InvalidArgument(where, unit, "must list each unit id once (listed twice)")
            seen.add(unit)
        if units:
            offered[name] = units
    return offered


def parse_offer(text: str, *, field: str = "--resource") -> tuple[str, tuple[str, ...]]:
    """A worker's ``NAME=ID,ID,...`` (``gpu=0,1,2,3``) as (name, unit ids), each checked (not
    yet against other options naming the same resource: :func:`merge_offers`).

    Raises:
        InvalidArgument: no ``=``, a bad name, no unit, a bad unit id or one listed twice.
    """
    name, sep, ids = text.partition("=")
    if not sep:
        raise InvalidArgument(field, text, "must be NAME=ID,ID,... (e.g. gpu=0,1,2,3)")
    units = tuple(u.strip() for u in ids.split(","))
    if not ids.strip():
        raise InvalidArgument(field, text, "must list at least one unit id (NAME=ID,ID,...)")
    offered = check_offered({name.strip(): units}, field=field)
    return name.strip(), offered[name.strip()]


def merge_offers(texts: Iterable[str], *, field: str = "--resource") -> Offered:
    """Repeated ``NAME=ID,...`` options as one :data:`Offered`.

    Raises:
        InvalidArgument: one option's error (:func:`parse_offer`), or a resource named twice.
    """
    offered: Offered = {}
    for text in texts:
        name, units = parse_offer(text, field=field)
        if name in offered:
            raise InvalidArgument(field, text, f"must name each resource once ({name} named twice)")
        offered[name] = units
    return check_offered(offered, field=field)


def parse_ask(text: str, *, field: str = "--resource") -> tuple[str, int]:
    """A job's ``NAME=COUNT`` (``gpu=2``) as (name, count).

    Raises:
        InvalidArgument: no ``=``, a bad name, or a count that is not an integer in 1..MAX_RESOURCE_UNITS.
    """
    name, sep, count = text.partition("=")
    name = name.strip()
    if not sep or not count.strip().isdigit():
        raise InvalidArgument(field, text, "must be NAME=COUNT (e.g. gpu=2)")
    check_resource_name(field, name)
    value = int(count)
    if not 1 <= value <= MAX_RESOURCE_UNITS:
        raise InvalidArgument(field, text, f"must ask a count between 1 and {MAX_RESOURCE_UNITS}")
    return name, value


def merge_asks(texts: Iterable[str], *, field: str = "--resource") -> dict[str, int]:
    """Repeated ``NAME=COUNT`` options as name -> count.

    Raises:
        InvalidArgument: one option's error (:func:`parse_ask`), or a resource named twice.
    """
    asked: dict[str, int] = {}
    for text in texts:
        name, count = parse_ask(text, field=field)
        if name in asked:
            raise InvalidArgument(field, text, f"must name each resource once ({name} named twice)")
        asked[name] = count
    check_asked(asked, field=field)
    return asked


def env_name(name: str) -> str:
    """The environment variable a job's units of ``name`` are given in:
    ``STOCKADE_RESOURCE_`` and the name uppercased, ``-`` as ``_`` (``gpu`` -> ``STOCKADE_RESOURCE_GPU``)."""
    return "STOCKADE_RESOURCE_" + name.upper().replace("-", "_")


def nvidia_smi_units(listing: str) -> tuple[str, ...]:
    """The GPU indexes of ``nvidia-smi -L``'s output (lines ``GPU 0: NVIDIA A100 (UUID: GPU-...)``),
    as unit ids in the order listed; MIG lines (indented ``MIG ...``) are not units of their own."""
    return tuple(m.group(1) for m in re.finditer(r"^GPU (\d+):", listing, re.MULTILINE))
