"""Which replica a client asks first: its home (:func:`home_index` of a key, so clients spread
over the replicas) or the one that answered last, and back home after ``home_return_s``
(:class:`Route`)."""

from __future__ import annotations

import hashlib

import attrs
import trio

from runtime.errors import InvalidArgument

HOME_RETURN_S = 30.0
"""How long a client with a home replica (:class:`ControlPlaneClient`, ``home_key``) stays
with the replica it moved on to before it tries its home first again, in seconds."""


def home_index(key: str, replicas: int) -> int:
    """The home replica of ``key`` among ``replicas`` (>= 1) control planes: the first 8 bytes
    of the BLAKE2b digest of ``key`` (UTF-8), big-endian, modulo ``replicas`` (stable across
    processes, unlike ``hash()``)."""
    if replicas < 1:
        raise InvalidArgument("replicas", replicas, "must be >= 1")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % replicas


@attrs.define
class Route:
    """Which replica a walk asks first, for one client or for one ``home_key`` of a shared one.

    The replica that answered last is asked first, except that a route with a home replica
    starts at home again once ``home_return_s`` has passed since another replica answered. So
    a replica that comes back gets its share of the load within ``home_return_s``, and one that
    stays slow costs each of its routes one hedged call per ``home_return_s``.
    """

    home: int | None
    """Index of the home replica; None: no home (start at 0, stay where answered)."""
    home_return_s: float
    preferred: int = 0
    left_home_at: float | None = None
    """Trio time when a replica other than home last took over as the preferred one."""

    def __attrs_post_init__(self) -> None:
        self.preferred = self.home or 0

    def start_index(self) -> int:
        """The replica a walk asks first (see the class docstring)."""
        if (
            self.home is not None
            and self.preferred != self.home
            and self.left_home_at is not None
            and trio.current_time() - self.left_home_at >= self.home_return_s
        ):
            self.preferred = self.home
            self.left_home_at = None
        return self.preferred

    def answered_by(self, index: int) -> None:
        """Replica ``index`` answered: it is asked first from now on."""
        if index == self.home:
            self.left_home_at = None  # home again
        elif self.left_home_at is None:
            self.left_home_at = trio.current_time()  # moved away: the clock starts
        self.preferred = index
