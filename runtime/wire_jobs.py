"""A job's spec on the wire: :class:`runtime.jobs.JobSpec` <-> ``pb.JobSpec``.

The one place the protobuf shape of a job meets the domain's: the runtime is the message's
``runtime`` oneof (``sleep`` = :class:`~runtime.jobs.SleepRuntime`, ``command`` =
:class:`~runtime.jobs.CommandRuntime`, ``container`` = :class:`~runtime.jobs.ContainerRuntime`).
Every gRPC boundary that carries a spec converts it
here: the control plane's submissions and job listings (``actors/ingest.py``), the leader's
assignments (``actors/dispatcher.py``), the agent's Worker service (``agent/service.py``) and
the CLI. Nothing is checked here but the oneof; the rules are :meth:`JobSpec.check`'s.
"""

from __future__ import annotations

from protocol import pb
from runtime.errors import InvalidArgument
from runtime.jobs import RUNTIME_RULE, CommandRuntime, ContainerRuntime, JobRuntime, JobSpec, SleepRuntime


def job_spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    """``spec`` as a ``JobSpec`` message (no runtime set when ``spec.runtime`` is None)."""
    message = pb.JobSpec(
        name=spec.name, cpu_millis=spec.cpu_millis, memory_mb=spec.memory_mb, priority=spec.priority
    )
    match spec.runtime:
        case SleepRuntime(duration_ms=duration_ms):
            message.sleep = pb.SleepRuntime(duration_ms=duration_ms)
        case CommandRuntime(argv=argv):
            message.command = pb.CommandRuntime(argv=list(argv))
        case ContainerRuntime(image=image, argv=argv):
            message.container = pb.ContainerRuntime(image=image, argv=list(argv))
        case None:
            pass
    return message


def job_spec_from_pb(message: pb.JobSpec | None, *, strict: bool = True) -> JobSpec:
    """A ``JobSpec`` message as a :class:`JobSpec`, unchecked (None reads as an empty message).

    A message whose oneof sets no runtime gives a spec whose runtime is None. One that
    sets several (protobuf keeps the last one it reads, betterproto2 keeps them all) is refused,
    or with ``strict=False`` read as naming none.

    Args:
        message: the message, as decoded.
        strict: refuse a message with several runtimes set (the control plane, which tells
            the client); False: give it no runtime (an agent, which refuses it as ``bad_spec``).

    Raises:
        InvalidArgument: ``strict`` and several runtimes set (field ``runtime``, value
            ``"both"``).
    """
    message = message or pb.JobSpec()
    runtime: JobRuntime | None = None
    given = [r for r in (message.sleep, message.command, message.container) if r is not None]
    if len(given) > 1:
        if strict:
            raise InvalidArgument("runtime", "both", RUNTIME_RULE)
    elif message.sleep is not None:
        runtime = SleepRuntime(duration_ms=message.sleep.duration_ms)
    elif message.command is not None:
        runtime = CommandRuntime(argv=message.command.argv)
    elif message.container is not None:
        runtime = ContainerRuntime(image=message.container.image, argv=message.container.argv)
    return JobSpec(
        name=message.name,
        cpu_millis=message.cpu_millis,
        memory_mb=message.memory_mb,
        priority=message.priority,
        runtime=runtime,
    )
