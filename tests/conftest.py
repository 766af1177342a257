"""Shared fixtures: one private PostgreSQL cluster per pytest session (per xdist worker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from daemon_harness import Daemons, Db
from psycopg import sql
from psycopg.rows import TupleRow

from pgworkerd.devcluster.localpg import LocalPostgres

# The `roles` fixture (roles.sql applied for the test's schema), for any test that asks.
pytest_plugins = ["roles_harness"]

TEST_DB = "pgworkerd_test"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")


@pytest.fixture(scope="session")
def pg() -> Iterator[LocalPostgres]:
    # Each xdist worker is its own session, so workers never share a cluster or a port.
    with LocalPostgres() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def test_db_dsn(pg: LocalPostgres) -> str:
    pg.create_database(TEST_DB)
    return pg.dsn(TEST_DB)


@pytest.fixture
def schema(test_db_dsn: str) -> Iterator[str]:
    """A freshly migrated schema of its own for each test, dropped afterwards."""
    # Imported here, not at module level, so that tests which never touch the schema
    # (e.g. test_localpg) do not depend on the migration code importing cleanly.
    from pgworkerd.queue.migrate import migrate

    name = f"t_{uuid.uuid4().hex[:8]}"
    try:
        migrate(test_db_dsn, schema=name)
        yield name
    finally:
        with psycopg.connect(test_db_dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def conn(test_db_dsn: str) -> Iterator[psycopg.Connection[TupleRow]]:
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def db(conn: psycopg.Connection[TupleRow], schema: str) -> Db:
    """The test's schema seen through the acceptance-test helpers (with an executions
    table that tests/support/jobhandlers.py writes to)."""
    return Db.prepare(conn, schema)


@pytest.fixture
def daemons(tmp_path: Path, test_db_dsn: str, schema: str) -> Iterator[Daemons]:
    """Starts real daemons on the test's schema; whatever is left is killed at the end
    and every daemon's log printed (pytest shows it when the test failed)."""
    started = Daemons(tmp_path, test_db_dsn, schema)
    try:
        yield started
    finally:
        started.stop_all()
