"""A job's spec, the one shape every layer speaks: what to run and what it reserves.

:class:`JobSpec` holds a job's name, resources, priority and runtime, one of
:data:`JobRuntime` (:class:`SleepRuntime`, :class:`CommandRuntime`, :class:`ContainerRuntime`),
each with its rules (``check``), its line for people (``describe``) and its name (``kind``,
the database's ``jobs.runtime``). Its other forms: :mod:`runtime.wire_jobs`,
``actors/queries/jobs.py``, ``agent/runtimes.py``. The limits are the control plane's
(:meth:`JobSpec.check`, listed in ``actors.validation``); sizes are bytes of UTF-8.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import ClassVar

import attrs

from runtime.checks import check_int_between, check_text, utf8_bytes
from runtime.constraints import Constraint, check_constraints
from runtime.errors import InvalidArgument
from runtime.resources import check_asked
from runtime.settings.fields import str_tuple
from runtime.validation import MAX_ID

MAX_CPU_MILLIS = 1_000_000  # 1000 cores
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_NAME_BYTES = 128
MAX_PRIORITY = 1_000_000
MAX_SLEEP_MS = 7 * 24 * 3600 * 1000  # one week
MAX_ARGV_ITEMS = 256
MAX_ARGV_BYTES = 64 * 1024
MAX_IMAGE_BYTES = 255
"""Longest image reference: Docker's longest repository name (``NameTotalLengthMax`` of the
distribution project's ``reference`` package), also the bound for a whole reference here."""

MIN_CONTAINER_CPU_MILLIS = 10
"""Least CPU of a container job, in millicores: runc refuses a smaller CPU quota (a CFS quota
under 1 ms of the 100 ms period: "failed to write 100 to cpu.cfs_quota_us")."""
MIN_CONTAINER_MEMORY_MB = 6
"""Least memory of a container job: the engine refuses a limit under 6 MiB."""
RUNTIME_RULE = "must be exactly one of sleep, command or container"  # (field ``runtime``)
MAX_ATTEMPTS = 100
"""Most runs of one job (``max_attempts``)."""
DEFAULT_RETRY_BACKOFF_S = 1.0
"""The retry backoff's base when the spec names none, in seconds."""
MAX_RETRY_BACKOFF_S = 600.0
"""Largest retry backoff base, and the cap of every retry delay, in seconds (ten minutes)."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Longest ``timeout_s``: one week."""
MIN_TIMEOUT_S = 0.001
"""Shortest ``timeout_s``: one millisecond, the unit it is stored and sent in."""
MAX_ENV_VARS = 256
MAX_ENV_NAME_BYTES = 256
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_RULE = "must be a letter or _ then letters, digits or _ ([A-Za-z_][A-Za-z0-9_]*)"
"""What an environment name must be, whole: a letter or ``_``, then letters, digits and ``_``
(POSIX.1-2017, 8.1: the names the shell and the utilities read; a job's own ``sh -c`` could not
read ``A B`` or ``1X``)."""
MAX_ENV_BYTES = 64 * 1024
"""Most bytes of UTF-8 of a job's environment, names and values together."""
RESERVED_ENV_PREFIX = "STOCKADE_"
"""Environment names the worker sets itself (``STOCKADE_ARRAY_INDEX``, ``STOCKADE_JOB_ID``)."""
HIDDEN_ENV_VALUE = "<hidden>"
"""What stands for each environment value (perhaps a secret) in a job shown to someone who may
not read the values (:meth:`JobSpec.env_values_hidden`)."""
MAX_WORKDIR_BYTES = 4096
"""Longest ``workdir``, PATH_MAX."""
MAX_AFTER = 100
"""Most jobs one job may wait for (``after``)."""
MAX_ARRAY_TASKS = 10_000
"""Most tasks of one array (as many as one batch submission)."""
MAX_ARRAY_INDEX = 1_000_000
"""Largest task index of an array."""
MIN_RETRY_EXIT_CODE = 1
MAX_RETRY_EXIT_CODE = 255
"""The exit codes ``retry_on_exit`` may list: those a process can end with on its own, but 0
(success); a run killed by signal N reports ``-N`` and is never in the list."""
FAILURE_REASONS = (
    "timeout",
    "oom_killed",
    "workdir_not_found",
    "workdir_denied",
    "command_not_found",
    "image_not_found",
    "no_container_engine",
    "container_error",
    "resources_error",
)
"""The reasons a failed run may name (the word before the colon of its detail, ``oom_killed:
...``, which ``record_outcomes`` in ``schema.sql`` records as its assignment's end reason; the
agent's runtimes and the leader's timeouts write them), which ``no_retry_on`` may list. A run
that names none failed by its exit code (detail ``exit code 2``)."""
MAX_GANG_TASKS = 256
"""Most tasks of one gang (``--tasks``): all of them are placed in one fenced commit."""


