"""``stockade audit``: the audit trail, through the Python client (:mod:`ops.client`): who
changed what, when and from where (docs/accounts.md). Only light modules are imported at the top.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ops.cli.base import app
from ops.cli.common import control_plane_addresses, errors, with_client
from ops.cli.options import ControlPlanesOption, JsonOption, quiet_option
from runtime import validation


@app.command("audit")
def audit(
    account: Annotated[
        str | None, quiet_option(help="Only this account's rows (a user reads its own only).")
    ] = None,
    action: Annotated[
        str | None, quiet_option(help=f"Only this action ({', '.join(validation.AUDIT_ACTIONS)}).")
    ] = None,
    since_s: Annotated[
        float | None, quiet_option("--since-s", help="Only rows of the last this many seconds.")
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=0,
            max=validation.MAX_LIST_LIMIT,
            help="At most this many rows, newest first (0: 100, as the API counts it).",
        ),
    ] = 50,
    as_json: JsonOption = False,
    control_planes: ControlPlanesOption = None,
) -> None:
    """Show the audit trail, newest first: each submit, cancel, cordon, uncordon and drain, who
    made it (role and id), the account, the address it came from and what it named.

    Operators and viewers read every account's rows (a viewer scoped to an account, that
    account's); a user reads its own. --json prints {"entries": [...]}.
    """
    with errors():
        validation.check_audit_query(action or "", since_s, limit)
        if account is not None:
            from runtime.identifiers import check_id

            check_id(account, field="account")
        entries = with_client(
            control_plane_addresses(control_planes),
            lambda client: client.audit(account=account, action=action, since_s=since_s, limit=limit),
        )
    if as_json:
        from ops.cli.render import audit_json

        sys.stdout.write(json.dumps(audit_json(entries), indent=2) + "\n")
        return
    from ops.cli.render import print_audit

    print_audit(entries)
