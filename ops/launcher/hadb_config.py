"""What the HA PostgreSQL pair's processes are started with (:mod:`ops.launcher.hadb`): etcd's
command line and Patroni's configuration, as pure functions, and :class:`HaSettings` with
Patroni's timing rule.

Patroni runs ``synchronous_mode`` (only the synchronous standby may be promoted) and
``use_pg_rewind`` (with ``wal_log_hints`` and checksums, a former primary rejoins by rewinding);
TCP needs SCRAM-SHA-256, the unix socket in a 0700 folder is trusted; the REST API's GETs are
open locally, what changes the cluster needs a password.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ops.launcher.pg_secrets import PASSWORD_BYTES, PG_SUPERUSER
from ops.launcher.state import LISTEN_HOST

__all__ = [
    "REPLICATION_USER",
    "EtcdMember",
    "HaPasswords",
    "HaSettings",
    "PgMember",
    "etcd_argv",
    "patroni_config",
]

REPLICATION_USER = "replicator"
SCOPE = "stockade"
"""Patroni's cluster name (its etcd key prefix is ``/service/stockade``)."""


@attrs.frozen(kw_only=True)
class HaSettings:
    """Patroni's timings and replication mode (its ``bootstrap.dcs`` section).

    Patroni's rule: ``ttl >= 20``, ``loop_wait >= 1``, ``retry_timeout >= 3``, and
    ``loop_wait + 2 * retry_timeout <= ttl`` (``patroni/config.py``,
    ``Config._validate_and_adjust_timeouts``); Patroni silently lowers values that break it,
    this class raises ValueError. The defaults are the smallest useful values.
    """

    ttl_s: int = 20
    """Seconds the leader key lives in etcd without renewal: about how long a dead primary
    takes to be replaced."""
    loop_wait_s: int = 2
    """Seconds between two passes of each Patroni's HA loop."""
    retry_timeout_s: int = 5
    """Seconds Patroni retries etcd and PostgreSQL operations before it demotes itself."""
    synchronous_mode_strict: bool = False
    """True: a commit is acknowledged only once the standby has it, even with no standby, so
    writes stall from a failover until the failed member rejoins. False: a primary left alone
    goes on alone. Either way no failover loses an acknowledged commit (docs/ha-database.md)."""

    def __attrs_post_init__(self) -> None:
        if self.ttl_s < 20:
            raise ValueError(f"ttl_s must be >= 20 (Patroni's minimum), got {self.ttl_s}")
        if self.loop_wait_s < 1:
            raise ValueError(f"loop_wait_s must be >= 1, got {self.loop_wait_s}")
        if self.retry_timeout_s < 3:
            raise ValueError(f"retry_timeout_s must be >= 3, got {self.retry_timeout_s}")
        if self.loop_wait_s + 2 * self.retry_timeout_s > self.ttl_s:
            raise ValueError(
                f"loop_wait_s + 2 * retry_timeout_s must be <= ttl_s ({self.ttl_s}), got "
                f"{self.loop_wait_s} + 2 * {self.retry_timeout_s}"
            )


@attrs.frozen(kw_only=True)
class EtcdMember:
    """One etcd member's name and ports on 127.0.0.1."""

    name: str
    client_port: int
    peer_port: int


@attrs.frozen(kw_only=True)
class PgMember:
    """One Patroni member's name and ports on 127.0.0.1."""

    name: str
    pg_port: int
    rest_port: int
    """Its Patroni REST API's port."""


@attrs.frozen(kw_only=True, repr=False)
class HaPasswords:
    """The passwords Patroni is configured with (never shown by ``repr``)."""

    superuser: str
    """The ``postgres`` role's: clients, Patroni itself and pg_rewind."""
    replication: str
    """The ``replicator`` role's: the standby's stream."""
    rest_api: str
    """The REST API's, for requests that change the cluster (user ``patroni``)."""

    @classmethod
    def new(cls) -> HaPasswords:
        return cls(
            superuser=secrets.token_urlsafe(PASSWORD_BYTES),
            replication=secrets.token_urlsafe(PASSWORD_BYTES),
            rest_api=secrets.token_urlsafe(PASSWORD_BYTES),
        )

    def __repr__(self) -> str:
        return "HaPasswords(***)"


