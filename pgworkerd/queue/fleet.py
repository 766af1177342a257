"""What `status`, `drain` and `resume` read and write: the fleet of daemons, seen through
the database (so they work across hosts and need no signal rights)."""

from __future__ import annotations

import socket
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue.queries import query


def _rows(
    conn: psycopg.Connection, name: str, schema: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query(name, schema), params or {}).fetchall()


def request_drain(
    conn: psycopg.Connection,
    schema: str,
    *,
    drain: bool,
    worker_id: str | None = None,
    all_hosts: bool = False,
) -> list[dict[str, Any]]:
    """Set (or with drain=False clear) the drain flag of this host's daemons, of one
    daemon, or of all; returns the daemons affected."""
    host = None if (all_hosts or worker_id) else socket.gethostname()
    return _rows(
        conn, "worker_request_drain", schema, {"drain": drain, "id": worker_id, "host": host}
    )


# `status` names this many queues (the ones with the most jobs) and sums the others.
STATUS_TOP_QUEUES = 20


def snapshot(conn: psycopg.Connection, schema: str) -> dict[str, Any]:
    """Everything `pgworkerd status` shows, as plain data (also its --json shape)."""
    workers = _rows(conn, "worker_list", schema)
    counts: dict[str, dict[str, int]] = {}
    other: dict[str, int] = {}
    # Bounded however many queues enqueuers made up: the queues live daemons serve and
    # the busiest others by name, the rest summed (an enqueuer with 200,000 queues must
    # not make status print 200,000 lines, nor push the fleet's own queues out of view).
    served = sorted({q for w in workers if w["state"] != "gone" for q in w["queues"]})
    rows = conn.execute(
        query("job_counts_capped", schema), {"served": served, "top": STATUS_TOP_QUEUES}
    ).fetchall()
    for queue, status, n in rows:
        (other if queue is None else counts.setdefault(queue, {}))[status] = n
    oldest = conn.execute(query("job_oldest_pending", schema)).fetchone()
    for w in workers:
        w["busy"] = len(w["in_flight"])
    return {
        "daemons": workers,
        "running_jobs": _rows(conn, "job_running_list", schema),
        "counts": counts,
        "other_queues": other,
        "oldest_pending_seconds": oldest[0] if oldest else None,
        "unserved": _rows(conn, "job_unserved_list", schema),
    }


def daemons_still_busy(
    conn: psycopg.Connection, schema: str, ids: set[str]
) -> list[dict[str, Any]]:
    """Of the given daemons, those not yet drained (state) or still holding jobs."""
    return [
        w
        for w in _rows(conn, "worker_list", schema)
        if w["id"] in ids and w["state"] != "gone" and (w["state"] != "drained" or w["in_flight"])
    ]
