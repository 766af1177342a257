"""roles.sql for one test: rendered for the test's schema and role names (roles are per
cluster, schemas per test), applied, and its roles dropped afterwards (the `roles`
fixture: import it into a test module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgworkerd.devcluster.localpg import LocalPostgres

ROLES_SQL = Path(__file__).resolve().parents[2] / "deploy" / "roles.sql"


ROLE_KINDS = ("daemon", "enqueuer", "operator", "reader")


def render_roles_sql(schema: str) -> str:
    """roles.sql for this test's schema (the substitution its header gives for another
    schema) and role names (roles are per cluster, schemas per test)."""
    text = ROLES_SQL.read_text()
    for kind in ROLE_KINDS:
        text = text.replace(f"pgworkerd_{kind}", f"{schema}_{kind}")
    return text.replace("SCHEMA pgworkerd ", f"SCHEMA {schema} ").replace(
        "pgworkerd.", f"{schema}."
    )


def drop_roles(conn: psycopg.Connection, names: list[str]) -> None:
    idents = [sql.Identifier(n) for n in names]
    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(idents)))
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(idents)))


@pytest.fixture
def roles(
    pg: LocalPostgres, conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> Iterator[dict[str, str]]:
    """roles.sql rendered for this test's schema and role names; yields their DSNs."""
    names = [f"{schema}_{kind}" for kind in ROLE_KINDS]
    conn.execute(render_roles_sql(schema))
    # roles.sql sets no password: they log in with the cluster's (its passfile is in the DSN).
    for name in names:
        pg.grant_login(name)
    yield {
        name: pg.dsn("pgworkerd_test").replace("user=postgres", f"user={name}") for name in names
    }
    drop_roles(conn, names)
