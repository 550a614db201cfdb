"""Taking workers out of service, through the Python client (:mod:`ops.client`): ``cordon``,
``uncordon``, ``drain`` (docs/design.md, "Cordon, uncordon, drain"). Only light modules are
imported at the top.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from ops.cli.base import app
from ops.cli.common import (
    EXIT_INTERRUPTED,
    answer_unknown,
    console,
    control_plane_addresses,
    err_console,
    errors,
    idempotency_key_of,
    interrupted,
    with_client,
)
from ops.cli.options import ControlPlanesOption, IdempotencyKeyOption, quiet_option
from runtime import validation

if TYPE_CHECKING:
    from ops.client import Client, WorkerSchedule

DRAIN_POLL_S = 0.5
"""How often ``stockade drain`` asks for the worker's state while it waits, in seconds."""

WorkerIdArgument = Annotated[str, typer.Argument(help="The worker's id, as `stockade status` lists it.")]


def _jobs_text(job_ids: list[int], limit: int = 10) -> str:
    shown = " ".join(str(j) for j in job_ids[:limit])
    if len(job_ids) > limit:
        shown += f" +{len(job_ids) - limit} more"
    return f"{len(job_ids)} job{'' if len(job_ids) == 1 else 's'} ({shown})"


def schedule_line(
    worker_id: str,
    *,
    cordoned: bool,
    draining: bool,
    drained: bool,
    drain_deadline_unix_s: float,
    job_ids: list[int],
    unhealthy_reason: str = "",
) -> str:
    """One line on a worker's schedule, as the three commands print it, e.g. ``w-2: draining, 2
    jobs (12 13) left; stopped and placed elsewhere at 2026-12-01 12:00:00``; a worker marked
    unhealthy adds its reason."""
    if drained:
        line = f"{worker_id}: drained, no job left; its agent can be stopped"
    elif draining:
        if drain_deadline_unix_s:
            at = datetime.fromtimestamp(drain_deadline_unix_s).astimezone().strftime("%Y-%m-%d %H:%M:%S")
            then = f"stopped and placed elsewhere at {at}"
        else:
            then = "no deadline: waiting for them to end"
        line = f"{worker_id}: draining, {_jobs_text(job_ids)} left; {then}"
    elif cordoned:
        running = f"{_jobs_text(job_ids)} still there" if job_ids else "no job there"
        line = f"{worker_id}: cordoned, no new placements; {running}"
    else:
        line = f"{worker_id}: not cordoned, takes placements"
    if unhealthy_reason:
        line = line.replace(", takes placements", "") + f"; {unhealthy_reason}"
    return line


def _reply_line(reply: WorkerSchedule) -> str:
    return schedule_line(
        reply.worker_id,
        cordoned=reply.cordoned,
        draining=reply.draining,
        drained=reply.drained,
        drain_deadline_unix_s=reply.drain_deadline_unix_s or 0.0,
        job_ids=list(reply.job_ids),
        unhealthy_reason=reply.unhealthy_reason if reply.unhealthy else "",
    )


def _worker_call(what: str, worker_id: str, key: str | None, control_planes: str | None) -> None:
    """``cordon`` and ``uncordon``: one call of the client's method ``what``, one line."""

    def call(client: Client) -> Awaitable[WorkerSchedule]:
        method: Callable[..., Awaitable[WorkerSchedule]] = getattr(client, what)
        return method(worker_id, idempotency_key=checked_key)

    with errors():
        validation.check_worker_id(worker_id)
        checked_key = idempotency_key_of(key)
        with answer_unknown(checked_key, f"recorded the {what}"):
            reply = with_client(control_plane_addresses(control_planes), call)
    console().print(_reply_line(reply), markup=False, soft_wrap=True)


def _schedule_command(what: str, help_text: str) -> None:
    """Add ``stockade <what> WORKER_ID``, one call of the client's method ``what``; its help
    ``help_text``."""

    def command(
        worker_id: WorkerIdArgument,
        idempotency_key: IdempotencyKeyOption = None,
        control_planes: ControlPlanesOption = None,
    ) -> None:
        _worker_call(what, worker_id, idempotency_key, control_planes)

    command.__doc__ = help_text
    app.command(what)(command)


