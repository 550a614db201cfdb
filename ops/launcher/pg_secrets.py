"""The secrets of the embedded PostgreSQL servers: passwords, their SCRAM verifiers
(:func:`scram_sha256_verifier`) and files only their owner reads (:func:`write_secret`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from ops.launcher.state import LISTEN_HOST
from runtime.os_users import RunAs

__all__ = [
    "PASSWORD_BYTES",
    "PG_SUPERUSER",
    "SECRET_FILE_MODE",
    "ensure_password_file",
    "scram_sha256_verifier",
    "write_secret",
]

PG_SUPERUSER = "postgres"
PASSWORD_BYTES = 32
"""Random bytes in a generated password (:func:`secrets.token_urlsafe`)."""
SCRAM_ITERATIONS = 4096
"""PostgreSQL's default ``scram_iterations``."""
SECRET_FILE_MODE = 0o600


def scram_sha256_verifier(
    password: str, *, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (``pg_authid.rolpassword``).

    Given in place of the password, it keeps the password from the server and its logs. RFC 5802
    section 3 with SHA-256 (RFC 7677), as ``scram_build_secret`` (src/common/scram-common.c)::

        SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)
        StoredKey = SHA-256(HMAC(SaltedPassword, "Client Key"))
        ServerKey = HMAC(SaltedPassword, "Server Key")
        -> "SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>"

    Args:
        password: ASCII (SASLprep leaves it as it is).
        salt: random bytes; None draws 16 with :mod:`secrets`.

    Raises:
        ValueError: ``password`` is not ASCII (it would need SASLprep), or ``iterations`` < 1.
    """
    if not password.isascii():
        raise ValueError("password must be ASCII, got a non-ASCII character")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def write_secret(path: Path, data: bytes, run_as: RunAs | None = None) -> None:
    """Write ``data`` to a new file with mode 0600 (``O_EXCL``: OSError where it exists), owned
    by ``run_as`` if given."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_FILE_MODE)
    with os.fdopen(fd, "wb") as file:
        if run_as is not None and run_as.is_other_user:
            os.fchown(file.fileno(), run_as.uid, run_as.gid)
        file.write(data)


def ensure_password_file(path: Path, host: str, *, error: type[Exception]) -> tuple[str, bool]:
    """(the ``postgres`` role's password in the pgpass file ``path``, whether it was made now
    with ``host`` as the line's host field).

    Raises:
        error: the file cannot be made or read, has group or other bits, or holds no
            ``<host>:*:*:postgres:<password>`` line.
    """
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_FILE_MODE)
    except FileExistsError:
        return _read_password_file(path, host, error=error), False
    except OSError as exc:
        raise error(f"cannot create the password file {path}: {exc}") from exc
    with os.fdopen(fd, "w") as file:
        file.write(f"{host}:*:*:{PG_SUPERUSER}:{password}\n")
        file.flush()
        os.fsync(file.fileno())
    return password, True


def _read_password_file(path: Path, host: str, *, error: type[Exception]) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as file:
            mode = stat.S_IMODE(os.fstat(file.fileno()).st_mode)
            text = file.read()
    except OSError as exc:
        raise error(f"cannot read the password file {path}: {exc}") from exc
    if mode & 0o077:
        raise error(
            f"password file {path} has mode {mode:04o}: it must be 0600 (clients ignore it "
            f"otherwise); chmod 600 {path}, or remove it to have a new password made"
        )
    for line in text.splitlines():
        for either in (LISTEN_HOST, "*"):  # a file made for either kind of server serves both
            line_prefix = f"{either}:*:*:{PG_SUPERUSER}:"
            if line.startswith(line_prefix) and len(line) > len(line_prefix):
                return line[len(line_prefix) :]
    raise error(
        f"password file {path} has no {host}:*:*:{PG_SUPERUSER}:<password> line; remove it to have a "
        "new password made"
    )
