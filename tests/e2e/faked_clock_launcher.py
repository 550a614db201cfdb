"""Test-only launcher: runs ``ops.cli``, an agent under libfaketime.

Started as ``python tests/e2e/faked_clock_launcher.py ops.cli agent --id w-1 ...`` by a
LocalCluster whose ``launcher`` points here (the ``ops.cli`` argument keeps the process
recognisable). With ``$STOCKADE_TEST_FAKETIME_LIB`` (libfaketime's path) and
``$STOCKADE_TEST_FAKETIME_FILE`` set, an agent process is executed again, the same command line,
with libfaketime preloaded: its wall clock is the true one moved by the offset in that file
(``+600``, ``-600``: seconds), read again at every call (``FAKETIME_NO_CACHE``), so a test steps
it while a job runs; its monotonic clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as on
a machine whose wall clock is off or stepped by NTP. Its jobs' reapers get a clean environment:
they run on the true clock. Every other process starts at once, on the true clock.
"""

import os
import sys

args = sys.argv[2:]
lib = os.environ.get("STOCKADE_TEST_FAKETIME_LIB")
offset_file = os.environ.get("STOCKADE_TEST_FAKETIME_FILE")
if lib and offset_file and args[:1] == ["agent"] and "FAKETIME_TIMESTAMP_FILE" not in os.environ:
    env = dict(
        os.environ,
        LD_PRELOAD=lib,
        FAKETIME_TIMESTAMP_FILE=offset_file,
        FAKETIME_NO_CACHE="1",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    os.execve(sys.executable, [sys.executable, *sys.argv], env)

from ops.cli import main  # noqa: E402 (after the exec: this process may be replaced)

sys.argv = [sys.argv[0], *args]
main()
