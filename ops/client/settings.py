"""Where the client finds the cluster and what it presents: :class:`ClientSettings`, found as
``stockade``'s commands find them (:mod:`ops.config`; the order: docs/design.md, "Where a client
finds the cluster"). Mutual TLS with the ``operator`` certificate by default; plaintext only when
asked (``insecure=True``, ``$STOCKADE_INSECURE=1``, the config, a local ``--insecure`` cluster).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from ops.config import DEFAULT_TIMEOUT_S
from runtime.errors import InvalidArgument
from runtime.tls import TlsFiles

__all__ = ["DEFAULT_BUSY_RETRY_S", "DEFAULT_TIMEOUT_S", "ClientSettings"]
DEFAULT_BUSY_RETRY_S = 30.0
"""How long one call keeps asking again, backing off, while every control plane answers busy,
in seconds (``stockade``'s)."""


def _addresses(value: Sequence[str]) -> tuple[str, ...]:
    return tuple(value)


def _positive_s(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise InvalidArgument(attribute.name, value, "must be a finite number of seconds > 0")


def _non_negative_s(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 <= value < math.inf):
        raise InvalidArgument(attribute.name, value, "must be a finite number of seconds >= 0")


@attrs.frozen(kw_only=True)
class ClientSettings:
    """What a client needs to call the cluster: :meth:`find` finds it as ``stockade`` does.

    Raises:
        InvalidArgument: a timeout out of range (addresses are checked by the client).
    """

    control_planes: tuple[str, ...] = attrs.field(converter=_addresses)
    """``host:port`` of every control plane (any sequence is kept as a tuple), asked in order,
    the one that answered last first."""
    tls: TlsFiles | None
    """This client's certificate, its key and the cluster CA (mutual TLS: the client accepts
    only servers with a ``control-plane`` certificate of that CA); None: plaintext, for a
    cluster run with ``--insecure``."""
    timeout_s: float = attrs.field(default=DEFAULT_TIMEOUT_S, validator=_positive_s)
    """Deadline of one call to one control plane, in seconds (a slow read is then also asked of
    the next replica; a write moves on)."""
    busy_retry_s: float = attrs.field(default=DEFAULT_BUSY_RETRY_S, validator=_non_negative_s)
    """How long one call keeps asking again, with capped exponential backoff and full jitter,
    while every control plane answers busy, in seconds (0: ask each once)."""

    @classmethod
    def find(
        cls,
        control_planes: str | Sequence[str] | None = None,
        *,
        insecure: bool = False,
        identity: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        busy_retry_s: float = DEFAULT_BUSY_RETRY_S,
    ) -> ClientSettings:
        """The settings ``stockade``'s commands would use (see the module docstring).

        Args:
            control_planes: ``"host:port,host:port"`` or a sequence of ``host:port``; None:
                found as ``stockade`` finds them.
            insecure: plaintext, no certificate; False: mutual TLS unless the environment or
                the config says ``insecure``.
            identity: the client certificate to present (``operator``, ``viewer``); None:
                ``$STOCKADE_IDENTITY``, else the config's ``identity``, else ``operator``.
            timeout_s: see :attr:`timeout_s`.
            busy_retry_s: see :attr:`busy_retry_s`.

        Raises:
            ops.config.ClusterError: no source names any control plane, or cluster.json or
                the user config cannot be read.
            InvalidArgument: an address is not ``host:port``, or a timeout is out of range.
        """
        from ops.config import resolve_addresses, resolve_client_tls

        option = (
            control_planes
            if control_planes is None or isinstance(control_planes, str)
            else ",".join(control_planes)
        )
        addresses = resolve_addresses(option)
        tls = None if insecure else resolve_client_tls(identity=identity)
        return cls(control_planes=addresses, tls=tls, timeout_s=timeout_s, busy_retry_s=busy_retry_s)
