"""Test-only launcher: runs ``ops.cli``, holding an agent back while its hold file exists.

Started as ``python tests/e2e/held_launcher.py ops.cli agent --id w-4 ...`` by a LocalCluster
whose ``launcher`` points here (the ``ops.cli`` argument keeps the process recognisable). An
agent whose id has a file ``hold-<id>`` in ``$STOCKADE_TEST_HOLD_DIR`` waits until that file is
gone before it starts: a worker slow to come back, as one is on a loaded machine. Every other
process starts at once.
"""

import os
import sys
import time
from pathlib import Path

args = sys.argv[2:]
hold_dir = os.environ.get("STOCKADE_TEST_HOLD_DIR")
if hold_dir and args[:1] == ["agent"] and "--id" in args:
    hold = Path(hold_dir) / f"hold-{args[args.index('--id') + 1]}"
    while hold.exists():
        time.sleep(0.05)

from ops.cli import main  # noqa: E402 (after the hold: the import is most of a start-up)

sys.argv = [sys.argv[0], *args]
main()