def _constraints(value: Iterable[Constraint]) -> tuple[Constraint, ...]:
    return tuple(value)


def _ids(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class SleepRuntime:
    """Hold the job's resources for ``duration_ms`` milliseconds and do no work."""

    kind: ClassVar[str] = "sleep"
    """The runtime's name (``jobs.runtime`` in the database)."""

    duration_ms: int
    """How long, in milliseconds (0 to :data:`MAX_SLEEP_MS`)."""

    def check(self) -> None:
        """Raises InvalidArgument (``sleep.duration_ms``) outside 0..:data:`MAX_SLEEP_MS`."""
        check_int_between("sleep.duration_ms", self.duration_ms, 0, MAX_SLEEP_MS)

    def describe(self) -> str:
        """One line for people: ``sleep 2.5 s``."""
        return f"sleep {self.duration_ms / 1000:g} s"


@attrs.frozen(kw_only=True)
class CommandRuntime:
    """Run ``argv`` as a child process (``argv[0]`` looked up on the worker's PATH)."""

    kind: ClassVar[str] = "command"
    """The runtime's name (``jobs.runtime`` in the database)."""

    argv: tuple[str, ...] = attrs.field(converter=str_tuple)
    """The program and its arguments (any sequence of str is kept as a tuple): 1 to
    :data:`MAX_ARGV_ITEMS` items, :data:`MAX_ARGV_BYTES` bytes of UTF-8 in all, the first
    not empty."""

    def check(self) -> None:
        """Raises InvalidArgument (``command.argv`` or ``command.argv[i]``): no program, too many
        items, an item holding a NUL byte or too long, or too many bytes in all."""
        _check_argv("command.argv", self.argv, allow_empty=False)

    def describe(self) -> str:
        """One line for people, the command as a shell would read it: ``command: echo 'a b'``."""
        return "command: " + shlex.join(self.argv)


def _check_argv(field: str, argv: tuple[str, ...], *, allow_empty: bool) -> None:
    """The argv rules of :meth:`CommandRuntime.check`, for ``field``."""
    if not argv:
        if allow_empty:
            return
        raise InvalidArgument(field, list(argv), "must name a program")
    if len(argv) > MAX_ARGV_ITEMS:
        raise InvalidArgument(field, len(argv), f"must have at most {MAX_ARGV_ITEMS} items")
    for index, arg in enumerate(argv):
        check_text(f"{field}[{index}]", arg, max_bytes=MAX_ARGV_BYTES, allow_empty=index > 0)
    total = sum(utf8_bytes(field, a) for a in argv)
    if total > MAX_ARGV_BYTES:
        raise InvalidArgument(field, f"{total} bytes", f"must total at most {MAX_ARGV_BYTES} bytes in UTF-8")


# Docker's reference grammar (the distribution project's ``reference/regexp.go``):
#   reference := name [":" tag] ["@" digest]
#   name      := [domain "/"] path-component ["/" path-component]*
#   domain    := domain-component ["." domain-component]* [":" port]
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII
)
IMAGE_RULE = (
    "must be a Docker image reference, repository[:tag][@digest] with lowercase path components "
    "(such as registry.example:5000/team/app:1.2)"
)


def check_image(field: str, image: str) -> str:
    """``image``, once it is found to be a Docker image reference (``repository[:tag][@digest]``,
    the grammar of Docker's ``reference`` package) of at most :data:`MAX_IMAGE_BYTES` bytes: no
    whitespace, NUL, shell metacharacter, path (``./x``, ``a/../b``) or uppercase path component.

    Raises:
        InvalidArgument: naming ``field``, the rule broken and the value.
    """
    check_text(field, image, max_bytes=MAX_IMAGE_BYTES)
    if any(c.isspace() for c in image):
        raise InvalidArgument(field, image, "must not contain whitespace")
    bad = sorted({c for c in image if c in "$`;&|<>()[]{}*?!~'\"\\#%^=,"})
    if bad:
        raise InvalidArgument(field, image, f"must not contain shell metacharacters ({''.join(bad)})")
    if image.startswith(("/", "./")) or ".." in image or "/./" in image or image == ".":
        raise InvalidArgument(field, image, "must be an image reference, not a path")
    if _REFERENCE.fullmatch(image) is None:
        raise InvalidArgument(field, image, IMAGE_RULE)
    return image


