"""Statements about the session itself rather than about jobs: subscribing to the wake
channel's notifications, bounding the current transaction's statements and lock waits,
and dropping the session's cached plans."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from pgworkerd.queue.queries import DEFAULT_SCHEMA, query

T = TypeVar("T")


def listen_wake(conn: psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA) -> None:
    """Receive the wake channel's notifications (schema 13: new jobs named by id, queue
    and handler; peers coming and going; drain requests): what the daemon listens to."""
    conn.execute(query("session_wake_listen", schema))


def listen_own_wake(
    conn: psycopg.Connection[Any], worker_id: str, *, schema: str = DEFAULT_SCHEMA
) -> str:
    """Receive the wake-ups aimed at daemon `worker_id` (schema 40); returns the channel."""
    row = conn.execute(query("session_wake_listen_own", schema), {"worker": worker_id}).fetchone()
    assert row is not None and isinstance(row[0], str)
    return row[0]


def plans_discard(conn: psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA) -> None:
    """Drop this session's cached plans: each statement is planned again at its next use,
    with the tables as they are then."""
    conn.execute(query("session_plans_discard", schema))


def set_local_statement_timeout(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Bound every statement of the current transaction to `seconds` (whole milliseconds),
    whatever the connection's own statement_timeout is."""
    conn.execute(
        query("session_statement_timeout_set_local"), {"timeout": f"{int(seconds * 1000)}ms"}
    )


def lock_bounded(conn: psycopg.Connection[Any], timeout_ms: int, call: Callable[[], T]) -> T:
    """`call()` in a transaction of its own whose lock waits end after `timeout_ms`
    (LockNotAvailable, an OperationalError, then): for maintenance that must not wait
    behind a LOCK TABLE or a migration."""
    with conn.transaction():
        conn.execute(query("session_lock_timeout_set_local"), {"timeout": f"{timeout_ms}ms"})
        return call()
