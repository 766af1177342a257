"""The metrics' count of jobs per queue and status, and of the fleet's jobs whose daemon
is silent: on a thread and a connection of its own, since on a large table the count takes
seconds and the daemon's loop must not wait for it (Presence starts it)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import psycopg

from pgworkerd.daemon.dblink import DatabaseLink
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue import admin, session, views
from pgworkerd.queue.db import scrub

log = logging.getLogger("pgworkerd")


class QueueDepthCounter:
    """Counts the jobs per queue and status for the metrics gauge on a thread of its own,
    and after it (its own transaction, so a count that times out does not take it along)
    the fleet's running jobs whose daemon is silent: a read of the registry and of the
    silent daemons' jobs by primary key, small beside the count; with a
    connection of its own: on a table of millions of jobs that GROUP BY takes seconds,
    and the daemon's loop (renewals, dispatch, heartbeats) must not wait for it.
    One count at a time, each bounded by its own statement timeout (the connection's may
    be off, behind PgBouncer); a failed one is logged and tried again after `interval`.
    The number of queues is capped in the statement (metrics.top_queues): an enqueuer
    can create any number of queues, and neither the rows fetched here nor the gauge's
    series may grow with them."""

    def __init__(
        self, db: DatabaseLink, schema: str, metrics: NullMetrics, interval: float
    ) -> None:
        self.db, self.schema, self.metrics, self.interval = db, schema, metrics, interval
        self.timeout = max(60.0, 4 * interval)
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None  # while a count runs
        self._retry_at = 0.0

    def start(self) -> None:
        if (self._thread is not None and self._thread.is_alive()) or (
            time.monotonic() < self._retry_at
        ):
            return
        self._thread = threading.Thread(
            target=self._count, name="pgworkerd-queue-depth", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """At exit: cancel a count still running, so its session ends with the daemon."""
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=2.0)

    def _count(self) -> None:
        try:
            with self.db.connect() as conn:
                self._conn = conn
                failed: Exception | None = None
                for read in (self._queue_depth, self._silent_jobs):
                    try:  # each in its own transaction: one that fails spares the other
                        with conn.transaction():
                            session.set_local_statement_timeout(conn, self.timeout)
                            read(conn)
                    except psycopg.Error as exc:
                        failed = failed or exc
                if failed is not None:
                    raise failed
        except Exception as exc:  # whatever it is, the daemon goes on; say why, once
            self._retry_at = time.monotonic() + self.interval
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            detail = "; ".join(lines) or type(exc).__name__
            log.warning("counting jobs for the metrics failed: %s", scrub(detail, self.db.dsn))
        finally:
            self._conn = None

    def _queue_depth(self, conn: psycopg.Connection) -> None:
        rows = admin.counts_capped(
            conn, self.metrics.served_queues, self.metrics.top_queues, schema=self.schema
        )
        self.metrics.set_queue_depth(rows)

    def _silent_jobs(self, conn: psycopg.Connection) -> None:
        silent = views.silent_jobs(conn, self.schema)
        self.metrics.set_silent(silent["jobs"], silent["daemons"])
