"""Who the kernel's OOM killer takes first when the whole machine runs out of memory.

The agent (and a fleet) asks for :data:`DEFAULT_AGENT_OOM_SCORE_ADJ` at start, its reapers and
container supervisors inherit it, and each job raises its own to the worker's
``job_oom_score_adj`` (1000 by default) between fork and exec, as the kubelet orders its pods.
Lowering a value below the process's hidden ``oom_score_adj_min`` needs ``CAP_SYS_RESOURCE``
(``fs/proc/base.c``, ``__set_oom_adj``): without it a process goes as low as the kernel lets it
(found by trying, at most a dozen writes) and logs once what it could not get. docs/design.md,
"Job runtimes" ("When the whole machine runs out of memory").
"""

from __future__ import annotations

from typing import Any

import attrs

from runtime.errors import InvalidArgument

MIN_OOM_SCORE_ADJ = -1000
MAX_OOM_SCORE_ADJ = 1000
"""The kernel's range of ``oom_score_adj`` (-1000: never killed; 1000: always first)."""
DEFAULT_AGENT_OOM_SCORE_ADJ = -998
"""What an agent or fleet process asks for (and its reapers inherit): below guaranteed pods'
-997 and above the kubelet's -999, as a node agent sits in Kubernetes."""
DEFAULT_JOB_OOM_SCORE_ADJ = 1000
"""What a job's processes get: Kubernetes' best-effort pods' value, the first the kernel takes."""
MIN_JOB_OOM_SCORE_ADJ = 0
"""The lowest ``job_oom_score_adj``: a job is never better protected than a process nobody set."""

_PATH = "/proc/self/oom_score_adj"


@attrs.frozen
class OomScore:
    """What :func:`protect_process` did: the ``oom_score_adj`` ``asked`` for, the one in effect
    ``now`` (None where ``/proc`` has no such file), and why the kernel ``refused`` (empty when
    it did not)."""

    asked: int
    now: int | None
    refused: str = ""


def check_oom_score_adj(value: int, *, field: str = "oom_score_adj", low: int = MIN_OOM_SCORE_ADJ) -> int:
    """``value`` if it is an integer in ``low``..1000, else InvalidArgument naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_OOM_SCORE_ADJ:
        raise InvalidArgument(field, value, f"must be an integer between {low} and {MAX_OOM_SCORE_ADJ}")
    return value


def read_oom_score_adj(pid: int | str = "self") -> int | None:
    """Process ``pid``'s ``oom_score_adj`` (None when it is gone, or ``/proc`` lacks the file)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", encoding="ascii") as file:
            return int(file.read())
    except (OSError, ValueError):
        return None


def _write(value: int) -> bool:
    """Set this process's ``oom_score_adj``; False when the kernel refuses it."""
    try:
        with open(_PATH, "w", encoding="ascii") as file:
            file.write(str(value))
    except PermissionError:
        return False
    return True


def protect_process(asked: int, *, log: Any | None = None) -> OomScore:
    """Lower this process's ``oom_score_adj`` to ``asked`` unless it is at most that already;
    children forked later inherit it. Where the kernel refuses (no ``CAP_SYS_RESOURCE``) the
    process takes the lowest value it may set between ``asked`` and its current one, and a
    warning says so once.

    ``asked``: -1000..1000 (lower: killed later; InvalidArgument outside); ``log`` is told once
    (a warning) when the kernel refuses.
    """
    check_oom_score_adj(asked)
    current = read_oom_score_adj()
    if current is None or current <= asked:
        return OomScore(asked=asked, now=current)
    try:
        if _write(asked):
            return OomScore(asked=asked, now=read_oom_score_adj())
        # Refused: the kernel takes every value at or above its hidden minimum, so bisect
        # (asked, current] for the lowest accepted; ``high`` is always the value in effect.
        low, high = asked, current  # low refused, high accepted
        while high - low > 1:
            middle = (low + high) // 2
            if _write(middle):
                high = middle
            else:
                low = middle
    except OSError as exc:  # not PermissionError: no such file, a read-only /proc
        refused = f"{type(exc).__name__}: {exc.strerror or exc}"
    else:
        refused = "PermissionError: the kernel refuses values below this process's oom_score_adj_min"
    now = read_oom_score_adj()
    if log is not None:
        log.warning(
            "OOM score not lowered as asked: the kernel may kill this process sooner",
            asked_oom_score_adj=asked,
            oom_score_adj=now,
            error=refused,
            hint="needs CAP_SYS_RESOURCE (root outside a container has it), or a service manager "
            "that sets it (systemd: OOMScoreAdjust=); see --oom-score-adj",
        )
    return OomScore(asked=asked, now=now, refused=refused)
