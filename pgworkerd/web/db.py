"""The dashboard's database connections: one bounded psycopg_pool.ConnectionPool.

Every connection carries a statement timeout (a slow page fails with a message instead of
holding a connection while requests pile up), a bounded wait for a free connection (503
rather than an ever longer queue), pgworkerd's connect defaults and search_path
(queue/db.conninfo), and the loaders that show any value a hostile row holds.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from pgworkerd.queue.db import InvalidDsn, conninfo, scrub
from pgworkerd.queue.safeloaders import register_safe_loaders

# How long a request waits for a free connection before it is answered 503.
POOL_WAIT_SECONDS = 5.0
# Requests waiting for a connection at most; more are refused at once.
POOL_MAX_WAITING = 32


def page_conninfo(dsn: str, statement_timeout: float) -> str:
    """The conninfo of the dashboard's connections (the pool's, and the start check's)."""
    return _conninfo(dsn, statement_timeout)


def _conninfo(dsn: str, statement_timeout: float) -> str:
    try:
        own = conninfo_to_dict(dsn).get("options") or ""
    except psycopg.ProgrammingError as exc:
        raise InvalidDsn(f"invalid DSN: {scrub(str(exc).strip(), dsn)}") from None
    millis = max(1, round(statement_timeout * 1000))
    options = f"{own} -c statement_timeout={millis}".strip()
    return conninfo(dsn, options=options, application_name="pgworkerd web")


def _configure(conn: psycopg.Connection[Any]) -> None:
    register_safe_loaders(conn)


class WritableRole(ValueError):
    """The pages' database role could change something, where it must not (N9): with
    `read_only`, or with actions on a DSN of their own (`action_dsn`)."""


def check_cannot_write(conn: psycopg.Connection[Any], schema: str) -> None:
    """Raise WritableRole when the session's role could write through the schema (the
    statement role_writes: table writes, column UPDATE, EXECUTE on a volatile SECURITY
    DEFINER function). pgworkerd_reader passes."""
    from pgworkerd.queue.queries import query

    row = conn.execute(query("role_writes", schema)).fetchone()
    rights = list(row[0]) if row else []
    if rights:
        more = f" and {len(rights) - 5} more" if len(rights) > 5 else ""
        raise WritableRole(
            f"refusing a database role that can write ({', '.join(rights[:5])}{more}) for "
            "pages that must only read ([web] read_only, or action_dsn set): connect as "
            "pgworkerd_reader (deploy/roles.sql)"
        )


def open_pool(
    dsn: str, *, size: int, statement_timeout: float, read_only_schema: str | None = None
) -> ConnectionPool:
    """An open pool of at most `size` autocommit connections (each action is one
    statement; reads need no transaction). Connects lazily: the server starts, and a page
    says what is wrong, while the database is down. With read_only_schema, every new
    connection is checked to be unable to write (check_cannot_write), so a role that
    gains rights later, or a database that was down at start, still serves no page."""

    def configure(conn: psycopg.Connection[Any]) -> None:
        _configure(conn)
        if read_only_schema is not None:
            check_cannot_write(conn, read_only_schema)

    pool = ConnectionPool(
        _conninfo(dsn, statement_timeout),
        kwargs={"autocommit": True, "prepare_threshold": None},
        min_size=1,
        max_size=size,
        timeout=POOL_WAIT_SECONDS,
        max_waiting=POOL_MAX_WAITING,
        configure=configure,
        check=ConnectionPool.check_connection,
        name="pgworkerd-web",
        open=False,
    )
    pool.open(wait=False)
    return pool
