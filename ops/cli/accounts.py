"""``stockade account``: each account's quotas, priority cap and fair-share weight, set by an operator and
read with what the account uses now, through the Python client (docs/quotas.md). Only light
modules are imported at the top.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ops.cli.base import command_group
from ops.cli.common import control_plane_addresses, errors, with_client
from ops.cli.options import ControlPlanesOption, JsonOption, quiet_option

account_app = command_group(
    "account",
    "Accounts' quotas (cpu_millis, memory_mb, max pending jobs), priority caps and fair-share weights.",
)


@account_app.command("set")
def set_account(
    name: Annotated[str, typer.Argument(help="The account (a user's id).")],
    cpu_millis: Annotated[
        int | None, quiet_option(help="Cap on the cpu_millis its assigned and running jobs hold.")
    ] = None,
    memory_mb: Annotated[
        int | None, quiet_option(help="Cap on the memory_mb its assigned and running jobs hold.")
    ] = None,
    max_pending: Annotated[
        int | None, quiet_option(help="Cap on its pending and waiting jobs; a submission past it is refused.")
    ] = None,
    max_priority: Annotated[
        int | None,
        quiet_option(
            help="The highest priority its users' jobs may have (0 unless set; operators are not capped)."
        ),
    ] = None,
    weight: Annotated[float | None, quiet_option(help="Its fair-share weight (> 0; 1 unless set).")] = None,
    clear_cpu_millis: Annotated[bool, typer.Option(help="Remove the cpu_millis cap.")] = False,
    clear_memory_mb: Annotated[bool, typer.Option(help="Remove the memory_mb cap.")] = False,
    clear_max_pending: Annotated[bool, typer.Option(help="Remove the max_pending cap.")] = False,
    clear_max_priority: Annotated[
        bool, typer.Option(help="Remove the max_priority (back to the default, 0).")
    ] = False,
    as_json: JsonOption = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Set an account's caps, priority cap and weight (operators only); what is not given keeps
    its value.

    A cap of 0 lets nothing of it be used (or queued); --clear-* removes a cap. --max-priority
    caps the priority of the jobs its users submit. The change is written to the audit trail
    (action account_set).
    """
    clears = {
        "cpu_millis": clear_cpu_millis,
        "memory_mb": clear_memory_mb,
        "max_pending": clear_max_pending,
        "max_priority": clear_max_priority,
    }
    with errors():
        # The client checks the change (runtime.accounts.AccountChange) before it sends.
        account = with_client(
            control_plane_addresses(control_planes),
            lambda client: client.set_account(
                name,
                cpu_millis=cpu_millis,
                memory_mb=memory_mb,
                max_pending=max_pending,
                max_priority=max_priority,
                weight=weight,
                clear=[cap for cap, on in clears.items() if on],
            ),
        )
    _show([account], as_json=as_json, one=True)


@account_app.command("show")
def show_account(
    name: Annotated[str, typer.Argument(help="The account.")],
    as_json: JsonOption = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Show an account's caps, priority cap, weight and what it uses now (one never set: no caps,
    max priority 0, weight 1)."""
    with errors():
        from runtime.identifiers import check_id

        check_id(name, field="name")
        account = with_client(control_plane_addresses(control_planes), lambda client: client.account(name))
    _show([account], as_json=as_json, one=True)


@account_app.command("list")
def list_accounts(as_json: JsonOption = False, control_planes: ControlPlanesOption = None) -> None:
    """List every account with caps set or with jobs queued or in use (a user: its own), each
    cap beside what the account uses now. --json prints {"accounts": [...]}."""
    with errors():
        accounts = with_client(control_plane_addresses(control_planes), lambda client: client.accounts())
    _show(list(accounts), as_json=as_json, one=False)


def _show(accounts: list, *, as_json: bool, one: bool) -> None:  # type: ignore[type-arg]
    from ops.cli.render import account_json, print_accounts

    if as_json:
        shown = account_json(accounts[0]) if one else {"accounts": [account_json(a) for a in accounts]}
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")
        return
    print_accounts(accounts)
