"""Statements about the session itself rather than about jobs: subscribing to the wake
channel's notifications and bounding the current transaction's statements."""

from __future__ import annotations

from typing import Any

import psycopg

from pgworkerd.queue.queries import DEFAULT_SCHEMA, query


def listen_wake(conn: psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA) -> None:
    """Receive the wake channel's notifications (schema 13: new jobs named by id, queue
    and handler; peers coming and going; drain requests): what the daemon listens to."""
    conn.execute(query("session_wake_listen", schema))


def set_local_statement_timeout(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Bound every statement of the current transaction to `seconds` (whole milliseconds),
    whatever the connection's own statement_timeout is."""
    conn.execute(
        query("session_statement_timeout_set_local"), {"timeout": f"{int(seconds * 1000)}ms"}
    )