@attrs.frozen(kw_only=True)
class ContainerRuntime:
    """Run ``argv`` in a Docker container of ``image`` (only on workers labelled
    ``container=docker``; the image must already be on the worker: nothing is pulled)."""

    kind: ClassVar[str] = "container"
    """The runtime's name (``jobs.runtime`` in the database)."""

    image: str
    """The image reference, ``repository[:tag][@digest]`` (:func:`check_image`)."""
    argv: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    """The command and its arguments, as a command job's (same limits); empty: the image's own
    entry point and command."""

    def check(self) -> None:
        """Raises InvalidArgument (``container.image``, ``container.argv[i]``...): an image that
        is no Docker reference, or argv past a command's limits."""
        check_image("container.image", self.image)
        _check_argv("container.argv", self.argv, allow_empty=True)

    def describe(self) -> str:
        """One line for people: ``container python:3.12 -- python3 -c 'print(1)'``."""
        return f"container {self.image}" + (" -- " + shlex.join(self.argv) if self.argv else "")


JobRuntime = SleepRuntime | CommandRuntime | ContainerRuntime
"""What a job runs: every runtime there is."""


@attrs.frozen(kw_only=True)
class ArrayRange:
    """An array submission (Slurm's ``--array=1-100%10``): one task per index
    ``first_index..last_index`` (both included), each a job of the same spec with
    ``STOCKADE_ARRAY_INDEX`` in its environment, at most ``max_running`` of them pending,
    assigned or running at once (0: no limit)."""

    first_index: int
    last_index: int
    max_running: int = 0
    max_failed_tasks: int = 0
    """Once this many tasks have failed for good (their attempts spent, or failed at once by
    their failure policy), the array's tasks that have not ended are cancelled and the array has
    failed (Kubernetes' ``maxFailedIndexes``, counted as "at least" here); 0: no limit, each task
    ends by itself. At most :attr:`tasks`."""

    @property
    def tasks(self) -> int:
        """How many tasks."""
        return self.last_index - self.first_index + 1

    def check(self) -> ArrayRange:
        """This range, once it is found within the limits (:data:`MAX_ARRAY_INDEX`,
        :data:`MAX_ARRAY_TASKS`, ``last_index`` not below ``first_index``); else InvalidArgument."""
        if self.last_index < self.first_index:
            raise InvalidArgument(
                "array", self.describe(), "must end at or after its first index (first-last, e.g. 1-100)"
            )
        if self.tasks > MAX_ARRAY_TASKS:
            raise InvalidArgument(
                "array", self.describe(), f"must have at most {MAX_ARRAY_TASKS} tasks (has {self.tasks})"
            )
        check_int_between("array.first_index", self.first_index, 0, MAX_ARRAY_INDEX)
        check_int_between("array.last_index", self.last_index, 0, MAX_ARRAY_INDEX)
        check_int_between("array.max_running", self.max_running, 0, MAX_ARRAY_TASKS)
        if isinstance(self.max_failed_tasks, bool) or not isinstance(self.max_failed_tasks, int):
            raise InvalidArgument("array.max_failed_tasks", self.max_failed_tasks, "must be an integer")
        if not 0 <= self.max_failed_tasks <= self.tasks:
            raise InvalidArgument(
                "array.max_failed_tasks",
                self.max_failed_tasks,
                f"must be between 1 and the array's {self.tasks} tasks (0 or none: no limit)",
            )
        return self

    def describe(self) -> str:
        """The text form: ``1-100`` or ``1-100%10``."""
        text = f"{self.first_index}-{self.last_index}"
        return f"{text}%{self.max_running}" if self.max_running else text


ARRAY_SYNTAX = "must be FIRST-LAST[%MAX_RUNNING] or INDEX (e.g. 1-100%10)"


def parse_array(text: str, *, field: str = "array") -> ArrayRange:
    """An :class:`ArrayRange` from ``1-100``, ``1-100%10`` or ``7`` (one task), checked
    (InvalidArgument naming ``field``)."""
    found = re.fullmatch(r"\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?(?:%\s*(\d{1,9})\s*)?", text, re.ASCII)
    if found is None:
        raise InvalidArgument(field, text, ARRAY_SYNTAX)
    first = int(found[1])
    last = int(found[2]) if found[2] is not None else first
    if found[3] is not None and int(found[3]) == 0:
        raise InvalidArgument(field, text, "must have %MAX_RUNNING of at least 1 (leave %N out for no limit)")
    return ArrayRange(first_index=first, last_index=last, max_running=int(found[3] or 0)).check()