_schedule_command(
    "cordon",
    """Cordon a worker: nothing new is placed on it; its running jobs go on.

    The cordon belongs to the worker id: it outlasts the agent's restart and re-registration,
    until `stockade uncordon`. An unknown worker id exits 2.
    """,
)
_schedule_command(
    "uncordon",
    """Uncordon a worker: it takes placements again; a drain of it ends (what the drain stopped
    stays placed elsewhere), and so does a mark of it as unhealthy (`status` shows why a worker
    is unhealthy; its runs until now are not judged again).""",
)


async def _drain(
    client: Client, worker_id: str, *, deadline_s: float | None, wait_s: float | None, key: str
) -> str:
    """``stockade drain``'s call: drain the worker, then (unless ``wait_s`` is 0) print its line
    and read the cluster's status until it is drained, uncordoned meanwhile, or ``wait_s``
    passed (None: no limit); the worker's line as it was last read."""
    import trio

    from runtime.errors import TemporaryError

    reply = await client.drain(worker_id, deadline_s=deadline_s, idempotency_key=key)
    line = _reply_line(reply)
    if reply.drained or wait_s == 0:
        return line
    console().print(line, markup=False, soft_wrap=True)
    with trio.move_on_after(float("inf") if wait_s is None else wait_s):
        while True:
            await trio.sleep(DRAIN_POLL_S)
            with contextlib.suppress(TemporaryError):  # a replica failing over: ask again
                status = await client.status()
                info = next((w for w in status.workers if w.id == worker_id), None)
                if info is not None:
                    line = schedule_line(
                        worker_id,
                        cordoned=info.cordoned,
                        draining=info.draining,
                        drained=info.drained,
                        drain_deadline_unix_s=info.drain_deadline_unix_s or 0.0,
                        job_ids=list(info.job_ids),
                    )
                    if info.drained or not info.cordoned:  # drained, or uncordoned meanwhile
                        return line
    return line


@app.command("drain")
def drain(
    worker_id: WorkerIdArgument,
    deadline_s: Annotated[
        float | None,
        quiet_option(
            "--deadline-s",
            help="Seconds after which the jobs still running on the worker are stopped and placed "
            "elsewhere, with no attempt spent (0: at once; at most 604800, one week). Default: "
            "no deadline, wait for them to end on their own.",
        ),
    ] = None,
    wait_s: Annotated[
        float | None,
        quiet_option(
            "--wait-s",
            min=0,
            help="Seconds to wait for the worker to be drained before answering (0: answer at "
            "once). Default: until it is drained. The drain goes on either way.",
        ),
    ] = None,
    idempotency_key: IdempotencyKeyOption = None,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Drain a worker: cordon it, then wait for its jobs to end; at --deadline-s stop the rest
    and place them elsewhere (no attempt spent). Once drained, its agent can be stopped with
    nothing lost.

    Prints `W: drained` once no job is left on it, or `W: draining, ...` when --wait-s passed
    first (exit 0 either way; `stockade status` shows it). Ctrl-C stops the waiting, not the
    drain (exit 130); `stockade uncordon W` ends it. An unknown worker id or a deadline that is
    negative, NaN or over a week exits 2, and nothing is stored.
    """
    with errors():
        validation.check_worker_id(worker_id)
        if deadline_s is not None:
            validation.check_drain_deadline_s(deadline_s)
        key = idempotency_key_of(idempotency_key)
        try:
            with answer_unknown(key, "recorded the drain"):
                line = with_client(
                    control_plane_addresses(control_planes),
                    lambda client: _drain(client, worker_id, deadline_s=deadline_s, wait_s=wait_s, key=key),
                )
        except BaseException as exc:
            if not interrupted(exc):
                raise
            err_console().print(
                f"interrupted: stopped waiting; the drain of {worker_id} goes on (`stockade status` "
                f"shows it, `stockade uncordon {worker_id}` ends it)",
                markup=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_INTERRUPTED) from None
    console().print(line, markup=False, soft_wrap=True)
