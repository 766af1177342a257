"""What `status`, `drain` and `resume` read and write: the fleet of daemons, seen through
the database (so they work across hosts and need no signal rights)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue import admin, registry
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
    for queue, status, n in admin.counts_capped(conn, served, STATUS_TOP_QUEUES, schema=schema):
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
        "paused": paused(conn, schema),
    }


# -- pausing queues and handlers (migration 0009) -------------------------------------------

PAUSE_KINDS = ("queue", "handler")


def set_paused(
    conn: psycopg.Connection,
    schema: str,
    kind: str,
    name: str,
    *,
    pause: bool,
    comment: str | None = None,
) -> bool:
    """Pause (or with pause=False resume) a queue or handler fleet-wide; returns whether
    that changed anything (False: it was already paused, or was not paused). The claim
    reads the paused table, so daemons need no restart or signal."""
    [row] = _rows(
        conn, "paused_set", schema, {"pause": pause, "kind": kind, "name": name, "comment": comment}
    )
    return bool(row["changed"])


def served(conn: psycopg.Connection, schema: str, kind: str, name: str) -> bool:
    """Whether a live daemon serves queue or handler `name` (kind "queue" or "handler")."""
    [row] = _rows(conn, "paused_target_served", schema, {"kind": kind, "name": name})
    return bool(row["served"])


def paused(conn: psycopg.Connection, schema: str) -> list[dict[str, Any]]:
    """What is paused (kind, name, paused_at, paused_by, comment, paused_seconds)."""
    return _rows(conn, "paused_list", schema)


def daemons_still_busy(
    conn: psycopg.Connection, schema: str, ids: set[str]
) -> list[dict[str, Any]]:
    """Of the given daemons, those not yet drained (state) or still holding jobs."""
    return [
        w
        for w in _rows(conn, "worker_list", schema)
        if w["id"] in ids and w["state"] != "gone" and (w["state"] != "drained" or w["in_flight"])
    ]


@dataclass(frozen=True)
class DrainProgress:
    """One look at the daemons a drain waits for."""

    # Those not yet drained or still holding jobs (worker_list rows).
    busy: list[dict[str, Any]]
    # The ids of the jobs they still run, sorted.
    running_jobs: list[int]
    # Daemons waited for that this look marked gone (id, host, pid): silent for
    # registry.STALE_AFTER_SECONDS, so they are waited for no longer.
    marked_gone: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def drained(self) -> bool:
        return not self.busy


def wait_drained(
    conn: psycopg.Connection,
    schema: str,
    ids: Collection[str],
    timeout: float | None,
    on_progress: Callable[[DrainProgress], None] = lambda progress: None,
    *,
    interval: float = 0.5,
) -> DrainProgress:
    """Wait until the daemons `ids` are drained and run no jobs, or `timeout` seconds
    passed (None: no limit). Calls `on_progress` after every look, the last included,
    and returns the last look (`drained` False: timed out).

    A killed daemon never reports drained; with no other daemon left to notice, waiting
    on it would never end. So each look also marks daemons silent for
    registry.STALE_AFTER_SECONDS gone (as every daemon does): dead, their children died
    with them; cut off from the database, their jobs stop by the end of their leases.
    Either way the leases bring the jobs back to the queue.
    """
    wanted = set(ids)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        gone = [
            row
            for row in registry.mark_stale(conn, registry.STALE_AFTER_SECONDS, schema)
            if row[0] in wanted
        ]
        busy = daemons_still_busy(conn, schema, wanted)
        progress = DrainProgress(busy, sorted(j for d in busy for j in d["in_flight"]), gone)
        on_progress(progress)
        if progress.drained or (deadline is not None and time.monotonic() >= deadline):
            return progress
        time.sleep(interval)