def etcd_argv(
    binary: str, member: EtcdMember, *, members: Sequence[EtcdMember], data_dir: Path, cluster_token: str
) -> list[str]:
    """The command line of etcd member ``member`` of ``members`` (v3 API only, loopback only);
    ``cluster_token`` is unique to this cluster, so members of another never join it."""
    peers = ",".join(f"{e.name}=http://{LISTEN_HOST}:{e.peer_port}" for e in members)
    client = f"http://{LISTEN_HOST}:{member.client_port}"
    peer = f"http://{LISTEN_HOST}:{member.peer_port}"
    return [
        binary,
        "--name", member.name,
        "--data-dir", str(data_dir),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", peers,
        "--initial-cluster-token", cluster_token,
        # Ignored once the data dir holds a cluster: a restart rejoins it.
        "--initial-cluster-state", "new",
        # etcd's defaults, said out loud: on loopback a new etcd leader within about a second.
        "--heartbeat-interval", "100",
        "--election-timeout", "1000",
        "--enable-v2=false",
        "--log-level", "warn",
    ]  # fmt: skip


def patroni_config(
    member: PgMember,
    *,
    etcd: Sequence[EtcdMember],
    settings: HaSettings,
    passwords: HaPasswords,
    data_dir: Path,
    bin_dir: Path,
    pgpass: Path,
    socket_dir: Path,
) -> dict[str, Any]:
    """Patroni's configuration for ``member`` (its YAML file, as a dict: JSON is YAML);
    ``pgpass`` is the password file Patroni writes for its own connections."""
    hba = [
        "local all all trust",
        f"host all all {LISTEN_HOST}/32 scram-sha-256",
        f"host replication {REPLICATION_USER} {LISTEN_HOST}/32 scram-sha-256",
    ]
    return {
        "scope": SCOPE,
        "name": member.name,
        "log": {"level": "WARNING"},
        "restapi": {
            "listen": f"{LISTEN_HOST}:{member.rest_port}",
            "connect_address": f"{LISTEN_HOST}:{member.rest_port}",
            # GET (health, /cluster) stays open; what changes the cluster (POST /failover,
            # /restart, PATCH /config...) needs this password.
            "authentication": {"username": "patroni", "password": passwords.rest_api},
        },
        "etcd3": {"hosts": [f"{LISTEN_HOST}:{e.client_port}" for e in etcd], "protocol": "http"},
        "bootstrap": {
            "dcs": {
                "ttl": settings.ttl_s,
                "loop_wait": settings.loop_wait_s,
                "retry_timeout": settings.retry_timeout_s,
                "synchronous_mode": True,
                "synchronous_mode_strict": settings.synchronous_mode_strict,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_level": "replica",
                        "wal_log_hints": "on",
                        "hot_standby": "on",
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "max_connections": 300,
                        "synchronous_commit": "on",
                        "password_encryption": "scram-sha-256",
                    },
                },
            },
            "initdb": [
                {"encoding": "UTF8"},
                {"locale": "C"},
                {"auth-host": "scram-sha-256"},
                {"auth-local": "trust"},
                "data-checksums",
            ],
        },
        "postgresql": {
            "listen": f"{LISTEN_HOST}:{member.pg_port}",
            "connect_address": f"{LISTEN_HOST}:{member.pg_port}",
            "data_dir": str(data_dir),
            "bin_dir": str(bin_dir),
            "pgpass": str(pgpass),
            "use_unix_socket": True,
            "use_unix_socket_repl": False,
            "authentication": {
                "superuser": {"username": PG_SUPERUSER, "password": passwords.superuser},
                "replication": {"username": REPLICATION_USER, "password": passwords.replication},
                "rewind": {"username": PG_SUPERUSER, "password": passwords.superuser},
            },
            "parameters": {
                "unix_socket_directories": str(socket_dir),
                "unix_socket_permissions": "0700",
                "fsync": "on",
                "log_min_messages": "warning",
            },
            "pg_hba": hba,
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
    }