def task_name(name: str, array_index: int | None) -> str:
    """How a job is named to people: an array's task as ``name[index]`` (its siblings share the
    name, ``sh[3]``), any other job as ``name``. ``array_index`` None: not an array's task."""
    return name if array_index is None else f"{name}[{array_index}]"


def _env(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), str(v)) for k, v in items))


def _resources(value: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), v) for k, v in items if not (isinstance(v, int) and v == 0)))


def check_env(env: Iterable[tuple[str, str]], *, field: str = "env") -> None:
    """Raises InvalidArgument (``env`` or ``env[NAME]``) for an environment that breaks a rule:
    more than :data:`MAX_ENV_VARS` names, a name that is empty, holds ``=`` or a NUL, is not of
    :data:`ENV_NAME_PATTERN` or starts with :data:`RESERVED_ENV_PREFIX`, a name given twice, a
    value holding a NUL, or more than :data:`MAX_ENV_BYTES` bytes in all."""
    pairs = list(env)
    if len(pairs) > MAX_ENV_VARS:
        raise InvalidArgument(field, len(pairs), f"must have at most {MAX_ENV_VARS} names")
    seen: set[str] = set()
    total = 0
    for name, value in pairs:
        check_text(f"{field} name", name, max_bytes=MAX_ENV_NAME_BYTES)
        if "=" in name:
            raise InvalidArgument(f"{field} name", name, "must not contain '=' (write NAME=VALUE)")
        if not ENV_NAME_PATTERN.fullmatch(name):
            raise InvalidArgument(f"{field} name", name, ENV_NAME_RULE)
        if name.startswith(RESERVED_ENV_PREFIX):
            raise InvalidArgument(
                f"{field} name", name, f"must not start with {RESERVED_ENV_PREFIX} (the worker sets those)"
            )
        if name in seen:
            raise InvalidArgument(f"{field} name", name, "must be given once")
        seen.add(name)
        check_text(f"{field}[{name}]", value, max_bytes=MAX_ENV_BYTES, allow_empty=True)
        total += utf8_bytes(field, name) + utf8_bytes(field, value) + 2
    if total > MAX_ENV_BYTES:
        raise InvalidArgument(field, f"{total} bytes", f"must total at most {MAX_ENV_BYTES} bytes in UTF-8")


