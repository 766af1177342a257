"""[web.users]: who may log in to the dashboard, as NAME = "HASH" (a hash from `pgworkerd
web hash-password`, never a password), and what check-config shows of them (names only)."""

from __future__ import annotations

from typing import Any

from pgworkerd.bounds import name_problem
from pgworkerd.config.checks import Check, describe


def _web_users(value: Any) -> dict[str, str]:
    """[web.users]: NAME = "scrypt$..." (a hash, never a password)."""
    from pgworkerd.web.passwords import hash_problem

    if not isinstance(value, dict):
        raise TypeError(f"expected a table of NAME = HASH, got {describe(value)}")
    for name, hashed in value.items():
        problem = name_problem("user", name)
        if problem:
            raise ValueError(problem)
        if not isinstance(hashed, str) or hash_problem(hashed):
            # the value is never shown: someone may have put a password there
            raise ValueError(
                f"user {name!r}: not a password hash (make one with "
                "`pgworkerd web hash-password`, which reads the password from stdin)"
            )
    return dict(value)


web_users = Check(
    _web_users, 'a table of NAME = "HASH" (hashes from `pgworkerd web hash-password`)'
)


def user_names(users: dict[str, str]) -> list[str]:
    """What check-config shows: a hash is slow to guess, not impossible, so never shown."""
    return sorted(users)
