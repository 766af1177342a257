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


def open_pool(dsn: str, *, size: int, statement_timeout: float) -> ConnectionPool:
    """An open pool of at most `size` autocommit connections (each action is one
    statement; reads need no transaction). Connects lazily: the server starts, and a page
    says what is wrong, while the database is down."""
    pool = ConnectionPool(
        _conninfo(dsn, statement_timeout),
        kwargs={"autocommit": True, "prepare_threshold": None},
        min_size=1,
        max_size=size,
        timeout=POOL_WAIT_SECONDS,
        max_waiting=POOL_MAX_WAITING,
        configure=_configure,
        check=ConnectionPool.check_connection,
        name="pgworkerd-web",
        open=False,
    )
    pool.open(wait=False)
    return pool
