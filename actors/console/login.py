"""The console's login check: the bearer token of a request, against the cluster CA
(:mod:`runtime.console_token`; docs/console.md, "Identity")."""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
from cryptography import x509

from runtime.console_token import TokenRefused, audience_of, verify_token
from runtime.tls import Identity

__all__ = ["TokenCheck"]


@attrs.define
class TokenCheck:
    """Checks the login tokens of requests (:mod:`runtime.console_token`) against the cluster CA.

    Args:
        ca_pem: the cluster CA's certificate, PEM.
        max_lifetime_s: the longest token lifetime accepted, in seconds.
        clock: the wall clock, Unix seconds.
    """

    ca_pem: bytes
    max_lifetime_s: float
    clock: Callable[[], float] = time.time
    _ca: x509.Certificate = attrs.field(init=False)
    _audience: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._ca = x509.load_pem_x509_certificate(self.ca_pem)
        self._audience = audience_of(self.ca_pem)

    def identity(self, authorization: str | None) -> Identity:
        """Who an ``Authorization`` header's bearer token names.

        Raises:
            TokenRefused: no bearer token, or one :func:`runtime.console_token.verify_token` refuses.
        """
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise TokenRefused("the request carries no login token")
        claims = verify_token(
            token.strip(),
            ca=self._ca,
            audience=self._audience,
            now_unix_s=self.clock(),
            max_lifetime_s=self.max_lifetime_s,
        )
        return claims.identity
