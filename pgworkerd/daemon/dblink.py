"""The parent's link to PostgreSQL: one connection for every statement, one direct
connection for LISTEN, bounded waits, and reconnection with backoff.

Nothing here raises into the loop: a failed call returns None, a lost connection marks
the link down until a reconnect succeeds, and any other database error is logged.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from pgworkerd.config import DatabaseConfig
from pgworkerd.describe import short_error
from pgworkerd.durations import format_duration
from pgworkerd.queue import session
from pgworkerd.queue.db import DatabaseError, connect, scrub

log = logging.getLogger("pgworkerd")
T = TypeVar("T")
MAX_RECONNECT_DELAY = 30.0
# A LISTEN connection that died alone is retried this often (polling covers meanwhile).
LISTEN_RETRY = 2.0


class DatabaseLink:
    def __init__(
        self, config: DatabaseConfig, dsn: str, schema: str, selector: selectors.BaseSelector
    ) -> None:
        self.config, self.dsn, self.schema, self.selector = config, dsn, schema, selector
        self.conn: psycopg.Connection | None = None
        self.listen_conn: psycopg.Connection | None = None
        self._listen_fd = -1  # kept: a lost connection can no longer tell its fileno()
        self.ok = False
        self.reconnect_at = 0.0
        self.reconnect_delay = 0.5
        self.listen_retry_at = 0.0

    def connect(self, dsn: str | None = None) -> psycopg.Connection:
        """A new connection with every wait bounded; raises psycopg/DatabaseError."""
        db = self.config
        extra: dict[str, Any] = {}
        if db.statement_timeout > 0:
            # A startup option: PgBouncer does not forward it (see README), hence "0s".
            extra["options"] = f"-c statement_timeout={int(db.statement_timeout * 1000)}"
        return connect(
            self.dsn if dsn is None else dsn,
            connect_timeout=max(1, round(db.connect_timeout)),
            keepalives_idle=max(1, round(db.keepalives_idle)),
            tcp_user_timeout=int(db.tcp_user_timeout * 1000),
            prepare=db.prepared_statements,
            **extra,
        )

    def attach(self, conn: psycopg.Connection) -> None:
        """Use a connection opened (and checked) by the caller."""
        self.conn, self.ok = conn, True

    def run(self, what: str, func: Callable[[psycopg.Connection], T]) -> T | None:
        """Run one database call; None if it failed. A connection failure marks the link
        down (reconnect_if_due brings it back); any other error is logged and the loop
        goes on: no database error takes the daemon down."""
        if self.conn is None:
            return None
        try:
            return func(self.conn)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if (
                self.conn.closed
                or self.conn.broken
                or isinstance(exc, psycopg.errors.AdminShutdown | psycopg.InterfaceError)
            ):
                self._lost(what, exc)
            else:
                log.warning("%s failed: %s", what, scrub(str(exc).strip(), self.dsn))
            return None
        except psycopg.Error as exc:
            # Not the connection: a bad value, a timeout, a bug. Log it; the loop goes on.
            log.error(
                "%s failed: %s: %s", what, type(exc).__name__, scrub(str(exc).strip(), self.dsn)
            )
            return None
        except Exception as exc:
            # Not a database error at all: a value that cannot be dumped or loaded, or a
            # bug. The caller's data is checked before it gets here; whatever slips
            # through is logged, and the loop goes on.
            log.error("%s failed: %s", what, scrub(short_error(exc), self.dsn), exc_info=True)
            return None

    def _lost(self, what: str, exc: BaseException) -> None:
        text = str(exc).strip()
        detail = scrub(text.splitlines()[0] if text else type(exc).__name__, self.dsn)
        if self.ok:
            log.error("database connection lost during %s: %s; children keep running", what, detail)
        self.ok = False
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.drop_listener()
        self.reconnect_at = time.monotonic()

    def reconnect_if_due(self) -> bool:
        """Try to reconnect when the backoff allows; True when the link just came back."""
        if self.ok or time.monotonic() < self.reconnect_at:
            return False
        try:
            self.conn = self.connect()
        except (psycopg.Error, DatabaseError, OSError) as exc:
            self.reconnect_at = time.monotonic() + self.reconnect_delay
            log.warning(
                "database still unreachable (%s); next try in %.1fs",
                scrub(str(exc).strip(), self.dsn),
                self.reconnect_delay,
            )
            self.reconnect_delay = min(self.reconnect_delay * 2, MAX_RECONNECT_DELAY)
            return False
        log.info("database connection restored")
        self.ok = True
        self.reconnect_delay = 0.5
        return True

    def recently_tried(self, now: float) -> bool:
        """Keeping to the reconnect schedule (for the watchdog during an outage)."""
        return self.reconnect_at > now - MAX_RECONNECT_DELAY

    # -- LISTEN --------------------------------------------------------------------------

    def listen(self, poll_interval: float) -> None:
        if self.listen_conn is not None:
            return
        self.listen_retry_at = time.monotonic() + min(LISTEN_RETRY, poll_interval)
        dsn = self.config.listen_dsn or self.dsn
        try:
            conn = self.connect(dsn)
            session.listen(conn, schema=self.schema)
        except (psycopg.Error, DatabaseError, OSError) as exc:
            log.warning(
                "LISTEN unavailable (%s); polling every %s",
                scrub(str(exc).strip(), dsn),
                format_duration(poll_interval),
            )
            return
        self.listen_conn = conn
        self._listen_fd = conn.fileno()
        self.selector.register(self._listen_fd, selectors.EVENT_READ, ("listen", None))

    def listen_due(self, now: float) -> bool:
        return self.ok and self.listen_conn is None and now >= self.listen_retry_at

    def drop_listener(self) -> None:
        if self.listen_conn is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(self._listen_fd)
            self.listen_conn.close()
            self.listen_conn = None

    def notified(self) -> bool:
        """Consume pending notifications; True if any arrived (NOTIFY is only a hint)."""
        conn = self.listen_conn
        if conn is None:
            return False
        try:
            return sum(1 for _ in conn.notifies(timeout=0)) > 0
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            log.warning(
                "LISTEN connection lost (%s); polling until it is back",
                scrub(str(exc).strip(), self.dsn),
            )
            self.drop_listener()
            return False

    def close(self) -> None:
        self.drop_listener()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
