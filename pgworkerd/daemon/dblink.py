"""The parent's link to PostgreSQL: one connection for every statement, one direct
connection for LISTEN, bounded waits, and reconnection with backoff.

Nothing here raises into the loop: a failed call returns None, a lost connection marks
the link down until a reconnect succeeds, and any other database error is logged.

Borrowed from psycopg-pool (review §2(b)), kept synchronous for the selector loop:
- reconnects back off with jitter (pgworkerd.backoff), and never give up;
- after a reconnect the schema is checked again; a schema this code does not understand
  keeps the link down (retrying) rather than running statements against it;
- both connections are recycled after a jittered lifetime (MAX_LIFETIME, -10 %), so they
  follow failovers and pooler changes and shed backend memory: the new connection is
  opened first, then swapped in, then the old one closed, between two statements; if the
  new one cannot be opened, the old one goes on serving;
- an outage longer than ESCALATE_AFTER is logged once at ERROR and flagged
  (unreachable_too_long) for the status line, like psycopg-pool's reconnect_failed.
"""

from __future__ import annotations

import contextlib
import logging
import random
import selectors
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from pgworkerd.backoff import Backoff
from pgworkerd.config import DatabaseConfig
from pgworkerd.describe import short_error
from pgworkerd.durations import format_duration
from pgworkerd.queue import session
from pgworkerd.queue.db import DatabaseError, connect, scrub
from pgworkerd.queue.migrate import SchemaError, check_current

log = logging.getLogger("pgworkerd")
T = TypeVar("T")
RECONNECT_INITIAL = 0.5
MAX_RECONNECT_DELAY = 30.0  # nominal: a try may come up to 10 % later (jitter)
# A LISTEN connection that died alone is retried this often (polling covers meanwhile).
LISTEN_RETRY = 2.0
# Both connections are replaced after this long, less up to LIFETIME_JITTER of it, so a
# fleet started at once does not reconnect at once.
MAX_LIFETIME = 3600.0
LIFETIME_JITTER = 0.1
# A replacement that could not be opened is tried again after this backoff (the old
# connection serves meanwhile).
RECYCLE_RETRY_INITIAL = 1.0
RECYCLE_RETRY_MAX = 60.0
# Unreachable this long: one ERROR line and unreachable_too_long (psycopg-pool's
# reconnect_timeout is 5 minutes too; the daemon keeps trying after it).
ESCALATE_AFTER = 300.0
_CONNECT_ERRORS = (psycopg.Error, DatabaseError, OSError)


def _roughly(seconds: float) -> str:
    """An outage's length for a message: whole seconds, or whole minutes past two."""
    return format_duration(round(seconds) if seconds < 120 else 60 * round(seconds / 60))


