"""How a daemon shows itself: its registry row (heartbeat, in-flight jobs, drain
requests read back, stale peers marked gone), its STATUS= line and process title, the
systemd watchdog, and the metrics gauges. A mixin of Daemon: it reads the daemon's state
and changes nothing but drain_requested_in_db and the registry row."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import psycopg
from setproctitle import setproctitle

from pgworkerd import __version__
from pgworkerd.queue import registry, session
from pgworkerd.queue.db import scrub
from pgworkerd.queue.queries import query

if TYPE_CHECKING:
    from pgworkerd.config import Config
    from pgworkerd.daemon.dblink import DatabaseLink
    from pgworkerd.daemon.loop import Timers
    from pgworkerd.daemon.outcomes import InFlight, Outcome
    from pgworkerd.daemon.supervisor import Supervisor
    from pgworkerd.ops.metrics import NullMetrics
    from pgworkerd.ops.systemd import Notifier

log = logging.getLogger("pgworkerd")


def capped_job_counts(
    conn: psycopg.Connection, schema: str, served: Sequence[str], top: int
) -> list[tuple[str | None, str, int]]:
    """(queue, status, jobs) for the served queues and the `top` biggest others; the rest
    of the queues come summed with queue None (job_counts_capped)."""
    cur = conn.execute(query("job_counts_capped", schema), {"served": list(served), "top": top})
    return [(r[0], r[1], int(r[2])) for r in cur.fetchall()]


class QueueDepthCounter:
    """Counts the jobs per queue and status for the metrics gauge on a thread of its own,
    with a connection of its own: on a table of millions of jobs that GROUP BY takes
    seconds, and the daemon's loop (renewals, dispatch, heartbeats) must not wait for it.
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
                with conn.transaction():
                    session.set_local_statement_timeout(conn, self.timeout)
                    rows = capped_job_counts(
                        conn, self.schema, self.metrics.served_queues, self.metrics.top_queues
                    )
            self.metrics.set_queue_depth(rows)
        except Exception as exc:  # whatever it is, the daemon goes on; say why, once
            self._retry_at = time.monotonic() + self.interval
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            detail = "; ".join(lines) or type(exc).__name__
            log.warning("counting jobs for the metrics failed: %s", scrub(detail, self.db.dsn))
        finally:
            self._conn = None


class Presence:
    # provided by Daemon
    config: Config
    worker_id: str
    schema: str
    state: str
    db: DatabaseLink
    supervisor: Supervisor
    notifier: Notifier
    metrics: NullMetrics
    in_flight: dict[int, InFlight]
    outcomes: deque[Outcome]
    timers: Timers
    drain_requested_in_db: bool
    claim_wanted: bool
    depth_counter: QueueDepthCounter
    reload_error: str  # "" or why the last SIGHUP reload failed (shown in STATUS=)

    def _worker_info(self) -> registry.WorkerInfo:
        return registry.WorkerInfo(
            id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            queues=self.config.queues,
            handlers=list(self.config.handlers),
            slots=self.config.worker.slots,
        )

    def _register(self) -> None:
        self.db.run(
            "registering",
            lambda c: registry.register(c, self._worker_info(), self.state, self.schema),
        )

    def _deregister(self) -> None:
        if self.db.ok:
            self.db.run(
                "deregistering", lambda c: registry.deregister(c, self.worker_id, self.schema)
            )

    def _registry_if_due(self) -> None:
        now = time.monotonic()
        if not self.db.ok or now < self.timers.registry_at:
            return
        interval = min(1.0, self.config.worker.renew_interval)  # drains noticed within ~1s
        self.timers.registry_at = now + interval
        state = self._registry_state()
        drain = self.db.run(
            "heartbeat",
            lambda c: registry.heartbeat(
                c, self._worker_info(), state, sorted(self.in_flight), self.schema
            ),
        )
        if drain is None and self.db.ok:
            self._register()  # marked gone after a long outage: come back
            return
        if drain is not None and drain != self.drain_requested_in_db:
            self.drain_requested_in_db = drain
            log.info("drain %s through the database", "requested" if drain else "lifted")
            if drain:
                for child in self.supervisor.idle():
                    self.supervisor.retire(child)
            else:
                self.claim_wanted = True
        if self.db.listen_due(now):
            self.db.listen(self.config.worker.poll_interval)
        if self.metrics.queue_depth_due():
            self.depth_counter.start()
        stale = self.db.run(
            "marking stale daemons",
            lambda c: registry.mark_stale(
                c,
                max(registry.STALE_AFTER_SECONDS, 6 * self.config.worker.renew_interval),
                self.schema,
            ),
        )
        for worker_id, host, pid in stale or []:
            log.warning(
                "daemon %s (host %s pid %d) stopped heartbeating: marked gone", worker_id, host, pid
            )

    def _registry_state(self) -> str:
        if self.state == "running" and self.drain_requested_in_db:
            return "drained" if not self.in_flight else "draining"
        return self.state

    def _status_text(self) -> str:
        text = self._state_text()
        return f"{text}; {self.reload_error}" if self.reload_error else text

    def _state_text(self) -> str:
        slots = self.config.worker.slots
        busy = len(self.in_flight)
        if not self.db.ok:
            return f"database unreachable, retrying ({busy} jobs running)"
        state = self._registry_state()
        if state == "running":
            return f"running: {busy}/{slots} busy"
        if state in ("draining", "stopping"):
            return f"{state}: {busy} jobs left"
        return state

    def _report_status(self) -> None:
        self.metrics.set_draining(self.drain_requested_in_db or self.state != "running")
        self.metrics.set_in_flight(len(self.in_flight), self.config.worker.slots)
        status = self._status_text()
        setproctitle(f"pgworkerd: {status} [{self.worker_id}]")
        self.notifier.status(status)
        now = time.monotonic()
        if self.notifier.watchdog_interval and now >= self.timers.watchdog_at:
            # The loop ticked, and every database call in a tick is bounded. Ping while
            # the database answers or while we keep to the reconnect schedule: a daemon
            # riding out an outage is healthy (restarting it would kill its jobs).
            if self.db.ok or self.db.recently_tried(now):
                self.notifier.watchdog()
            self.timers.watchdog_at = now + self.notifier.watchdog_interval
