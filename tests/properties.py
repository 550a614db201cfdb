"""How many examples a property test draws: what its ``@settings`` asks for in the whole suite
(``just test``), at most :data:`FAST_EXAMPLES` in the edit loop (``just test-fast``, which sets
``STOCKADE_TEST_PROFILE=fast``; tests/conftest.py loads Hypothesis' profile of the same name for
the tests that keep Hypothesis' default count)."""

from __future__ import annotations

import os

PROFILE_ENV = "STOCKADE_TEST_PROFILE"
"""``fast``: the edit loop's few examples; anything else (or unset): the whole suite's."""

FAST_EXAMPLES = 10
"""The most examples a property test draws in the edit loop."""


def fast() -> bool:
    """Whether this run is the edit loop's."""
    return os.environ.get(PROFILE_ENV) == "fast"


def examples(count: int) -> int:
    """``count`` in the whole suite; at most :data:`FAST_EXAMPLES` in the edit loop."""
    return min(count, FAST_EXAMPLES) if fast() else count
