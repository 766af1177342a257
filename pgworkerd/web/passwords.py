"""Password hashes for [web.users]: scrypt from the standard library, in one line of text.

Format: scrypt$N$r$p$SALT$HASH (salt and hash in base64). The parameters are stored with
each hash, so stronger ones later still verify old hashes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

# RFC 7914's interactive-login cost (16 MiB of memory, ~50 ms here): a login is rare, a
# guess should be expensive.
_N, _R, _P = 2**14, 8, 1
_MAXMEM = 64 * 1024 * 1024
_SALT_BYTES = 16
_HASH_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str) -> str:
    if not password:
        raise ValueError("the password is empty")
    salt = os.urandom(_SALT_BYTES)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=_N, r=_R, p=_P, maxmem=_MAXMEM, dklen=_HASH_BYTES
    )
    return f"scrypt${_N}${_R}${_P}${_b64(salt)}${_b64(digest)}"


def _parse(hashed: str) -> tuple[int, int, int, bytes, bytes]:
    parts = hashed.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("not scrypt$N$r$p$salt$hash")
    n, r, p = (int(x) for x in parts[1:4])
    # bounded, so a hostile config cannot make each login take minutes or gigabytes
    if not (2 <= n <= 2**20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise ValueError("scrypt parameters out of range")
    if 128 * r * n * p > _MAXMEM * 4:
        raise ValueError("scrypt parameters need too much memory")
    try:
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except binascii.Error:
        raise ValueError("bad base64") from None
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("salt or hash too short")
    return n, r, p, salt, digest


def hash_problem(hashed: str) -> str | None:
    """Why `hashed` is not a hash this module made, or None. Never quotes the value."""
    try:
        _parse(hashed)
    except ValueError as exc:
        return str(exc)
    return None


def verify(password: str, hashed: str) -> bool:
    """Whether `password` matches `hashed` (compared in constant time)."""
    n, r, p, salt, digest = _parse(hashed)
    candidate = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM * 4, dklen=len(digest)
    )
    return hmac.compare_digest(candidate, digest)
