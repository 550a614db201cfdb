"""A job's record (:class:`JobRecord`, in :data:`RECORD_FILE` of its folder): what the agent
wrote when the job started, so that a restarted agent can prove the job's supervisor its own and
take the job over (:mod:`agent.adoption`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import attrs

from agent.messages import JobOrder
from agent.work_folder import write_private
from runtime.jobs import CommandRuntime, ContainerRuntime, JobRuntime, JobSpec, SleepRuntime

RECORD_FILE = "job.record"
"""In a job's folder: the job's record (JSON, see :class:`JobRecord`), from its start until its
``stop`` line is written."""
RECORD_VERSION = 1
"""The record's format; a record of another version is not trusted (its job is stopped)."""


@attrs.frozen(kw_only=True)
class JobRecord:
    """What a job's folder says about the job."""

    worker_id: str
    assignment_id: int
    job_id: int
    incarnation: int
    """The incarnation the job was accepted in."""
    epoch: int
    """The epoch of the Assign request that started it."""
    cpu_millis: int
    memory_mb: int
    runtime: JobRuntime
    timeout_s: float | None = None
    name: str = ""
    started_monotonic_s: float
    """When its runtime was started (``time.monotonic()``); never rewritten: its ``timeout_s``
    and the length of its run count from it."""
    start_line_s: float | None = None
    """The time its ``start`` line carries (the database's clock, :mod:`agent.dbclock`): its
    ``stop`` line is never dated earlier; None when that line's time was not known yet."""
    began_monotonic_s: float
    """When its runtime was started (``time.monotonic()``): a sleep job's duration counts from it."""
    paused_s: float = 0.0
    """A sleep job's time paused since it began (its duration does not count it), as of the
    last time the record was written."""
    supervisor_pid: int | None = None
    """A command job's reaper, once forked; None before (or for a sleep job)."""
    supervisor_start_ticks: int | None = None
    """The reaper's start time, ``/proc/<pid>/stat`` field 22 (clock ticks since boot)."""
    job_uid: int | None = None
    """The uid (and gid) the job runs as, from its worker's pool (:mod:`agent.identities`); a
    restarted agent holds it while the job runs. None: the agent's shared job user or its own."""
    units: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The device units its assignment holds, (name, unit ids) pairs: a restarted agent holds
    them while the job runs (docs/devices.md)."""

    def order(self) -> JobOrder:
        """The job as the agent's own structures hold it (its spec has what the record keeps)."""
        return JobOrder(
            assignment_id=self.assignment_id,
            job_id=self.job_id,
            spec=JobSpec(
                name=self.name,
                cpu_millis=self.cpu_millis,
                memory_mb=self.memory_mb,
                runtime=self.runtime,
                timeout_s=self.timeout_s,
            ),
            units=self.units,
        )

    def to_json(self) -> str:
        """The record as one line of JSON."""
        runtime: dict[str, Any]
        match self.runtime:
            case SleepRuntime(duration_ms=ms):
                runtime = {"kind": "sleep", "duration_ms": ms}
            case CommandRuntime(argv=argv):
                runtime = {"kind": "command", "argv": list(argv)}
            case ContainerRuntime(image=image, argv=argv):
                runtime = {"kind": "container", "image": image, "argv": list(argv)}
        data = attrs.asdict(self, recurse=False)
        data["runtime"] = runtime
        data["version"] = RECORD_VERSION
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        """A record from :meth:`to_json`'s output; ValueError when it is not a record of this
        version (a torn or foreign file)."""
        try:
            data = json.loads(text)
            if data.pop("version") != RECORD_VERSION:
                raise ValueError(f"record version must be {RECORD_VERSION}")
            # A record of an agent that kept the wall-clock start instead: its start is when its
            # duration began counting (the same, but for a sleep job taken over once already).
            data.pop("started_unix_s", None)
            data.setdefault("started_monotonic_s", data.get("began_monotonic_s"))
            raw = data.pop("runtime")
            kind = raw["kind"]
            runtime: JobRuntime
            if kind == "sleep":
                runtime = SleepRuntime(duration_ms=int(raw["duration_ms"]))
            elif kind == "command":
                runtime = CommandRuntime(argv=tuple(str(a) for a in raw["argv"]))
            elif kind == "container":
                runtime = ContainerRuntime(image=str(raw["image"]), argv=tuple(str(a) for a in raw["argv"]))
            else:
                raise ValueError(f"unknown runtime {kind!r}")
            units = tuple((str(name), tuple(str(u) for u in ids)) for name, ids in data.pop("units", ()))
            return cls(runtime=runtime, units=units, **data)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a job record: {exc}") from exc


def write_record(job_dir: Path, record: JobRecord) -> None:
    """Write ``record`` to ``job_dir`` (created if missing), replacing the previous one atomically;
    raises OSError when it cannot be written."""
    job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(job_dir / RECORD_FILE, record.to_json() + "\n")


def read_record(job_dir: Path) -> JobRecord | None:
    """The record in ``job_dir``; None when there is none or it cannot be read."""
    try:
        return JobRecord.from_json((job_dir / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def remove_record(job_dir: Path) -> None:
    """Remove the record of ``job_dir`` (a missing one is fine)."""
    with contextlib.suppress(FileNotFoundError):
        (job_dir / RECORD_FILE).unlink()
