"""Parsers of the identity-like fields: ids (:func:`check_id`), addresses (:func:`parse_address`,
:func:`parse_host`, :func:`parse_addresses`) and labels (:func:`check_labels`).

One parser per kind of field, used wherever such a field is accepted. A value is taken whole or
refused with :class:`runtime.errors.InvalidArgument` naming the field, the value and the rule;
nothing is trimmed, decoded or guessed at. The rules: docs/design.md, "Ids, addresses and
labels".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence

import attrs

from runtime.errors import InvalidArgument

MAX_ID_CHARS = 64
ID_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_ID_CHARS - 1}}}")
ID_RULE = f"must be 1-{MAX_ID_CHARS} characters of A-Z a-z 0-9 . _ - starting with a letter or digit"

MAX_HOST_NAME_CHARS = 253
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
MAX_PORT = 65535

MAX_LABELS = 64
MAX_LABEL_NAME_CHARS = 63
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def check_id(value: str, *, field: str) -> str:
    """``value`` if it is an id (1-64 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit);
    else InvalidArgument naming ``field`` (e.g. ``"worker_id"``)."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise InvalidArgument(field, value, ID_RULE)
    return value


def is_host_name(text: str) -> bool:
    """Whether ``text`` is a host name as RFC 1123 section 2.1 allows (see the module docstring)."""
    return _is_dns_name(text) and not text.rpartition(".")[2].isdigit()


def _is_dns_name(text: str) -> bool:
    """1-253 characters of dot-separated labels of 1-63 letters, digits and inner hyphens."""
    return 0 < len(text) <= MAX_HOST_NAME_CHARS and all(_HOST_LABEL.fullmatch(x) for x in text.split("."))


