"""Integration tier: DatabaseLink in-process against the real cluster — recycling both
long-lived connections after their lifetime, the schema check after a reconnect, and the
one-line escalation of a long outage.

The test drives the link as the daemon's loop does: statements through run(), and
reconnect_if_due() between them once per tick.
"""

from __future__ import annotations

import logging
import selectors
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from daemon_harness import wait_for
from psycopg import sql
from psycopg.rows import TupleRow

from pgworkerd.config import DatabaseConfig
from pgworkerd.daemon.dblink import DatabaseLink
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import check_current, migrate
from pgworkerd.queue.queries import wake_channel

FAST = DatabaseConfig(connect_timeout=2.0, keepalives_idle=1.0, tcp_user_timeout=2.0)


@pytest.fixture
def selector() -> Iterator[selectors.BaseSelector]:
    with selectors.DefaultSelector() as s:
        yield s


def attached(link: DatabaseLink) -> DatabaseLink:
    """Connected and checked, as the daemon's start-up leaves it."""
    conn = link.connect()
    check_current(conn, link.schema)
    link.attach(conn)
    return link


def backend_pid(link: DatabaseLink) -> int:
    pid = link.run("backend pid", lambda c: c.execute("SELECT pg_backend_pid()").fetchone())
    assert pid is not None, "the link cannot run a statement"
    return int(pid[0])


