"""``python -m ops.cli``: how the local cluster launcher starts its processes."""

from ops.cli import main

main()