def check_seconds(field: str, value: float, *, low: float, high: float, low_open: bool = False) -> float:
    """``value`` (seconds), once it is found a finite number within ``low..high`` (above
    ``low`` when ``low_open``); else InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(field, value, "must be a finite number of seconds")
    if value > high or value < low or (low_open and value == low):
        bound = f"above {low:g}" if low_open else f"at least {low:g}"
        raise InvalidArgument(field, value, f"must be {bound} and at most {high:g} seconds")
    return float(value)


@attrs.frozen(kw_only=True)
class JobSpec:
    """A job as submitted: what it runs and what it reserves while it runs. Built unchecked
    (a spec off the wire may break any rule): :meth:`check` it."""

    name: str
    """For people; 1 to :data:`MAX_NAME_BYTES` bytes of UTF-8, no control characters."""
    cpu_millis: int
    """CPU reserved, in millicores (1000 = one core), 1 to :data:`MAX_CPU_MILLIS`."""
    memory_mb: int
    """Memory reserved, in MiB, 1 to :data:`MAX_MEMORY_MB`."""
    priority: int = 0
    """Higher runs first; ties by submission order. -:data:`MAX_PRIORITY` to :data:`MAX_PRIORITY`."""
    runtime: JobRuntime | None
    """What it runs; None when the spec named no runtime (refused by :meth:`check`)."""
    max_attempts: int = 1
    """Most runs, 1 to :data:`MAX_ATTEMPTS`: a failed run (non-zero exit, OOM kill, timeout;
    a run lost with its worker only when ``count_lost``) is retried until they are spent."""
    retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S
    """The base of the delay before a retry, 0 to :data:`MAX_RETRY_BACKOFF_S` seconds: the
    delay before the n-th retry is drawn uniformly from 0 to ``min(MAX_RETRY_BACKOFF_S,
    retry_backoff_s * 2**(n-1))`` (exponential backoff with full jitter)."""
    count_lost: bool = False
    """Whether a run lost with its worker spends an attempt (by default it does not)."""
    timeout_s: float | None = None
    """Longest run, :data:`MIN_TIMEOUT_S` to :data:`MAX_TIMEOUT_S` seconds; None: no limit."""
    constraints: tuple[Constraint, ...] = attrs.field(default=(), converter=_constraints)
    """Rules on the worker's labels (:mod:`runtime.constraints`), all of which must hold."""
    env: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_env)
    """Environment variables as (name, value) pairs sorted by name (a mapping is taken too)."""
    workdir: str = ""
    """The working directory, an absolute path on the worker; empty: the job's own folder."""
    after: tuple[int, ...] = attrs.field(default=(), converter=_ids)
    """Jobs that must all have succeeded before this one becomes pending."""
    after_names: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    """Jobs of the same batch (SubmitJobs; a job file) by name, each once, that must all have
    succeeded before this one becomes pending (an array: all its tasks); resolved to the ids
    the batch's transaction assigns (:func:`runtime.validation.pipeline_order`). With
    ``after``, at most :data:`MAX_AFTER` in all."""
    array: ArrayRange | None = None
    """Submit as an array of tasks (:class:`ArrayRange`); None: one job."""
    retry_on_exit: tuple[int, ...] = attrs.field(default=(), converter=_ids)
    """The exit codes (:data:`MIN_RETRY_EXIT_CODE` to :data:`MAX_RETRY_EXIT_CODE`, each once)
    of a failed run that may be retried; a run that failed with another exit code (or none, or
    killed by a signal) ends the job failed at once, attempts left or not. Empty: every exit
    code may be retried. Runs that failed for a reason (:data:`FAILURE_REASONS`) are judged by
    ``no_retry_on`` instead (Kubernetes' ``podFailurePolicy``, ``onExitCodes``)."""
    no_retry_on: tuple[str, ...] = attrs.field(default=(), converter=str_tuple)
    """Reasons (of :data:`FAILURE_REASONS`, each once) of a failed run that end the job failed
    at once (``oom_killed``, ``timeout``...). The rule runs in one place, ``schema.sql``'s
    ``retry_refusal``."""
    resources: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_resources)
    """Countable devices asked (docs/devices.md): (name, count) pairs sorted by name (a mapping
    is taken too), e.g. ``(("gpu", 2),)``; each run gets that many whole units of one worker."""
    tasks: int | None = None
    """Submit as a gang of this many tasks, 1 to :data:`MAX_GANG_TASKS`, placed all or nothing
    (docs/gangs.md); None: not a gang."""
    spread: bool = False
    """A gang's tasks go to distinct workers (only with ``tasks``)."""

    def check(self) -> JobSpec:
        """This spec, once it is found within every limit (fields in the order above).

        Raises:
            InvalidArgument: the first field that is empty, too long, out of range or holds a
                NUL byte (or a control character, in the name), or no runtime; the field is
                named as on the wire (``name``, ``sleep.duration_ms``, ``command.argv[2]``,
                ``container.image``, ``runtime``); a failure policy (``retry_on_exit``,
                ``no_retry_on``) with ``max_attempts`` 1, under which it could retry nothing.
        """
        check_text("name", self.name, max_bytes=MAX_NAME_BYTES, printable=True)
        check_int_between("cpu_millis", self.cpu_millis, 1, MAX_CPU_MILLIS)
        check_int_between("memory_mb", self.memory_mb, 1, MAX_MEMORY_MB)
        check_int_between("priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY)
        if self.runtime is None:
            raise InvalidArgument("runtime", None, RUNTIME_RULE)
        self.runtime.check()
        self._check_lifecycle()
        if isinstance(self.runtime, ContainerRuntime):
            for field, value, low in (
                ("cpu_millis", self.cpu_millis, MIN_CONTAINER_CPU_MILLIS),
                ("memory_mb", self.memory_mb, MIN_CONTAINER_MEMORY_MB),
            ):
                if value < low:
                    raise InvalidArgument(
                        field, value, f"must be at least {low} for a container job (the engine's floor)"
                    )
        # A failure policy only chooses which failures are retried: with one attempt none is.
        for field, policy in (
            ("retry_on_exit", list(self.retry_on_exit)),
            ("no_retry_on", list(self.no_retry_on)),
        ):
            if policy and self.max_attempts == 1:
                raise InvalidArgument(
                    field, policy, "needs max_attempts above 1 (max_attempts is 1: no retry could happen)"
                )
        return self

    def _check_lifecycle(self) -> None:
        """The rules of the fields after ``runtime``, in their order."""
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise InvalidArgument("max_attempts", self.max_attempts, "must be an integer")
        check_int_between("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS)
        check_seconds("retry_backoff_s", self.retry_backoff_s, low=0.0, high=MAX_RETRY_BACKOFF_S)
        if self.timeout_s is not None:
            check_seconds("timeout_s", self.timeout_s, low=MIN_TIMEOUT_S, high=MAX_TIMEOUT_S)
        check_constraints(self.constraints)
        check_env(self.env)
        if self.workdir:
            check_text("workdir", self.workdir, max_bytes=MAX_WORKDIR_BYTES, printable=True)
            if not self.workdir.startswith("/"):
                raise InvalidArgument("workdir", self.workdir, "must be an absolute path (start with /)")
        if len(self.after) > MAX_AFTER:
            raise InvalidArgument("after", len(self.after), f"must name at most {MAX_AFTER} jobs")
        for index, job_id in enumerate(self.after):
            check_int_between(f"after[{index}]", job_id, 1, MAX_ID)
        if len(set(self.after)) != len(self.after):
            raise InvalidArgument("after", list(self.after), "must name each job once")
        if len(self.after) + len(self.after_names) > MAX_AFTER:
            raise InvalidArgument(
                "after_names", len(self.after_names), f"must name at most {MAX_AFTER} jobs with after"
            )
        for index, name in enumerate(self.after_names):
            check_text(f"after_names[{index}]", name, max_bytes=MAX_NAME_BYTES, printable=True)
        if len(set(self.after_names)) != len(self.after_names):
            raise InvalidArgument("after_names", list(self.after_names), "must name each job once")
        if self.array is not None:
            self.array.check()
        if len({name for name, _ in self.resources}) != len(self.resources):
            raise InvalidArgument("resources", dict(self.resources), "must name each resource once")
        check_asked(dict(self.resources))
        self._check_failure_policy()
        self._check_gang()

    def _check_failure_policy(self) -> None:
        """The rules of ``retry_on_exit`` and ``no_retry_on``."""
        for index, code in enumerate(self.retry_on_exit):
            if isinstance(code, bool) or not isinstance(code, int):
                raise InvalidArgument(f"retry_on_exit[{index}]", code, "must be an integer")
            check_int_between(f"retry_on_exit[{index}]", code, MIN_RETRY_EXIT_CODE, MAX_RETRY_EXIT_CODE)
        twice = sorted({c for c in self.retry_on_exit if self.retry_on_exit.count(c) > 1})
        if twice:
            raise InvalidArgument(
                "retry_on_exit", list(self.retry_on_exit), f"must list each exit code once ({twice[0]} twice)"
            )
        for index, reason in enumerate(self.no_retry_on):
            if reason not in FAILURE_REASONS:
                raise InvalidArgument(
                    f"no_retry_on[{index}]", reason, "must be a failure reason: " + ", ".join(FAILURE_REASONS)
                )
        twice_named = sorted({r for r in self.no_retry_on if self.no_retry_on.count(r) > 1})
        if twice_named:
            raise InvalidArgument(
                "no_retry_on", list(self.no_retry_on), f"must list each reason once ({twice_named[0]} twice)"
            )

    def _check_gang(self) -> None:
        """The rules of ``tasks`` and ``spread``."""
        if self.tasks is None:
            if self.spread:
                raise InvalidArgument("spread", True, "applies only to a gang: give tasks (--tasks N) too")
            return
        if isinstance(self.tasks, bool) or not isinstance(self.tasks, int):
            raise InvalidArgument("tasks", self.tasks, "must be an integer")
        check_int_between("tasks", self.tasks, 1, MAX_GANG_TASKS)
        if self.array is not None:
            raise InvalidArgument(
                "tasks", self.tasks, "cannot be combined with array: a job is a gang or an array"
            )

    def env_values_hidden(self) -> JobSpec:
        """This spec with every environment value replaced by :data:`HIDDEN_ENV_VALUE` (the
        names kept), for a reader who may not see the values."""
        if not self.env:
            return self
        return attrs.evolve(self, env=tuple((name, HIDDEN_ENV_VALUE) for name, _ in self.env))

    def describe(self) -> str:
        """The runtime in one line for people (:meth:`SleepRuntime.describe`); ``-`` for none."""
        return "-" if self.runtime is None else self.runtime.describe()