def alive(conn: psycopg.Connection[TupleRow], pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return bool(row and row[0])


def tick_until_down(link: DatabaseLink) -> None:
    """The loop notices a lost connection on its next statement."""
    wait_for(lambda: backend_pid_or_none(link) is None and not link.ok, what="the link down")


def backend_pid_or_none(link: DatabaseLink) -> int | None:
    row = link.run("probe", lambda c: c.execute("SELECT pg_backend_pid()").fetchone())
    return None if row is None else int(row[0])


def test_both_connections_are_recycled_after_their_lifetime(
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection[TupleRow],
    selector: selectors.BaseSelector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgworkerd")
    link = attached(DatabaseLink(FAST, test_db_dsn, schema, selector, max_lifetime=1.0))
    try:
        link.listen(poll_interval=5.0)
        old_conn, old_listen = link.conn, link.listen_conn
        assert old_conn is not None and old_listen is not None
        old_pid, old_listen_pid = backend_pid(link), old_listen.info.backend_pid
        opened = time.monotonic()

        def recycled() -> bool:
            assert link.reconnect_if_due() is False  # not a "came back": it never left
            assert link.ok
            return link.conn is not old_conn and link.listen_conn is not old_listen

        wait_for(recycled, timeout=30, what="both connections recycled")
        assert time.monotonic() - opened >= 0.9 * 1.0 - 0.05  # not before the lifetime
        # Open the new first, swap, close the old: the old backends are gone, not leaked.
        assert old_conn.closed and old_listen.closed
        assert backend_pid(link) != old_pid
        wait_for(lambda: not alive(conn, old_pid), what="the old backend gone")
        wait_for(lambda: not alive(conn, old_listen_pid), what="the old LISTEN backend gone")
        # The new LISTEN connection is the one in the selector, and it hears NOTIFY.
        conn.execute(sql.SQL("NOTIFY {}, 'x'").format(sql.Identifier(wake_channel(schema))))
        keys = [k for k, _ in selector.select(10) if k.data[0] == "listen"]
        assert keys and link.listen_conn is not None
        assert keys[0].fd == link.listen_conn.fileno()
        assert link.notifications() == [(False, "x")]  # the fleet's channel, not its own
        assert len(selector.get_map()) == 1
    finally:
        link.close()


def test_a_connection_that_cannot_be_replaced_is_kept(
    pg: LocalPostgres,
    conn: psycopg.Connection[TupleRow],
    selector: selectors.BaseSelector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Recycling never takes the link down: while no new connection can be opened, the
    old one goes on serving (its leases are renewed through it)."""
    name = f"recycle_{uuid.uuid4().hex[:8]}"
    pg.create_database(name)
    migrate(pg.dsn(name), schema="pgworkerd")
    link = attached(DatabaseLink(FAST, pg.dsn(name), "pgworkerd", selector, max_lifetime=1.0))
    ident = sql.Identifier(name)
    try:
        pid = backend_pid(link)
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(ident))
        deadline = time.monotonic() + 3.0  # a few lifetimes
        while time.monotonic() < deadline:
            link.reconnect_if_due()
            assert link.ok
            assert backend_pid(link) == pid  # the same session, still serving
            time.sleep(0.1)
        assert any(
            r.levelno == logging.WARNING and "recycl" in r.getMessage() for r in caplog.records
        ), caplog.text
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(ident))

        def replaced() -> bool:
            link.reconnect_if_due()
            return backend_pid(link) != pid

        wait_for(replaced, timeout=120, what="the connection recycled once it can be")
        assert link.ok
    finally:
        link.close()
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(ident))
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(ident))


def test_after_a_reconnect_the_schema_is_checked_again(
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection[TupleRow],
    selector: selectors.BaseSelector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A schema this code does not understand (here: gone) keeps the link down, retrying,
    with an ERROR, instead of running statements against it."""
    link = attached(DatabaseLink(FAST, test_db_dsn, schema, selector))
    away = f"{schema}_away"
    moved = False
    try:
        pid = backend_pid(link)
        conn.execute(
            sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                sql.Identifier(schema), sql.Identifier(away)
            )
        )
        moved = True
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        tick_until_down(link)
        caplog.clear()
        deadline = time.monotonic() + 3.0  # a few tries (0.5 s, 1 s, ...)
        while time.monotonic() < deadline:
            assert link.reconnect_if_due() is False
            assert not link.ok and link.conn is None
            assert backend_pid_or_none(link) is None  # nothing runs
            time.sleep(0.05)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and schema in errors[0].getMessage(), caplog.text  # not per try
        assert link.schema_refusal
        conn.execute(
            sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                sql.Identifier(away), sql.Identifier(schema)
            )
        )
        moved = False
        wait_for(link.reconnect_if_due, timeout=60, what="the link back")
        assert link.ok and backend_pid(link) != pid
    finally:
        if moved:
            conn.execute(
                sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(
                    sql.Identifier(away), sql.Identifier(schema)
                )
            )
        link.close()


@pytest.fixture
def private_pg() -> Iterator[LocalPostgres]:
    """A cluster of the test's own: stopping the session's would disturb other tests."""
    with LocalPostgres() as cluster:
        cluster.create_database("outage")
        migrate(cluster.dsn("outage"), schema="pgworkerd")
        yield cluster


def test_a_long_outage_is_escalated_once(
    private_pg: LocalPostgres,
    selector: selectors.BaseSelector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After `escalate_after` seconds unreachable: one ERROR line (not one per try) and
    a flag the status can show; both end when the database is back."""
    pg, dsn = private_pg, private_pg.dsn("outage")
    link = attached(DatabaseLink(FAST, dsn, "pgworkerd", selector, escalate_after=1.0))
    try:
        assert not link.unreachable_too_long
        pg.stop()
        try:
            tick_until_down(link)
            caplog.clear()

            def escalated() -> bool:
                link.reconnect_if_due()
                return link.unreachable_too_long

            wait_for(escalated, timeout=30, what="the escalation")
            # More tries after it (backoff 0.5, 1, 2, 4 s ...): still one ERROR line.
            tries_before = sum("unreachable" in r.getMessage() for r in caplog.records)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                link.reconnect_if_due()
                tries = sum("unreachable" in r.getMessage() for r in caplog.records)
                if tries >= tries_before + 2:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("no further tries after the escalation")
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1, caplog.text
            assert "unreachable for" in errors[0].getMessage()
            assert link.unreachable_too_long
        finally:
            pg.start()
        wait_for(link.reconnect_if_due, timeout=60, what="the link back")
        assert not link.unreachable_too_long
    finally:
        link.close()
