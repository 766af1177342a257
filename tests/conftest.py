"""Shared fixtures: one private PostgreSQL cluster per pytest session (per xdist worker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from pgworkerd.localpg import LocalPostgres

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
    from pgworkerd.migrate import migrate

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
