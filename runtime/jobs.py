"""A job's spec, the one shape every layer speaks: what to run and what it reserves.

:class:`JobSpec` holds a job's name, its resource requests (``cpu_millis``: millicores, 1000 =
one core; ``memory_mb``: MiB), its priority and its runtime, one of :data:`JobRuntime`:

- :class:`SleepRuntime`: hold the resources for ``duration_ms`` milliseconds, do no work
  (benchmarks, chaos);
- :class:`CommandRuntime`: run ``argv`` as a child process (``agent/runtimes.py``).

Each runtime knows its own rules (:meth:`SleepRuntime.check`), how it reads to a person
(:meth:`SleepRuntime.describe`) and its name (``kind``, also the database's ``jobs.runtime``).
Where a spec comes from or goes to lives elsewhere, one module each: the wire
(:mod:`runtime.wire_jobs`), the database (``actors/queries.py``), a process (``agent/runtimes.py``).

The limits are the control plane's (:meth:`JobSpec.check`); ``actors.validation`` lists them
with every other limit for the README. Sizes are counted in bytes of UTF-8
(:mod:`runtime.checks`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import ClassVar

import attrs

from runtime.checks import check_int_between, check_text, utf8_bytes
from runtime.errors import InvalidArgument

MAX_CPU_MILLIS = 1_000_000  # 1000 cores
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_NAME_BYTES = 128
MAX_PRIORITY = 1_000_000
MAX_SLEEP_MS = 7 * 24 * 3600 * 1000  # one week
MAX_ARGV_ITEMS = 256
MAX_ARGV_BYTES = 64 * 1024

RUNTIME_RULE = "must be exactly one of sleep or command"
"""The rule a spec without a runtime (or, on the wire, with two) breaks (field ``runtime``)."""


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


def _argv(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class CommandRuntime:
    """Run ``argv`` as a child process (``argv[0]`` looked up on the worker's PATH)."""

    kind: ClassVar[str] = "command"
    """The runtime's name (``jobs.runtime`` in the database)."""

    argv: tuple[str, ...] = attrs.field(converter=_argv)
    """The program and its arguments (any sequence of str is kept as a tuple): 1 to
    :data:`MAX_ARGV_ITEMS` items, :data:`MAX_ARGV_BYTES` bytes of UTF-8 in all, the first
    not empty."""

    def check(self) -> None:
        """Raises InvalidArgument (``command.argv`` or ``command.argv[i]``): no program, too many
        items, an item holding a NUL byte or too long, or too many bytes in all."""
        argv = self.argv
        if not argv:
            raise InvalidArgument("command.argv", list(argv), "must name a program")
        if len(argv) > MAX_ARGV_ITEMS:
            raise InvalidArgument(
                "command.argv", f"{len(argv)} items", f"must have at most {MAX_ARGV_ITEMS} items"
            )
        for index, arg in enumerate(argv):
            check_text(f"command.argv[{index}]", arg, max_bytes=MAX_ARGV_BYTES, allow_empty=index > 0)
        total = sum(utf8_bytes("command.argv", a) for a in argv)
        if total > MAX_ARGV_BYTES:
            raise InvalidArgument(
                "command.argv", f"{total} bytes", f"must total at most {MAX_ARGV_BYTES} bytes in UTF-8"
            )

    def describe(self) -> str:
        """One line for people, the command as a shell would read it: ``command: echo 'a b'``."""
        return "command: " + shlex.join(self.argv)


JobRuntime = SleepRuntime | CommandRuntime
"""What a job runs: every runtime there is."""


@attrs.frozen(kw_only=True)
class JobSpec:
    """A job as submitted: what it runs and what it reserves while it runs.

    Built unchecked (a spec off the wire may break any rule: the control plane refuses it with
    :meth:`check`, an agent refuses it as ``bad_spec``); a spec read back from the database was
    checked when it was stored.
    """

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

    def check(self) -> JobSpec:
        """This spec, once it is found within every limit (fields in the order above).

        Raises:
            InvalidArgument: the first field that is empty, too long, out of range or holds a
                NUL byte (or a control character, in the name), or no runtime; the field is
                named as on the wire (``name``, ``sleep.duration_ms``, ``command.argv[2]``,
                ``runtime``).
        """
        check_text("name", self.name, max_bytes=MAX_NAME_BYTES, printable=True)
        check_int_between("cpu_millis", self.cpu_millis, 1, MAX_CPU_MILLIS)
        check_int_between("memory_mb", self.memory_mb, 1, MAX_MEMORY_MB)
        check_int_between("priority", self.priority, -MAX_PRIORITY, MAX_PRIORITY)
        if self.runtime is None:
            raise InvalidArgument("runtime", None, RUNTIME_RULE)
        self.runtime.check()
        return self

    def describe(self) -> str:
        """The runtime in one line for people (:meth:`SleepRuntime.describe`); ``-`` for none."""
        return "-" if self.runtime is None else self.runtime.describe()
