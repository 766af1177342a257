"""Typed wrappers for the daemon registry statements (the `workers` table)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from pgworkerd.queue.queries import query

# A daemon heartbeats at least every second; one silent this long is dead (or cut off
# from the database) and is marked gone, by any other daemon or by `drain --wait`.
STALE_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    version: str
    queues: Sequence[str]
    handlers: Sequence[str]
    slots: int


def register(conn: psycopg.Connection, info: WorkerInfo, state: str, schema: str) -> None:
    conn.execute(
        query("worker_register", schema),
        {
            "id": info.id,
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "queues": list(info.queues),
            "handlers": list(info.handlers),
            "slots": info.slots,
            "state": state,
        },
    )


def heartbeat(
    conn: psycopg.Connection, info: WorkerInfo, state: str, in_flight: Sequence[int], schema: str
) -> bool | None:
    """Returns whether a drain is requested; None if our row is gone (re-register)."""
    row = conn.execute(
        query("worker_heartbeat", schema),
        {
            "id": info.id,
            "state": state,
            "in_flight": list(in_flight),
            "queues": list(info.queues),
            "handlers": list(info.handlers),
            "slots": info.slots,
        },
    ).fetchone()
    return None if row is None else bool(row[0])


def deregister(conn: psycopg.Connection, worker_id: str, schema: str) -> None:
    conn.execute(query("worker_deregister", schema), {"id": worker_id})


def mark_stale(
    conn: psycopg.Connection, stale_after: float, schema: str
) -> list[tuple[str, str, int]]:
    rows = conn.execute(query("worker_mark_stale", schema), {"stale_after": stale_after}).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]
