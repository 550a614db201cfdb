"""Capped exponential backoff with full jitter, for clients that retry a busy service.

"Full jitter" from Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog
(2015): the n-th wait is drawn uniformly from ``[0, min(cap, base * 2**n)]``. Spreading the
waits over the whole interval, not around its end, is what keeps many clients that were
refused at the same moment from coming back at the same moment; of the variants the article
compares, it does the least work in total for about the same completion time.
"""

from __future__ import annotations

import math
import random

import attrs

from runtime.errors import InvalidArgument


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(attribute.name, value, "must be a finite number > 0")


@attrs.frozen(kw_only=True)
class FullJitterBackoff:
    """The waits between attempts: uniform in ``[0, min(cap_s, base_s * 2**attempt)]``.

    Args:
        base_s: the ceiling of the first wait, in seconds.
        cap_s: the ceiling no wait exceeds, in seconds.

    Raises:
        InvalidArgument: ``base_s`` or ``cap_s`` is not > 0.
    """

    base_s: float = attrs.field(default=0.1, validator=_positive)
    cap_s: float = attrs.field(default=2.0, validator=_positive)

    def ceiling_s(self, attempt: int) -> float:
        """The largest wait after ``attempt`` failed rounds (0 for the first wait), in seconds."""
        # 2**attempt overflows a float past attempt 1023; the cap is reached long before.
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt, 1023))

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """A wait for after ``attempt`` failed rounds, drawn with ``rng``, in seconds."""
        return rng.uniform(0.0, self.ceiling_s(attempt))
