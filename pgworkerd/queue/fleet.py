"""What `drain`, `resume` and `pause` change: the fleet of daemons, through the database
(so they work across hosts and need no signal rights). What `status` shows is read by
queue/views.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue import registry
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
