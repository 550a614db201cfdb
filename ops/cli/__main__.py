"""``python -m ops.cli``: how the local cluster launcher starts its processes."""

import sys

try:
    from ops.cli import main
except KeyboardInterrupt:  # Ctrl-C while the CLI itself loads: one line, not a traceback
    print("interrupted: nothing was started", file=sys.stderr)
    sys.exit(130)

main()