@attrs.frozen
class Address:
    """A parsed ``host:port``: ``host`` without brackets (an IPv6 address is bare here, as
    sockets and gRPC channels take it), ``port`` 1-65535. ``str()`` writes it back, an IPv6
    host in brackets."""

    host: str
    port: int

    def __str__(self) -> str:
        return format_address(self.host, self.port)


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 ``host`` in brackets (``[::1]:7101``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


HOST_RULE = "an IPv4 address, an IPv6 address or an RFC 1123 host name"
ADDRESS_HOST_RULE = "an IPv4 address, an IPv6 address in brackets or an RFC 1123 host name"


def parse_host(text: str, *, field: str) -> str:
    """``text`` if it is a host on its own: an IPv4 address, a bare IPv6 address (``::1``) or
    an RFC 1123 host name (for a listening socket); else InvalidArgument naming ``field``."""
    if isinstance(text, str) and (_is_ipv4(text) or _is_ipv6(text) or is_host_name(text)):
        return text
    raise InvalidArgument(field, text, f"must be {HOST_RULE}")


def parse_address(text: str, *, field: str = "address") -> Address:
    """``text`` as ``host:port`` (``"127.0.0.1:7101"``, ``"[::1]:7101"``, ``"w-1.example:7201"``).

    Raises:
        InvalidArgument: ``text`` is not such an address; the rule names the part at fault.
    """
    if not isinstance(text, str):
        raise InvalidArgument(field, text, "must be a host:port string")
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidArgument(field, text, "must be host:port")
    if not _PORT.fullmatch(port) or int(port) > MAX_PORT:
        raise InvalidArgument(
            field, text, f"must be host:port with a port in 1..{MAX_PORT} written without leading zeros"
        )
    if host.startswith("[") and host.endswith("]") and _is_ipv6(host[1:-1]):
        return Address(host[1:-1], int(port))
    if _is_ipv4(host) or is_host_name(host):
        return Address(host, int(port))
    raise InvalidArgument(field, text, f"must be host:port with a host that is {ADDRESS_HOST_RULE}")


DATABASE_URL_SCHEMES = ("postgresql", "postgres")


def check_database_url(url: str, *, field: str = "database_url") -> str:
    """``url`` if asyncpg can take it as a database URL: ``postgresql://`` (or ``postgres://``),
    then optionally ``user[:password]@``, then hosts: none (the defaults), one, or several
    separated by commas for a multi-host URL (``host1:5432,host2:5432``), each with an optional
    port in 1..65535; a database and query options may follow. Errors show the URL with its
    password replaced by ``***``.

    Raises:
        InvalidArgument: it is not such a URL; the rule names the part at fault.
    """
    if not isinstance(url, str):
        raise InvalidArgument(field, url, "must be a postgresql:// URL string")
    shown = url_without_password(url)
    example = "postgresql://user@host:5432/database"
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in DATABASE_URL_SCHEMES:
        raise InvalidArgument(field, shown, f"must be a postgresql:// URL, e.g. {example}")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    hosts = netloc.rpartition("@")[2]
    for item in hosts.split(",") if hosts else []:
        host, port = item, ""
        if item.startswith("["):
            end = item.find("]")
            host, port = item[1 : end if end > 0 else len(item)], item[end + 1 :].removeprefix(":")
            if end < 0 or not _is_ipv6(host):
                raise InvalidArgument(field, shown, f"must name hosts that are {HOST_RULE} ({item!r} is not)")
        elif ":" in item:
            host, _, port = item.rpartition(":")
        if not (_is_ipv4(host) or _is_ipv6(host) or is_host_name(host)):
            raise InvalidArgument(field, shown, f"must name hosts that are {HOST_RULE} ({host!r} is not)")
        if port and (not _PORT.fullmatch(port) or int(port) > MAX_PORT):
            raise InvalidArgument(field, shown, f"must give ports in 1..{MAX_PORT} ({port!r} is not)")
    return url


def url_without_password(url: str) -> str:
    """``url`` with the password of its user part, if any, replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}{sep}{user}:***@{hosts}{slash}{tail}"


def parse_addresses(texts: Sequence[str], *, field: str) -> tuple[Address, ...]:
    """Every item of ``texts`` as an address; an error names the item's index (``control_planes[1]``)."""
    return tuple(parse_address(text, field=f"{field}[{index}]") for index, text in enumerate(texts))


def check_label_key(key: str, *, field: str = "labels key") -> str:
    """``key`` if it is a label key, ``[prefix/]name``; else InvalidArgument naming ``field``."""
    rule = (
        f"must be a name of 1-{MAX_LABEL_NAME_CHARS} characters of A-Z a-z 0-9 - _ . starting and "
        f"ending with a letter or digit, optionally after a lower-case DNS subdomain and a slash"
    )
    if not isinstance(key, str):
        raise InvalidArgument(field, key, rule)
    prefix, slash, name = key.rpartition("/")
    if slash and not (_is_dns_name(prefix) and prefix == prefix.lower()):
        raise InvalidArgument(field, key, rule)
    if not _LABEL_NAME.fullmatch(name):
        raise InvalidArgument(field, key, rule)
    return key


def check_label_value(value: str, *, field: str) -> str:
    """``value`` if it is a label value, empty or a name as a key's; else InvalidArgument
    naming ``field`` (e.g. ``"labels[zone]"``)."""
    if not isinstance(value, str) or (value and not _LABEL_NAME.fullmatch(value)):
        raise InvalidArgument(
            field,
            value,
            f"must be empty or 1-{MAX_LABEL_NAME_CHARS} characters of A-Z a-z 0-9 - _ . starting and "
            f"ending with a letter or digit",
        )
    return value


def check_labels(labels: Mapping[str, str], *, field: str = "labels") -> dict[str, str]:
    """``labels`` as a dict, if it has at most :data:`MAX_LABELS` and every key and value is
    one (:func:`check_label_key`, :func:`check_label_value`).

    Raises:
        InvalidArgument: too many labels, or a bad key (``labels key``) or value (``labels[zone]``).
    """
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(field, len(labels), f"must have at most {MAX_LABELS} labels")
    for key, value in labels.items():
        check_label_key(key, field=f"{field} key")
        check_label_value(value, field=f"{field}[{key}]")
    return dict(labels)


def _is_ipv4(text: str) -> bool:
    try:
        return bool(ipaddress.IPv4Address(text))
    except ValueError:
        return False


def _is_ipv6(text: str) -> bool:
    try:  # a zone (fe80::1%eth0) only means something on the machine that wrote it
        return "%" not in text and bool(ipaddress.IPv6Address(text))
    except ValueError:
        return False


def parse_labels(
    items: Sequence[str], *, field: str = "--label", reserved: Sequence[str] = ("container",)
) -> dict[str, str]:
    """Labels from ``key=value`` items (a command line's repeated ``--label``), each checked;
    ``reserved``: keys the agent sets itself, refused here.

    Raises:
        InvalidArgument: an item without ``=``, a bad key or value, a key given twice or
            reserved, or more than :data:`MAX_LABELS`.
    """
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidArgument(field, item, "must be key=value")
        check_label_key(key, field=f"{field} key")
        check_label_value(value, field=f"{field} {key}")
        if key in reserved:
            raise InvalidArgument(f"{field} key", key, "is set by the agent itself")
        if key in labels:
            raise InvalidArgument(f"{field} key", key, "must be given once")
        labels[key] = value
    return check_labels(labels, field=field)
