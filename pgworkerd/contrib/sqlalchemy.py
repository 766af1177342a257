"""Enqueue inside a SQLAlchemy session's (or Connection's) transaction, on its own
connection (the psycopg dialect: `postgresql+psycopg://`): no second connection, so the
job commits with `session.commit()` and is gone after `session.rollback()`.

    from pgworkerd.contrib import sqlalchemy as jobs

    with Session(engine) as session, session.begin():
        session.add(order)
        session.flush()
        jobs.enqueue(session, "send_receipt", {"order": order.id})

Each function takes a Session or a Connection first, then what pgworkerd.enqueue /
enqueue_many / enqueue_typed take. It begins the session's (or connection's)
transaction if none has begun, as any statement of SQLAlchemy's would: the job is part of
it. A database error (the database's own bounds) leaves the transaction aborted, as any
failed statement does: roll back (psycopg's COMMIT of an aborted transaction rolls back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg

from pgworkerd import client
from pgworkerd.client import JobSpec


def connection(bind: Any) -> psycopg.Connection[Any]:
    """The psycopg Connection under a Session or a Connection, in its transaction (begun
    if none had). TypeError if it is not on the psycopg (3) dialect."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(bind, Session):
        sa_conn = bind.connection()  # begins the session's transaction if needed
    elif isinstance(bind, Connection):
        sa_conn = bind
        if not sa_conn.in_transaction():
            sa_conn.begin()  # what its next statement would do (autobegin)
    else:
        raise TypeError(
            f"expected a sqlalchemy Session or Connection, not {type(bind).__name__} (an "
            "AsyncSession is not supported)"
        )
    raw = sa_conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            f"this engine's driver connection is a {type(raw).__module__}."
            f"{type(raw).__name__}: pgworkerd needs the psycopg (3) dialect, "
            "postgresql+psycopg://"
        )
    return raw


def enqueue(
    bind: Any, handler: str, payload: Mapping[str, Any] | None = None, **options: Any
) -> int:
    """pgworkerd.enqueue in the transaction of `bind` (a Session or Connection)."""
    return client.enqueue(connection(bind), handler, payload, **options)


def enqueue_many(bind: Any, specs: Iterable[JobSpec], **options: Any) -> list[int]:
    """pgworkerd.enqueue_many in the transaction of `bind` (a Session or Connection)."""
    return client.enqueue_many(connection(bind), specs, **options)


def enqueue_typed(bind: Any, func: Callable[..., Any], payload: Any, **options: Any) -> int:
    """pgworkerd.enqueue_typed in the transaction of `bind` (a Session or Connection)."""
    return client.enqueue_typed(connection(bind), func, payload, **options)
