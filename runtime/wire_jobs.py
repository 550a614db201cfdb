"""A job's spec on the wire: :class:`runtime.jobs.JobSpec` <-> ``pb.JobSpec``.

The one place the protobuf shape of a job meets the domain's (the runtime is the message's
``runtime`` oneof); every gRPC boundary that carries a spec converts it here. Nothing is
checked here but the oneof; the rules are :meth:`JobSpec.check`'s.
"""

from __future__ import annotations

import attrs

from protocol import pb
from runtime.constraints import Constraint
from runtime.errors import InvalidArgument
from runtime.jobs import (
    DEFAULT_RETRY_BACKOFF_S,
    RUNTIME_RULE,
    ArrayRange,
    CommandRuntime,
    ContainerRuntime,
    JobRuntime,
    JobSpec,
    SleepRuntime,
)


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds on the wire (a value the spec refuses is sent as it is
    rounded, so the control plane refuses it in turn)."""
    return max(0, round(seconds * 1000)) if seconds == seconds else 0


def job_spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    """``spec`` as a ``JobSpec`` message (no runtime set when ``spec.runtime`` is None)."""
    message = pb.JobSpec(
        name=spec.name,
        cpu_millis=spec.cpu_millis,
        memory_mb=spec.memory_mb,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        retry_backoff_ms=_ms(spec.retry_backoff_s),
        count_lost=spec.count_lost,
        timeout_ms=0 if spec.timeout_s is None else _ms(spec.timeout_s),
        constraints=[pb.Constraint(key=c.key, op=c.op, values=list(c.values)) for c in spec.constraints],
        env=dict(spec.env),
        workdir=spec.workdir,
        after=list(spec.after),
        retry_on_exit=[max(0, c) for c in spec.retry_on_exit],
        no_retry_on=list(spec.no_retry_on),
        after_names=list(spec.after_names),
        resources=[pb.ResourceCount(name=name, count=count) for name, count in spec.resources],
        tasks=spec.tasks or 0,
        spread=spec.spread,
    )
    if spec.array is not None:
        message.array = pb.JobArray(**attrs.asdict(spec.array))
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

    A message that sets no runtime gives a spec whose runtime is None. One that sets several
    (betterproto2 keeps them all) is refused (InvalidArgument, field ``runtime``, value
    ``"both"``), or with ``strict=False`` (an agent, which refuses it as ``bad_spec``) read as
    naming none.
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
    backoff_ms = message.retry_backoff_ms
    return JobSpec(
        name=message.name,
        cpu_millis=message.cpu_millis,
        memory_mb=message.memory_mb,
        priority=message.priority,
        runtime=runtime,
        max_attempts=message.max_attempts or 1,
        retry_backoff_s=DEFAULT_RETRY_BACKOFF_S if backoff_ms is None else backoff_ms / 1000,
        count_lost=message.count_lost,
        timeout_s=message.timeout_ms / 1000 if message.timeout_ms else None,
        constraints=tuple(
            Constraint(key=c.key, op=c.op, values=tuple(c.values)) for c in message.constraints
        ),
        env=dict(message.env),
        workdir=message.workdir,
        after=tuple(message.after),
        resources=[(r.name, r.count) for r in message.resources],
        array=None
        if message.array is None
        else ArrayRange(
            first_index=message.array.first_index,
            last_index=message.array.last_index,
            max_running=message.array.max_running,
            max_failed_tasks=message.array.max_failed_tasks,
        ),
        retry_on_exit=tuple(message.retry_on_exit),
        no_retry_on=tuple(message.no_retry_on),
        after_names=tuple(message.after_names),
        tasks=message.tasks or None,
        spread=message.spread,
    )