class DatabaseLink:
    def __init__(
        self,
        config: DatabaseConfig,
        dsn: str,
        schema: str,
        selector: selectors.BaseSelector,
        *,
        max_lifetime: float = MAX_LIFETIME,
        escalate_after: float = ESCALATE_AFTER,
        rng: random.Random | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.config, self.dsn, self.schema, self.selector = config, dsn, schema, selector
        # the daemon whose own wake channel the LISTEN connection listens on too (schema
        # 40), and that channel while it does; None: only the fleet's channel
        self.worker_id = worker_id
        self.own_channel: str | None = None
        # called once a LISTEN connection is (again) in place: wake-ups sent while there
        # was none were lost, so the daemon claims once (the loop sets it)
        self.on_listening: Callable[[], None] = lambda: None
        self.conn: psycopg.Connection | None = None
        self.listen_conn: psycopg.Connection | None = None
        self._listen_fd = -1  # kept: a lost connection can no longer tell its fileno()
        self.ok = False
        self.reconnect_at = 0.0
        self.listen_retry_at = 0.0
        self.max_lifetime, self.escalate_after = max_lifetime, escalate_after
        self._rng = rng if rng is not None else random.Random()
        self._reconnects = Backoff(RECONNECT_INITIAL, MAX_RECONNECT_DELAY, rng=self._rng)
        self._recycle_retries = Backoff(RECYCLE_RETRY_INITIAL, RECYCLE_RETRY_MAX, rng=self._rng)
        self._conn_expires_at = self._listen_expires_at = float("inf")
        # For the status line: since when the link is down (None while up), whether the
        # outage outlasted escalate_after (its ERROR is logged once), and why the schema
        # was refused ("" unless that is what keeps the link down).
        self.down_since: float | None = None
        self.unreachable_too_long = False
        self.schema_refusal = ""

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
        self._conn_expires_at = self._expiry(time.monotonic())

    def _expiry(self, now: float) -> float:
        return now + self.max_lifetime * (1 - LIFETIME_JITTER * self._rng.random())

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
        self._go_down(time.monotonic())
        self.reconnect_at = time.monotonic()  # the first try at once

    def _go_down(self, now: float) -> None:
        self.ok = False
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.drop_listener()
        if self.down_since is None:
            self.down_since = now

    def next_deadline(self) -> float | None:
        """When reconnect_if_due() has something to do while the link is down. (The
        lifetime recycling waits for a tick: it is never urgent.)"""
        return None if self.ok else self.reconnect_at

    def reconnect_if_due(self) -> bool:
        """Between two statements (once per tick): reconnect when the backoff allows, or
        recycle a connection past its lifetime. True when the link just came back."""
        now = time.monotonic()
        if self.ok:
            self._recycle_if_due(now)
            return False
        if now < self.reconnect_at:
            return False
        try:
            conn = self._open_checked()
        except SchemaError as exc:
            self._refuse_schema(now, exc)
            return False
        except _CONNECT_ERRORS as exc:
            self.schema_refusal = ""  # unreachable now, whatever was refused before
            self._retry_later(now, "database still unreachable (%s)", exc)
            return False
        if self.down_since is not None and self.unreachable_too_long:
            log.warning(
                "database connection restored after %s unreachable",
                _roughly(now - self.down_since),
            )
        else:
            log.info("database connection restored")
        self.conn, self.ok = conn, True
        self._conn_expires_at = self._expiry(now)
        self._reconnects.reset()
        self.down_since, self.unreachable_too_long, self.schema_refusal = None, False, ""
        return True

    def _open_checked(self) -> psycopg.Connection:
        """A new statement connection whose schema this code understands (after a
        reconnect or a recycle it may be another server, or migrated meanwhile); raises
        SchemaError or a connection error, with nothing left open."""
        conn = self.connect()
        try:
            check_current(conn, self.schema)
        except BaseException:
            conn.close()
            raise
        return conn

    def _refuse_schema(self, now: float, exc: SchemaError) -> None:
        """No statement runs against a schema this code does not understand: the link
        is down, retrying; the ERROR is logged once per refusal, not on every try."""
        self._go_down(now)
        if str(exc) != self.schema_refusal:
            self.schema_refusal = str(exc)
            log.error("%s; no database work until it is fixed, checking again", exc)
        self._retry_later(now, "schema still not usable (%s)", exc, quiet=True)

    def _retry_later(
        self, now: float, message: str, exc: BaseException, quiet: bool = False
    ) -> None:
        delay = self._reconnects.next_delay()
        self.reconnect_at = now + delay
        detail = scrub(str(exc).strip(), self.dsn)
        if not quiet:
            log.warning(message + "; next try in %.1fs", detail, delay)
        down_for = now - (self.down_since if self.down_since is not None else now)
        if down_for >= self.escalate_after and not self.unreachable_too_long:
            self.unreachable_too_long = True
            log.error(
                "database unreachable for %s (%s); still retrying every %s at most; jobs "
                "whose leases run out meanwhile are stopped here and run elsewhere",
                _roughly(down_for),
                detail.splitlines()[0] if detail else type(exc).__name__,
                format_duration(MAX_RECONNECT_DELAY),
            )

    def recently_tried(self, now: float) -> bool:
        """Keeping to the reconnect schedule (for the watchdog during an outage)."""
        return self.reconnect_at > now - MAX_RECONNECT_DELAY

    # -- recycling -----------------------------------------------------------------------

    def _recycle_if_due(self, now: float) -> None:
        if self.conn is not None and now >= self._conn_expires_at:
            self._recycle_statements(now)
        if self.ok and self.listen_conn is not None and now >= self._listen_expires_at:
            self._recycle_listener(now)

    def _recycle_statements(self, now: float) -> None:
        old = self.conn
        assert old is not None
        if old.info.transaction_status != TransactionStatus.IDLE:
            return  # a statement or transaction is open: next tick
        try:
            new = self._open_checked()
        except SchemaError as exc:
            self._refuse_schema(now, exc)  # the old connection goes down with the link
            return
        except _CONNECT_ERRORS as exc:
            self._recycle_failed("database", exc, self.dsn)
            self._conn_expires_at = now + self._recycle_retries.next_delay()
            return
        self.conn, self._conn_expires_at = new, self._expiry(now)
        self._recycle_retries.reset()
        old.close()
        log.debug("database connection recycled after its lifetime")

    def _recycle_listener(self, now: float) -> None:
        old, old_fd = self.listen_conn, self._listen_fd
        assert old is not None
        try:
            new = self._open_listener()
        except _CONNECT_ERRORS as exc:
            self._recycle_failed("LISTEN", exc, self.config.listen_dsn or self.dsn)
            self._listen_expires_at = now + self._recycle_retries.next_delay()
            return
        # LISTEN on the new one first: from here every NOTIFY reaches it. One that
        # reached only the old one and was not read yet is dropped with it; NOTIFY is
        # a hint, and the poll covers it.
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selector.unregister(old_fd)
        self._use_listener(new, now)
        old.close()
        log.debug("LISTEN connection recycled after its lifetime")

    def _recycle_failed(self, which: str, exc: BaseException, dsn: str) -> None:
        log.warning(
            "recycling the %s connection failed (%s); the current one goes on serving",
            which,
            scrub(str(exc).strip(), dsn),
        )

    # -- LISTEN --------------------------------------------------------------------------

    def listen(self, poll_interval: float) -> None:
        if self.listen_conn is not None:
            return
        self.listen_retry_at = time.monotonic() + min(LISTEN_RETRY, poll_interval)
        try:
            conn = self._open_listener()
        except _CONNECT_ERRORS as exc:
            log.warning(
                "LISTEN unavailable (%s); polling every %s",
                scrub(str(exc).strip(), self.config.listen_dsn or self.dsn),
                format_duration(poll_interval),
            )
            return
        self._use_listener(conn, time.monotonic())

    def _open_listener(self) -> tuple[psycopg.Connection, str | None]:
        """A new LISTEN connection on the fleet's channel and this daemon's own."""
        conn = self.connect(self.config.listen_dsn or self.dsn)
        try:
            session.listen_wake(conn, schema=self.schema)
            own = None
            if self.worker_id is not None:
                own = session.listen_own_wake(conn, self.worker_id, schema=self.schema)
        except BaseException:
            conn.close()
            raise
        return conn, own

    def _use_listener(self, opened: tuple[psycopg.Connection, str | None], now: float) -> None:
        conn, self.own_channel = opened
        self.listen_conn = conn
        self._listen_fd = conn.fileno()
        self._listen_expires_at = self._expiry(now)
        self.selector.register(self._listen_fd, selectors.EVENT_READ, ("listen", None))
        self.on_listening()

    def listen_due(self, now: float) -> bool:
        return self.ok and self.listen_conn is None and now >= self.listen_retry_at

    def drop_listener(self) -> None:
        if self.listen_conn is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.selector.unregister(self._listen_fd)
            self.listen_conn.close()
            self.listen_conn = None
            self.own_channel = None
            self._listen_expires_at = float("inf")

    @property
    def listening(self) -> bool:
        return self.listen_conn is not None

    def notifications(self) -> list[tuple[bool, str]]:
        """Consume pending notifications: (on this daemon's own channel, payload) each
        (NOTIFY is only a hint, on whatever channel)."""
        conn = self.listen_conn
        if conn is None:
            return []
        own = self.own_channel
        try:
            return [(n.channel == own, n.payload) for n in conn.notifies(timeout=0)]
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            log.warning(
                "LISTEN connection lost (%s); polling until it is back",
                scrub(str(exc).strip(), self.dsn),
            )
            self.drop_listener()
            return []

    def close(self) -> None:
        self.drop_listener()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
