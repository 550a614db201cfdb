"""Test-only launcher for the negative control: runs ``ops.cli`` with the ledger's fencing off.

Started as ``python tests/e2e/unfenced_launcher.py ops.cli cp --id ...`` by a LocalCluster whose
``launcher`` points here (the ``ops.cli`` argument keeps the process recognisable). Nothing an
operator runs can reach this switch.
"""

import sys

import actors.ledger
from ops.cli import main

actors.ledger._FENCING_ENABLED = False
sys.argv = [sys.argv[0], *sys.argv[2:]]
main()
