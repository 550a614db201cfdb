"""``stockade schedule``: periodic jobs (docs/schedules.md), through the Python client. ``add``
takes ``submit``'s job options (the same declarations, read from :func:`ops.cli.jobs.submit`)
but ``--after`` and ``--array``.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ops.cli import jobs as job_commands
from ops.cli.base import command_group
from ops.cli.common import (
    answer_unknown,
    console,
    control_plane_addresses,
    errors,
    idempotency_key_of,
    with_client,
)
from ops.cli.fast import spec_of_submit_options
from ops.cli.options import ControlPlanesOption, IdempotencyKeyOption, JsonOption, quiet_option

if TYPE_CHECKING:
    from ops.client import Schedule

schedule_app = command_group(
    "schedule", "Periodic jobs: one job per slot of a cron expression in a time zone, each slot fired once."
)

NOT_FOR_SCHEDULES = (
    "after",
    "array",
    "max_failed_tasks",
    "tasks",
    "spread",
    "idempotency_key",
    "control_planes",
)
"""``submit``'s parameters ``schedule add`` does not take from it: a schedule's job waits for no
other and is no array (so has no max_failed_tasks) and no gang; the key and the control planes
it declares itself (after the job's)."""

_ADD_OWN: list[inspect.Parameter] = [
    inspect.Parameter(
        "schedule_name",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[
            str,
            typer.Argument(
                metavar="NAME",
                help="The schedule's name (1-64 of A-Z a-z 0-9 . _ -), unique in the cluster.",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "cron",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[
            str,
            typer.Option(
                help="When: 5 fields (minute hour day-of-month month day-of-week), 6 with a leading "
                "second field ('*/2 * * * * *': every 2 s), or @hourly, @daily, @weekly, @monthly.",
                show_default=False,
            ),
        ],
    ),
    inspect.Parameter(
        "tz",
        inspect.Parameter.KEYWORD_ONLY,
        default="UTC",
        annotation=Annotated[str, typer.Option(help="The IANA time zone the cron is read in.")],
    ),
    inspect.Parameter(
        "concurrency_policy",
        inspect.Parameter.KEYWORD_ONLY,
        default="allow",
        annotation=Annotated[
            str,
            typer.Option(
                help="allow: fire whatever runs; forbid: skip a slot while the last job has not "
                "ended; replace: cancel it and fire (Kubernetes CronJob's)."
            ),
        ],
    ),
    inspect.Parameter(
        "starting_deadline_s",
        inspect.Parameter.KEYWORD_ONLY,
        default=60,
        annotation=Annotated[
            int,
            typer.Option(
                help="A slot missed (no leader, an outage) still fires this many seconds after its "
                "time, at most; later it is recorded missed (1-604800)."
            ),
        ],
    ),
]


def add(**options: Any) -> None:
    """Add a periodic job (NAME --cron EXPR [--tz ZONE] [job options] -- CMD ARGS...): the
    leader fires one job per slot, each slot once, owned by this caller's account; print it."""
    with errors():
        spec = spec_of_submit_options(options)
        key = idempotency_key_of(options["idempotency_key"])
        with answer_unknown(key, "stored the schedule"):
            schedule = with_client(
                control_plane_addresses(options["control_planes"]),
                lambda client: client.add_schedule(
                    options["schedule_name"],
                    cron=options["cron"],
                    tz=options["tz"],
                    job=spec,
                    concurrency_policy=options["concurrency_policy"],
                    starting_deadline_s=options["starting_deadline_s"],
                    idempotency_key=key,
                ),
            )
    _print([schedule], as_json=options["as_json"])


def _add_signature() -> inspect.Signature:
    submit = inspect.signature(job_commands.submit, eval_str=True).parameters
    job = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for name, p in submit.items()
        if name not in NOT_FOR_SCHEDULES
    ]
    tail = [
        submit["idempotency_key"].replace(kind=inspect.Parameter.KEYWORD_ONLY),
        inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOption),
        submit["control_planes"].replace(kind=inspect.Parameter.KEYWORD_ONLY),
    ]
    return inspect.Signature([*_ADD_OWN, *job, *tail], return_annotation=None)


add.__signature__ = _add_signature()  # type: ignore[attr-defined]
add.__annotations__ = {p.name: p.annotation for p in add.__signature__.parameters.values()}  # type: ignore[attr-defined]
# Options may follow NAME; the command comes after `--` (its own options are then its own).
schedule_app.command("add")(add)


@schedule_app.command("list")
def list_schedules(
    account: Annotated[
        str | None, quiet_option(help="Only this account's (default: all you may see).")
    ] = None,
    as_json: JsonOption = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Every schedule: name, cron, time zone, policy, paused, last slot, next slot (in its zone
    and UTC), jobs fired and slots skipped."""
    with errors():
        found = with_client(
            control_plane_addresses(control_planes), lambda client: client.schedules(account=account)
        )
    _print(list(found), as_json=as_json)


NameArgument = Annotated[str, typer.Argument(help="The schedule's name.", show_default=False)]


def _change_command(verb: str, summary: str) -> None:
    """Register ``stockade schedule <verb>``, which calls the client's ``<verb>_schedule`` on the
    schedule named and prints it as ``list`` does; ``summary`` is its help."""

    def change(
        name: NameArgument,
        idempotency_key: IdempotencyKeyOption = None,
        as_json: JsonOption = False,
        control_planes: ControlPlanesOption = None,
    ) -> None:
        chosen = idempotency_key_of(idempotency_key)
        with errors(), answer_unknown(chosen, f"{verb}d the schedule"):
            schedule = with_client(
                control_plane_addresses(control_planes),
                lambda client: getattr(client, f"{verb}_schedule")(name, idempotency_key=chosen),
            )
        _print([schedule], as_json=as_json)

    change.__doc__ = summary
    schedule_app.command(verb)(change)


_change_command("pause", "Pause a schedule: none of its slots fires, or is recorded, until it is resumed.")
_change_command(
    "resume", "Resume a paused schedule: its slots start again after now (those of the pause never fire)."
)
_change_command("remove", "Remove a schedule and the record of its slots; the jobs it fired stay.")


def _when(at: dt.datetime | None, tz: str) -> str:
    """``at`` in the schedule's zone and in UTC; ``-`` for none."""
    if at is None:
        return "-"
    from runtime.schedules import zone

    local = at.astimezone(zone(tz))
    utc = at.astimezone(dt.UTC)
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({utc:%H:%M:%S} UTC)"


def _print(schedules: list[Schedule], *, as_json: bool) -> None:
    if as_json:
        rows = [
            {
                "id": s.id,
                "name": s.name,
                "cron": s.cron,
                "tz": s.tz,
                "concurrency_policy": s.concurrency_policy,
                "starting_deadline_s": s.starting_deadline_s,
                "paused": s.paused,
                "owner": s.owner,
                "last_slot_at": None if s.last_slot_at is None else s.last_slot_at.isoformat(),
                "next_slot_at": None if s.next_slot_at is None else s.next_slot_at.isoformat(),
                "fired": s.fired,
                "skipped": s.skipped,
                "last_job_id": s.last_job_id,
                "last_skip_reason": s.last_skip_reason,
            }
            for s in schedules
        ]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    from rich.table import Table

    table = Table(box=None)
    for column in ("name", "cron", "tz", "policy", "paused", "last slot", "next slot", "fired", "skipped"):
        table.add_column(column)
    for s in schedules:
        table.add_row(
            s.name,
            s.cron,
            s.tz,
            s.concurrency_policy,
            "yes" if s.paused else "no",
            _when(s.last_slot_at, s.tz),
            _when(s.next_slot_at, s.tz),
            str(s.fired),
            str(s.skipped),
        )
    console().print(table)
