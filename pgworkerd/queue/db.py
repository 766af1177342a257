"""Connecting to PostgreSQL: clear errors that never show a password."""

from __future__ import annotations

import os
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgworkerd.masking import dsn_secrets, mask_password

# Bounded connects and dead-peer detection: with neither, a silent network drop blocks a
# query for ~15 minutes (see shared notes on partitions).
CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10000,
    "application_name": "pgworkerd",
}

# psycopg's own default: statements run this often are prepared (the hot loop's are).
PREPARE_THRESHOLD = 5

# Every session pgworkerd opens (daemon, CLI, migrate) resolves unqualified functions and
# operators in pg_catalog only: an overload someone created in a schema on the default
# search_path (`public`, writable by everyone up to PostgreSQL 14) cannot stand in for a
# built-in and run with our role's rights. A startup option, added after the DSN's own
# options so that it wins; PgBouncer does not forward it, hence ALTER ROLE ... SET
# search_path in deploy/roles.sql as well.
SEARCH_PATH_OPTION = "-c search_path=pg_catalog,pg_temp"

__all__ = ["DatabaseError", "InvalidDsn", "connect", "conninfo", "mask_password", "scrub"]


class DatabaseError(RuntimeError):
    """A database problem explained for an operator (no password inside)."""


class InvalidDsn(DatabaseError):
    """The DSN itself cannot be parsed: bad input, which no retry can fix."""


# libpq quotes the token it cannot parse: from a malformed URL, often the password.
_QUOTED = re.compile(r'"([^"]*)"')


def scrub(text: str, dsn: str | None) -> str:
    """Mask passwords, including the literal password of `dsn` wherever it appears."""
    text = mask_password(text)
    if dsn:
        try:
            password = conninfo_to_dict(dsn).get("password")
        except psycopg.ProgrammingError:
            secrets = dsn_secrets(dsn)
            # A quoted token that is (part of) a password-like part goes entirely.
            text = _QUOTED.sub(
                lambda q: '"***"' if any(q[1] and q[1] in s for s in secrets) else q[0], text
            )
            for secret in secrets:
                text = text.replace(secret, "***")
        else:
            if password:
                text = text.replace(str(password), "***")
    return text


def describe_target(dsn: str) -> str:
    """host:port/dbname for messages, from the DSN or libpq's environment defaults."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(unparsable DSN)"
    host = params.get("host") or "(libpq default host)"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or "(default database)"
    return f"{host}:{port}/{dbname}"


def conninfo(dsn: str, **overrides: Any) -> str:
    """The DSN with our connect defaults filled in where it says nothing."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise InvalidDsn(f"invalid DSN: {scrub(str(exc).strip(), dsn)}") from None
    extra = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    extra.update(overrides)
    options = extra.get("options", given.get("options", os.environ.get("PGOPTIONS")))
    extra["options"] = f"{options} {SEARCH_PATH_OPTION}" if options else SEARCH_PATH_OPTION
    return make_conninfo(dsn, **extra)


def connect(
    dsn: str, *, autocommit: bool = True, prepare: bool = False, **overrides: Any
) -> psycopg.Connection:
    """Open a connection or raise DatabaseError naming the target, never the password.

    prepare=False (the default, for one-shot commands): no server-side prepared statements,
    so the code works behind any PgBouncer in transaction mode. prepare=True: psycopg
    prepares a statement once it has run PREPARE_THRESHOLD times, sparing the server the
    parse and plan of every later run; long-lived connections (the daemon, see
    database.prepared_statements) want it unless PgBouncer < 1.21 pools in transaction mode.
    """
    try:
        return psycopg.connect(
            conninfo(dsn, **overrides),
            autocommit=autocommit,
            prepare_threshold=PREPARE_THRESHOLD if prepare else None,
        )
    except psycopg.OperationalError as exc:
        lines = [ln.strip() for ln in scrub(str(exc), dsn).splitlines() if ln.strip()]
        detail = "; ".join(lines) or "no details"
        if re.match(r"connection is bad: invalid .*value", detail):
            # libpq rejected an option's value before trying the network: bad input.
            raise InvalidDsn(f"invalid DSN: {detail.removeprefix('connection is bad: ')}") from None
        raise DatabaseError(
            f"cannot connect to PostgreSQL at {describe_target(dsn)}: {detail}"
        ) from None
